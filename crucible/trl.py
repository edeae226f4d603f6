"""TRL (and any transformers `Trainer`) reporting to Crucible: `CrucibleCallback`.

    from crucible.trl import CrucibleCallback
    trainer = GRPOTrainer(model=..., reward_funcs=[...], args=GRPOConfig(...), train_dataset=...)
    CrucibleCallback(project="my-project").attach(trainer)
    trainer.train()

Each logged step's metrics become the run's metrics (GRPO's `reward`, `reward_std`, `rewards/<func>/mean`, `kl`,
`entropy`, `clip_ratio/*`, `completions/*` ...). With the trainer attached, the completions GRPO sampled since the
last log, with their prompts and each reward function's score, become trajectories (reward = GRPO's weighted sum,
terms = the functions' scores), which Crucible's detectors read and whose flags reach the review queue. Each
checkpoint TRL saves (`output_dir/checkpoint-<step>`, a model directory) becomes a Crucible checkpoint that evals
and gates load.

`report_to=["crucible"]` works too once this module is imported: transformers then builds the callback without
arguments, so it reads `CRUCIBLE_PROJECT` (and `CRUCIBLE_URL`, `CRUCIBLE_TOKEN`); call `crucible.trl.attach(trainer)`
to give it the trainer for completions. TRL's `_logs` (where GRPOTrainer keeps what it sampled) is private: read
with care, and completions are skipped, with a log line, if its shape changes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.integrations import integration_utils

from crucible.run import Run, init

log = logging.getLogger(__name__)


class CrucibleCallback(TrainerCallback):  # type: ignore[misc]  # transformers is untyped here
    """Reports a transformers/TRL training run to Crucible (see the module docstring)."""

    def __init__(
        self,
        run: Run | None = None,
        *,
        project: str | None = None,
        name: str = "",
        base_model: str = "",
        completions: bool = True,
        checkpoints: bool = True,
    ) -> None:
        self.run = run
        self.trainer: Any = None
        self._owns_run = run is None
        self._project = project or os.environ.get("CRUCIBLE_PROJECT", "trl")
        self._name, self._base_model = name, base_model
        self._completions, self._checkpoints = completions, checkpoints
        self._seen: set[str] = set()

    def attach(self, trainer: Any) -> CrucibleCallback:
        """Give the callback its trainer (for the sampled completions) and add it to the trainer if not there."""
        self.trainer = trainer
        if not any(c is self for c in trainer.callback_handler.callbacks):
            trainer.add_callback(self)
        return self

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.run is not None or not state.is_world_process_zero:
            return
        model = kwargs.get("model")
        base = self._base_model or str(getattr(getattr(model, "config", None), "_name_or_path", "") or "")
        config = {k: v for k, v in args.to_dict().items() if not k.endswith("token") and v is not None}
        trainer_name = type(self.trainer).__name__ if self.trainer is not None else "Trainer"
        self.run = init(
            self._project,
            self._name or str(getattr(args, "run_name", "") or ""),
            config={"trainer": trainer_name, **config},
            base_model=base if _looks_like_model(base) else "",
            tags=["trl"],
        )
        log.info("Crucible run %s: %s", self.run.id, self.run.url)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if self.run is None or not state.is_world_process_zero:
            return
        step = int(state.global_step)
        self.run.log(logs or {}, step=step)
        if self._completions and self.trainer is not None and not any(k.startswith("eval_") for k in logs or {}):
            self._log_completions(args, step)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self.run is None or not state.is_world_process_zero or not self._checkpoints:
            return
        folder = os.path.join(str(args.output_dir or "."), f"checkpoint-{state.global_step}")  # complete by now
        if os.path.isfile(os.path.join(folder, "config.json")):
            self.run.log_checkpoint(folder, int(state.global_step))
        else:  # a PEFT adapter: not a model directory evals can load alone
            log.warning("checkpoint %s has no config.json (a PEFT adapter?): not sent to Crucible", folder)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        if self.run is not None and self._owns_run and state.is_world_process_zero:
            self.run.finish()

    def _log_completions(self, args: TrainingArguments, step: int) -> None:
        logs = getattr(self.trainer, "_logs", None)
        try:
            prompts, completions = list(logs["prompt"]), list(logs["completion"])  # type: ignore[index]
            by_function = {name: list(values) for name, values in logs["rewards"].items()}  # type: ignore[index]
        except (KeyError, TypeError, AttributeError):
            log.info("this trainer keeps no GRPO-style completion log (_logs): only metrics are sent")
            return
        weights = list(getattr(args, "reward_weights", None) or [1.0] * len(by_function))
        tokenizer = getattr(self.trainer, "processing_class", None)
        trajectories = []
        for index, (prompt, completion) in enumerate(zip(prompts, completions, strict=False)):
            key = hashlib.sha256(json.dumps([prompt, completion], default=str).encode()).hexdigest()
            if key in self._seen:  # the same generation batch is kept across steps (steps_per_generation > 1)
                continue
            self._seen.add(key)
            terms = {
                name: float(v[index]) for name, v in by_function.items() if index < len(v) and v[index] == v[index]
            }
            reward = (
                sum(w * terms[n] for w, n in zip(weights, by_function, strict=False) if n in terms) if terms else None
            )
            trajectories.append(
                {
                    "id": f"trl-{step}-{key[:12]}",
                    "task_id": _task_id(prompt),
                    "turns": [*_turns(prompt, "user"), *_turns(completion, "assistant")],
                    "reward": reward,
                    "terms": terms,
                    "completion_tokens": _token_count(tokenizer, completion),
                }
            )
        if trajectories:
            self.run.log_trajectories(trajectories, step=step)  # type: ignore[union-attr]


def attach(trainer: Any) -> CrucibleCallback:
    """The trainer's CrucibleCallback (the one `report_to=["crucible"]` made, or a new one), given the trainer."""
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, CrucibleCallback):
            return callback.attach(trainer)
    return CrucibleCallback().attach(trainer)


def _turns(value: Any, role: str) -> list[dict[str, Any]]:
    """A prompt or completion (text, or chat messages) as stored turns."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, list):
        return [
            {"role": str(m.get("role", role)), "content": _text(m.get("content"))} for m in value if isinstance(m, dict)
        ]
    return [{"role": role, "content": _text(value)}]


def _text(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, default=str)


def _task_id(prompt: Any) -> str:
    return "prompt-" + hashlib.sha256(json.dumps(prompt, default=str, sort_keys=True).encode()).hexdigest()[:12]


def _token_count(tokenizer: Any, completion: Any) -> int:
    text = (
        completion if isinstance(completion, str) else " ".join(t["content"] for t in _turns(completion, "assistant"))
    )
    try:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"]) if tokenizer is not None else 0
    except (TypeError, KeyError, ValueError):
        return 0


def _looks_like_model(name: str) -> bool:
    return bool(name) and (name.startswith("/") or name.count("/") == 1)


# `report_to=["crucible"]`: transformers looks names up in this table when a Trainer is built.
integration_utils.INTEGRATION_TO_CALLBACK.setdefault("crucible", CrucibleCallback)
