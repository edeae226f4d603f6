"""The SFT warm-up job (`python -m workers.jobs.sft`): rejection sampling, then supervised fine-tuning.

Context-1 warmed its policy up on trajectories of the same agent loop run by a larger model, filtered by recall
(docs/methods.md section 3, "SFT warm-up"). This job does the same with any model Crucible can run:
1. generate `rollouts_per_task` episodes per task with the `teacher` model in the run's environment;
2. keep those `workers.search.rejection` selects, counting every drop by reason (the run page shows the counts);
3. fine-tune the `base_model` on the kept episodes: cross-entropy on the tokens the teacher sampled (tool results
   and prompts are context, not targets), packed like the RL learner's micro-batches;
4. save the fine-tuned model (a transformers directory) to object storage, and the kept trajectories beside it.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

from workers.envs.registry import configure_storage, get_environment
from workers.jobs.common import load_spec, reporter_for
from workers.jobs.preflight import preflight_models
from workers.models.registry import resolve_base_model
from workers.reporting import configure_logging
from workers.rl.checkpoints import checkpoint_policy_state
from workers.rl.sft import RECORDS, fine_tune, generate, record_samples, shown_names
from workers.rl.steps import trajectory_summary
from workers.search.metrics import mean_metrics
from workers.search.rejection import select_trajectories
from workers.specs import SFTSpec
from workers.storage import read_bytes, write_bytes

log = logging.getLogger("crucible.sft")


def _upload_dir(local: Path, uri: str, storage_options: dict[str, Any]) -> None:
    for path in sorted(local.rglob("*")):
        if path.is_file():
            write_bytes(f"{uri.rstrip('/')}/{path.relative_to(local).as_posix()}", path.read_bytes(), storage_options)


def run(spec: SFTSpec) -> dict[str, Any]:
    # One function on purpose: a job's wiring, read top to bottom (read, tokenize, epochs, checkpoint, report).
    import torch
    from transformers import AutoModelForCausalLM

    config, opts = spec.config, spec.storage_options
    configure_storage(opts)
    torch.manual_seed(config.seed)
    with reporter_for(spec) as reporter:
        preflight_models(spec, reporter)  # the models it names are here, or the run fails now
        env_cls = get_environment(config.environment)
        rows = [json.loads(line) for line in read_bytes(spec.input_uri, opts).split(b"\n") if line.strip()]
        if spec.exclude_task_ids:  # before max_tasks: an excluded task never takes an allowed one's place
            excluded = set(spec.exclude_task_ids)
            kept_rows = [row for row in rows if str(row.get("id")) not in excluded]
            reporter.log(f"{len(rows) - len(kept_rows)} excluded task(s) left out of the warm-up")
            rows = kept_rows
        rows = rows[: config.max_tasks]
        started = time.perf_counter()
        if config.teacher_model == RECORDS:
            # RFT: the rows are trajectories already filtered by reward and deduplicated by task at export.
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(resolve_base_model(config.base_model)), local_files_only=True)
            samples = record_samples(rows, tokenizer)
            reporter.log(f"{len(samples)} stored trajectories (of {len(rows)} records) as SFT examples")
            kept_indices = list(range(len(samples)))
            report: dict[str, Any] = {"source": "records", "generated": len(rows), "kept": len(samples)}
            generation_seconds = time.perf_counter() - started
        else:
            for index, row in enumerate(rows, start=1):
                env_cls.validate_task_row(row, index=index)
            reporter.log(f"{len(rows)} tasks x {config.rollouts_per_task} rollouts with {config.teacher_model}")
            samples = generate(config, rows, spec.reward, lambda done: reporter.progress(done, 2 * len(rows)))
            generation_seconds = time.perf_counter() - started
            records = [s.trajectory for s in samples]
            own_rule = env_cls.select_for_sft(records)
            if own_rule is not None:  # the environment's own rule (coding: solved episodes)
                kept_indices, report = own_rule
            else:
                selected = select_trajectories(records, config.filter)
                kept_indices, report = selected.kept, selected.report(len(records))
        teacher_metrics = mean_metrics(s.episode_metrics for s in samples)
        report["teacher_metrics"] = teacher_metrics
        reporter.summary({"sft_filter": report})
        reporter.log(f"generated {len(samples)} trajectories in {generation_seconds:.0f}s; kept {len(kept_indices)}")
        for sample in samples:
            reporter.trajectory(**trajectory_summary(sample, 0))
        kept = [samples[i] for i in kept_indices]
        write_bytes(
            f"{spec.output_prefix}/sft/kept.jsonl",
            "".join(json.dumps(s.trajectory) + "\n" for s in kept).encode(),
            opts,
        )
        if not kept:
            reporter.log("no trajectory passed the filter: nothing to fine-tune on (see the filter counts)")
            summary = {"sft_filter": report, "fine_tuned": False}
            reporter.summary(summary)
            return summary

        # Phase 2: fine-tuning (the second half).
        model: Any = AutoModelForCausalLM.from_pretrained(
            str(resolve_base_model(config.base_model)), dtype=torch.float32, local_files_only=True
        )
        if config.checkpoint_uri:
            state, version = checkpoint_policy_state(config.base_model, config.checkpoint_uri, opts, config.threads)
            missing, unexpected = model.load_state_dict(state, strict=False)
            if unexpected:
                raise ValueError(f"{config.checkpoint_uri} holds weights {shown_names(unexpected)} not in the model")
            reporter.log(f"starting from {config.checkpoint_uri} (policy version {version})")

        def progress(done: int, total: int) -> None:
            reporter.progress(len(rows) + round(len(rows) * done / max(total, 1)), 2 * len(rows))

        losses = fine_tune(model, kept, config, progress)
        for epoch, loss in enumerate(losses, start=1):
            reporter.metric(epoch, {"sft_loss": loss, "sft_examples": float(len(kept))})
        uri = f"{spec.output_prefix}/sft/model"
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(
                str(resolve_base_model(config.base_model)), local_files_only=True
            ).save_pretrained(tmp)
            _upload_dir(Path(tmp), uri, opts)
        reporter.checkpoint(config.epochs, uri, {"sft_loss": losses[-1]})
        reporter.progress(2 * len(rows), 2 * len(rows))
        summary = {"sft_filter": report, "fine_tuned": True, "model_uri": uri, "sft_loss": losses}
        reporter.summary(summary)
        return summary


def main() -> None:
    configure_logging()
    run(load_spec(SFTSpec))


if __name__ == "__main__":
    main()
