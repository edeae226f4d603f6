"""One GRPO step on SmolLM2-135M on the CPU: Crucible's rollout worker + learner beside TRL's GRPOTrainer.

    .venv/bin/python bench/trainer_vs_trl.py [--quick] [--gradient-checkpointing | --no-gradient-checkpointing]

Both trainers run in the same invocation, one after the other, each in its own subprocess (so neither sees the
other's memory, monkeypatches or warm caches), on the same model directory (the float32 safetensors copy of
SmolLM2-135M-Instruct from `workers.models.registry`), the same prompts (`arithmetic_tasks`, chat-templated the
same way), the same group size, completion cap, loss (GRPO, beta 0, eps 0.2, group-std advantages), learning rate
(1e-6, constant), AdamW, grad clip 1.0, float32, torch's default thread count and the same gradient-checkpointing
setting. Nothing here asserts on time: the machine is shared, so the load average is printed beside the figures.

What is timed (wall clock, time.perf_counter):
  step        ours: RolloutWorker.rollout + Learner.train_step. TRL: its callback's on_step_begin -> on_step_end,
              i.e. Trainer.training_step (which generates) + grad clip + optimizer step (trainer.train() set-up
              and teardown are outside).
  generation  ours: RolloutWorker.rollout (chat template, sampling with per-token logprobs, env, reward).
              TRL: GRPOTrainer._generate_and_score_completions (tokenise, model.generate, reward, advantages,
              padding; with steps_per_generation = 1 it computes no old log-probs).
  training    step - generation: the loss forward (log-probs), backward, clip, AdamW step.
  forward / backward / optimizer inside training: our `completion_logprobs` calls / TRL's
              `_get_per_token_logps_and_entropies` calls; every `Tensor.backward` call; `optimizer.step` (+ clip).
tokens/s = tokens in the step's batch / step seconds, tokens = sum over the B samples of (prompt + completion
tokens), unpadded: the same quantity as TRL's `num_tokens` metric, counted the same way on both sides.

FLOP models for the training phase (fp32 matmul peak measured in the same run with torch.mm, 2048^3):
  nominal  6 * trainable params * batch tokens (the usual 6NT; tied embedding counted once).
  useful   6 * (decoder params * batch tokens + LM-head params * completion tokens) + causal attention per
           sequence (12 * layers * hidden * sum L_i^2 / 2): only the work a trainer has to do. Our learner does
           exactly this much (plus a forward recompute with gradient checkpointing); TRL also runs the LM head
           over prompt and padding positions and the decoder over padding.

Also: bytes and seconds of a weight sync after the optimizer step, delta (XOR + zstd against the version the
rollout workers hold) versus full, encode and decode, and loading the result into the rollout backend.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._noise import add_load_guard, load_guard  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "trainer_latest.txt"

FULL = {"prompts": 8, "group": 4, "new_tokens": 128}
QUICK = {"prompts": 2, "group": 2, "new_tokens": 16}
REWARD_SPEC = {"terms": [{"type": "normalized_match"}]}
ENV_PARAMS = {"answer_format": "last_number"}


# --- shared helpers ----------------------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # ru_maxrss is in KiB on Linux


class Timer:
    """Accumulates wall seconds and call counts of wrapped calls."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started
                self.calls += 1

        return timed


@contextmanager
def timed_backward(timer: Timer) -> Iterator[None]:
    """Time every Tensor.backward call (both trainers call loss.backward())."""
    import torch

    original = torch.Tensor.backward
    torch.Tensor.backward = timer.wrap(original)  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.backward = original  # type: ignore[method-assign]


def model_shape(path: Path) -> dict[str, int]:
    config = json.loads((path / "config.json").read_text())
    hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
    vocab, inter = int(config["vocab_size"]), int(config["intermediate_size"])
    heads, kv = (
        int(config["num_attention_heads"]),
        int(config.get("num_key_value_heads", config["num_attention_heads"])),
    )
    head_dim = hidden // heads
    per_layer = hidden * hidden * 2 + hidden * kv * head_dim * 2 + 3 * hidden * inter + 2 * hidden
    decoder = layers * per_layer + hidden  # + final norm
    head = vocab * hidden
    return {"hidden": hidden, "layers": layers, "vocab": vocab, "decoder_params": decoder, "head_params": head}


def flops(
    shape: dict[str, int], trainable: int, prompt_lens: list[int], completion_lens: list[int]
) -> dict[str, float]:
    tokens = sum(prompt_lens) + sum(completion_lens)
    completion = sum(completion_lens)
    seq_sq = sum((p + c) ** 2 for p, c in zip(prompt_lens, completion_lens, strict=True))
    attention_fwd = 2 * 2 * shape["layers"] * shape["hidden"] * seq_sq / 2  # QK^T and AV, causal half
    useful = 6 * (shape["decoder_params"] * tokens + shape["head_params"] * completion) + 3 * attention_fwd
    return {"nominal": 6.0 * trainable * tokens, "useful": float(useful)}


# --- matmul peak ---------------------------------------------------------------------------------------------------


def matmul_gflops(m: int, k: int, n: int, min_seconds: float = 1.5) -> float:
    import torch

    a, b = torch.randn(m, k), torch.randn(k, n)
    for _ in range(2):
        torch.mm(a, b)
    reps, started = 0, time.perf_counter()
    while True:
        torch.mm(a, b)
        reps += 1
        elapsed = time.perf_counter() - started
        if elapsed >= min_seconds and reps >= 3:
            break
    return 2.0 * m * k * n * reps / elapsed / 1e9


def measure_peak(quick: bool) -> dict[str, Any]:
    import torch

    secs = 0.5 if quick else 1.5
    out: dict[str, Any] = {"threads": torch.get_num_threads(), "loadavg": loadavg()}
    out["mm2048"] = matmul_gflops(2048, 2048, 2048, secs)
    # The shapes SmolLM2's training matmuls actually have (1,024 tokens x hidden 576 / MLP 1,536 / vocab 49,152).
    out["shapes"] = {
        "1024x576 @ 576x1536 (MLP up)": matmul_gflops(1024, 576, 1536, secs / 2),
        "1024x1536 @ 1536x576 (MLP down)": matmul_gflops(1024, 1536, 576, secs / 2),
        "1024x576 @ 576x576 (attn proj)": matmul_gflops(1024, 576, 576, secs / 2),
        "1024x576 @ 576x49152 (LM head)": matmul_gflops(1024, 576, 49152, secs / 2),
    }
    return out


# --- our side ------------------------------------------------------------------------------------------------------


def run_ours(args: argparse.Namespace, size: dict[str, int]) -> dict[str, Any]:
    import torch

    from workers.envs.registry import arithmetic_tasks
    from workers.models import SMOLLM2, make_backend, resolve_base_model
    from workers.rl import distributed as distributed_module
    from workers.rl import learner as learner_module
    from workers.rl.config import TrainConfig
    from workers.rl.learner import Learner
    from workers.rl.rollout import RolloutWorker
    from workers.rl.weightsync import WeightSyncReceiver, WeightSyncSender

    path = resolve_base_model(SMOLLM2)
    torch.manual_seed(0)
    backend = make_backend("transformers", path)
    worker = RolloutWorker(
        backend,
        environment="exact_answer",
        env_params=ENV_PARAMS,
        reward=REWARD_SPEC,
        temperature=1.0,
        max_new_tokens=size["new_tokens"],
    )
    config = TrainConfig(
        base_model=str(path),
        algorithm="grpo",
        loss={"kl_coef": 0.0},
        prompts_per_step=size["prompts"],
        group_size=size["group"],
        sampling={"max_new_tokens": size["new_tokens"]},
        max_tokens_per_pack=args.max_tokens_per_pack,
        gradient_checkpointing=args.gradient_checkpointing,
        drop_equal_groups=args.drop_equal_groups,
        learning_rate=1e-6,
    )
    learner = Learner(path, config)
    rows = arithmetic_tasks(size["prompts"])

    # The rollout workers' starting weights: a full sync of version 0 (the base every later delta builds on).
    initial_blob, initial_sync = learner.weight_update()
    assert initial_blob is not None
    receiver = WeightSyncReceiver()
    receiver.receive(initial_blob)

    dumped: list[dict[str, Any]] = []
    for step in range(args.warmup_steps + 1):
        timed = step == args.warmup_steps
        if step > 0:  # a real loop: the rollout backend gets the last step's weights (a delta) before generating
            blob, _ = learner.weight_update()
            assert blob is not None
            backend.load_state_dict(receiver.receive(blob), version=learner.version)  # type: ignore[attr-defined]
        forward, backward, optim, clip = Timer(), Timer(), Timer(), Timer()
        # The learner calls completion_logprobs itself (old log-probs) and through its rank wrapper
        # (workers.rl.distributed, the loss forward): both are timed.
        original_logprobs = learner_module.completion_logprobs
        original_step = learner.optimizer.step
        original_clip = torch.nn.utils.clip_grad_norm_
        learner_module.completion_logprobs = forward.wrap(original_logprobs)  # type: ignore[attr-defined]
        distributed_module.completion_logprobs = learner_module.completion_logprobs  # type: ignore[attr-defined]
        learner.optimizer.step = optim.wrap(original_step)  # type: ignore[method-assign]
        torch.nn.utils.clip_grad_norm_ = clip.wrap(original_clip)

        shapes: list[tuple[int, ...]] = []

        def record(module: Any, a: Any, kw: dict[str, Any], shapes: list[tuple[int, ...]] = shapes) -> None:
            if torch.is_grad_enabled():
                shapes.append(tuple((kw.get("input_ids") if kw.get("input_ids") is not None else a[0]).shape))

        hook = learner.model.get_decoder().register_forward_pre_hook(record, with_kwargs=True)
        label = "timed step" if timed else f"warm-up step {step + 1}"
        load_before = loadavg()
        log(f"ours: {label}: rollout")
        cpu0, t0 = cpu_seconds(), time.perf_counter()
        result = worker.rollout(rows, group_size=size["group"], seed=step)
        t1, cpu1 = time.perf_counter(), cpu_seconds()
        log(f"ours: {label}: rollout {t1 - t0:.1f}s, {result.sampled_tokens} sampled tokens; training")
        profiler = None
        if args.profile and timed:
            from torch.profiler import ProfilerActivity, profile

            profiler = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
            profiler.__enter__()
        with timed_backward(backward):
            metrics = learner.train_step(result.samples)
        if profiler is not None:
            profiler.__exit__(None, None, None)
        t2, cpu2 = time.perf_counter(), cpu_seconds()
        hook.remove()
        learner_module.completion_logprobs = original_logprobs  # type: ignore[attr-defined]
        distributed_module.completion_logprobs = original_logprobs  # type: ignore[attr-defined]
        learner.optimizer.step = original_step  # type: ignore[method-assign]
        torch.nn.utils.clip_grad_norm_ = original_clip
        log(f"ours: {label}: train {t2 - t1:.1f}s")
        dumped += [
            {
                "prompt": r["prompt"],
                "prompt_ids": s.token_ids[: s.completion_start],
                "completion_ids": s.token_ids[s.completion_start :],
                "logprobs": s.old_logprobs,
            }
            for s in result.samples
            for r in rows
            if str(r["id"]) == s.task_id
        ]

    samples = result.samples
    if args.dump_samples:
        Path(args.dump_samples).write_text(json.dumps(dumped))
    prompt_lens = [s.completion_start for s in samples]
    completion_lens = [s.sampled_tokens for s in samples]
    trained_count = int(metrics["trained_samples"])

    # Weight sync after the timed optimizer step: delta against the version the workers hold vs full.
    state = learner.policy_state()
    blob_delta, delta_stats = learner.weight_update()
    assert blob_delta is not None
    started = time.perf_counter()
    full_update = WeightSyncSender().push(state, version=learner.version, full=True)
    full_encode = time.perf_counter() - started
    started = time.perf_counter()
    rebuilt = receiver.receive(blob_delta)
    delta_decode = time.perf_counter() - started
    started = time.perf_counter()
    rebuilt_full = WeightSyncReceiver().receive(full_update.blob)
    full_decode = time.perf_counter() - started
    exact = all(torch.equal(rebuilt[k], state[k]) and torch.equal(rebuilt_full[k], state[k]) for k in state)
    started = time.perf_counter()
    backend.load_state_dict(rebuilt, version=learner.version)  # type: ignore[attr-defined]
    load_seconds = time.perf_counter() - started
    raw_bytes = sum(t.numel() * t.element_size() for t in state.values())

    trainable = sum(p.numel() for p in learner.params)
    shape = model_shape(Path(path))
    out: dict[str, Any] = {
        "side": "ours",
        "model_path": str(path),
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "step_seconds": t2 - t0,
        "generation_seconds": t1 - t0,
        "generation_seconds_reported": result.generation_seconds,
        "training_seconds": t2 - t1,
        "train_seconds_reported": metrics["train_seconds"],
        "generation_cpu_seconds": cpu1 - cpu0,
        "training_cpu_seconds": cpu2 - cpu1,
        "forward_seconds": forward.seconds,
        "forward_calls": forward.calls,
        "backward_seconds": backward.seconds,
        "backward_calls": backward.calls,
        "optimizer_seconds": optim.seconds + clip.seconds,
        "samples": len(samples),
        "trained_samples": trained_count,
        "prompt_lens": prompt_lens,
        "completion_lens": completion_lens,
        "decode_steps": max(completion_lens) if completion_lens else 0,
        "finish_reasons": {r: sum(1 for s in samples if s.finish_reason == r) for r in ("stop", "length")},
        "reward_mean": metrics["reward_mean"],
        "ratio_mean": metrics["ratio_mean"],
        "ratio_max": metrics["ratio_max"],
        "loss": metrics["loss"],
        "grad_norm": metrics["grad_norm"],
        "trainable_params": trainable,
        "shape": shape,
        "flops": flops(shape, trainable, prompt_lens, completion_lens),
        "forward_shapes": shapes,
        "forward_padding": 1.0 - sum(prompt_lens + completion_lens) / max(sum(a * b for a, b in shapes), 1),
        "head_positions": sum(completion_lens),
        "config": {
            "max_tokens_per_pack": config.max_tokens_per_pack,
            "gradient_checkpointing": config.gradient_checkpointing,
            "drop_equal_groups": config.drop_equal_groups,
            "attn": learner.model.config._attn_implementation,
        },
        "sync": {
            "raw_bytes": raw_bytes,
            "tensors": len(state),
            "initial_full_bytes": initial_sync.get("sync_bytes"),
            "delta_bytes": delta_stats["sync_bytes"],
            "delta_encode_seconds": delta_stats["sync_seconds"],
            "delta_decode_seconds": delta_decode,
            "full_bytes": len(full_update.blob),
            "full_encode_seconds": full_encode,
            "full_decode_seconds": full_decode,
            "load_state_dict_seconds": load_seconds,
            "bit_exact": exact,
        },
        "peak_rss_gb": peak_rss_gb(),
    }
    if profiler is not None:
        out["profile"] = profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
        out["profile_shapes"] = profiler.key_averages(group_by_input_shape=True).table(
            sort_by="self_cpu_time_total", row_limit=25
        )
    return out


# --- TRL's side ----------------------------------------------------------------------------------------------------


def run_trl(args: argparse.Namespace, size: dict[str, int]) -> dict[str, Any]:
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ[key] = "1"
    os.environ.setdefault("WANDB_MODE", "disabled")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from workers.envs.answers import canonical_number, extract_answer
    from workers.envs.registry import arithmetic_tasks
    from workers.models import SMOLLM2, resolve_base_model
    from workers.rewards.terms import normalized_match

    path = resolve_base_model(SMOLLM2)
    rows = arithmetic_tasks(size["prompts"])
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in rows]
    )

    def reward_normalized_match(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        # Same reward as ours: exact_answer env with answer_format="last_number", normalized_match term.
        out = []
        for completion, gold in zip(completions, answer, strict=True):
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            found = extract_answer(text, "last_number")
            out.append(normalized_match(found, [canonical_number(gold) or gold]))
        return out

    rollout_func = None
    if args.replay:
        # Train TRL on exactly our sampled sequences: a rollout_func hands TRL our prompt/completion ids (its
        # "generation" is then a lookup), so both training phases see the same tokens.
        queues: dict[str, list[dict[str, Any]]] = {}
        for item in json.loads(Path(args.replay).read_text()):
            queues.setdefault(item["prompt"], []).append(item)

        def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
            picked = [queues[p[-1]["content"]].pop(0) for p in prompts]
            return {key: [item[key] for item in picked] for key in ("prompt_ids", "completion_ids", "logprobs")}

        os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    batch = size["prompts"] * size["group"]
    workdir = tempfile.mkdtemp(prefix="trl-bench-")
    grpo_args = GRPOConfig(
        output_dir=workdir,
        report_to="none",
        max_steps=1 + args.warmup_steps,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        num_generations=size["group"],
        max_completion_length=size["new_tokens"],
        temperature=1.0,
        top_p=1.0,
        beta=0.0,
        loss_type="grpo",
        scale_rewards="group",
        epsilon=0.2,
        learning_rate=1e-6,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch",
        bf16=False,
        fp16=False,
        gradient_checkpointing=args.gradient_checkpointing,
        use_vllm=False,
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        log_completions=False,
        dataloader_num_workers=0,
        seed=0,
    )

    generation, gen_inner, forward, backward = Timer(), Timer(), Timer(), Timer()
    captured: dict[str, Any] = {"forward_shapes": [], "forward_real_tokens": 0, "forward_positions": 0}

    class Timed(GRPOTrainer):  # type: ignore[misc]
        def _generate_and_score_completions(self, inputs: Any) -> Any:
            return generation.wrap(super()._generate_and_score_completions)(inputs)

        def training_step(self, *a: Any, **k: Any) -> Any:
            out = super().training_step(*a, **k)
            marks["training_step_end"] = time.perf_counter()
            return out

        def _generate(self, prompts: list[Any]) -> Any:
            out = gen_inner.wrap(super()._generate)(prompts)
            captured["prompt_lens"] = [len(p) for p in out[0]]
            captured["completion_lens"] = [len(c) for c in out[1]]
            return out

        def _get_per_token_logps_and_entropies(
            self, model: Any, input_ids: Any, attention_mask: Any, *a: Any, **k: Any
        ) -> Any:
            if torch.is_grad_enabled():
                captured["forward_shapes"].append(tuple(input_ids.shape))
                captured["forward_real_tokens"] += int(attention_mask.sum())
                captured["forward_positions"] += int(input_ids.numel())
            return forward.wrap(super()._get_per_token_logps_and_entropies)(model, input_ids, attention_mask, *a, **k)

    marks: dict[str, float] = {}

    class StepClock(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            # Every step overwrites the figures: the last (timed) step's remain.
            for timer in (generation, gen_inner, forward, backward):
                timer.seconds, timer.calls = 0.0, 0
            captured.update(forward_shapes=[], forward_real_tokens=0, forward_positions=0)
            log(f"trl: step {state.global_step + 1} of {args.max_steps}")
            marks["begin"], marks["cpu_begin"] = time.perf_counter(), cpu_seconds()
            marks["load_before"] = loadavg()  # type: ignore[assignment]

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            marks["pre_optimizer"] = time.perf_counter()

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            marks["optimizer"] = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            marks["end"], marks["cpu_end"] = time.perf_counter(), cpu_seconds()

    trainer = Timed(
        model=model,
        reward_funcs=reward_normalized_match,
        args=grpo_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StepClock()],
        rollout_func=rollout_func,
    )
    log(f"trl: train ({args.warmup_steps} warm-up + 1 timed step){' on our samples' if args.replay else ''}")
    gen_cpu: dict[str, float] = {}
    original_gen = Timed._generate_and_score_completions

    def gen_with_cpu(self: Any, inputs: Any) -> Any:
        gen_cpu["start"] = cpu_seconds()
        out = original_gen(self, inputs)
        gen_cpu["end"] = cpu_seconds()
        return out

    Timed._generate_and_score_completions = gen_with_cpu  # type: ignore[method-assign]
    with timed_backward(backward):
        train_out = trainer.train()
    step = marks["end"] - marks["begin"]
    log(f"trl: step {step:.1f}s (generation {generation.seconds:.1f}s)")
    history = [h for h in trainer.state.log_history if "loss" in h or "reward" in h]
    logged = history[-1] if history else {}
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    shape = model_shape(Path(path))
    prompt_lens, completion_lens = captured["prompt_lens"], captured["completion_lens"]
    positions = captured["forward_positions"]
    return {
        "side": "trl-replay" if args.replay else "trl",
        "model_path": str(path),
        "loadavg_before": marks["load_before"],
        "loadavg_after": loadavg(),
        "step_seconds": step,
        "generation_seconds": generation.seconds,
        "model_generate_seconds": gen_inner.seconds,
        "training_seconds": step - generation.seconds,
        "generation_cpu_seconds": gen_cpu["end"] - gen_cpu["start"],
        "training_cpu_seconds": (marks["cpu_end"] - marks["cpu_begin"]) - (gen_cpu["end"] - gen_cpu["start"]),
        "forward_seconds": forward.seconds,
        "forward_calls": forward.calls,
        "backward_seconds": backward.seconds,
        "backward_calls": backward.calls,
        "optimizer_seconds": marks["end"] - marks["training_step_end"],
        "samples": len(completion_lens),
        "trained_samples": len(completion_lens),
        "prompt_lens": prompt_lens,
        "completion_lens": completion_lens,
        "decode_steps": max(completion_lens) if completion_lens else 0,
        "finish_reasons": {
            "length": sum(1 for c in completion_lens if c >= size["new_tokens"]),
            "stop": sum(1 for c in completion_lens if c < size["new_tokens"]),
        },
        "reward_mean": logged.get("reward", float("nan")),
        "loss": logged.get("loss", float("nan")),
        "grad_norm": logged.get("grad_norm", float("nan")),
        "trainable_params": trainable,
        "shape": shape,
        "flops": flops(shape, trainable, prompt_lens, completion_lens),
        "forward_shapes": captured["forward_shapes"],
        "forward_padding": 1.0 - captured["forward_real_tokens"] / positions if positions else 0.0,
        "head_positions": sum(s[0] * (s[1] - 1) for s in captured["forward_shapes"]),
        "config": {
            "gradient_checkpointing": grpo_args.gradient_checkpointing,
            "optim": str(grpo_args.optim),
            "attn": model.config._attn_implementation,
            "train_runtime": train_out.metrics.get("train_runtime"),
        },
        "logged": {k: v for k, v in logged.items() if isinstance(v, int | float)},
        "peak_rss_gb": peak_rss_gb(),
    }


# --- the driver ----------------------------------------------------------------------------------------------------


def wait_for_quiet(max_load: float | None, timeout: float = 900.0) -> None:
    """Wait (at most `timeout` s) until the 1-minute load average per core is at most `max_load`: the machine is
    shared."""
    if max_load is None:
        return
    started = time.perf_counter()
    cores = os.cpu_count() or 1
    while os.getloadavg()[0] / cores > max_load and time.perf_counter() - started < timeout:
        log(f"load {loadavg()} on {cores} cores above {max_load} per core: waiting")
        time.sleep(15)


def run_side(side: str, args: argparse.Namespace, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    wait_for_quiet(args.wait_load)
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        target = handle.name
    cmd = [sys.executable, str(Path(__file__).resolve()), "--side", side, "--json-out", target]
    if args.quick:
        cmd.append("--quick")
    cmd.append("--gradient-checkpointing" if args.gradient_checkpointing else "--no-gradient-checkpointing")
    cmd += ["--max-tokens-per-pack", str(args.max_tokens_per_pack), "--warmup-steps", str(args.warmup_steps)]
    if args.drop_equal_groups:
        cmd.append("--drop-equal-groups")
    if args.profile and side == "ours":
        cmd.append("--profile")
    cmd += list(extra)
    started = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=sys.stderr)  # TRL prints its logs to stdout
    data: dict[str, Any] = json.loads(Path(target).read_text())
    os.unlink(target)
    data["process_seconds"] = time.perf_counter() - started
    return data


def fmt_s(x: float) -> str:
    return f"{x:.2f}"


def report(
    args: argparse.Namespace,
    size: dict[str, int],
    peak: dict[str, Any],
    peak_end: dict[str, Any],
    ours: dict[str, Any],
    trl: dict[str, Any],
    started_load: list[float],
    replay: dict[str, Any] | None = None,
) -> str:
    import torch
    import transformers
    import trl as trl_pkg

    lines: list[str] = []
    add = lines.append
    peak_gf = max(peak["mm2048"], peak_end["mm2048"])
    add(f"Trainer step: Crucible vs TRL {trl_pkg.__version__} GRPOTrainer  ({time.strftime('%Y-%m-%d %H:%M:%S')})")
    add(
        f"SmolLM2-135M-Instruct fp32, {size['prompts']} prompts x {size['group']} completions, max "
        f"{size['new_tokens']} new tokens, GRPO beta=0, 1 optimizer step; gradient checkpointing "
        f"{'on' if args.gradient_checkpointing else 'off'} (both); timed step after {args.warmup_steps} warm-up "
        f"step(s); torch {torch.__version__}, transformers "
        f"{transformers.__version__}, {peak['threads']} threads, {os.cpu_count()} CPUs, {platform.machine()}"
    )
    add(
        f"load average (1/5/15 min): start {started_load}, ours {ours['loadavg_before']} -> {ours['loadavg_after']},"
        f" TRL {trl['loadavg_before']} -> {trl['loadavg_after']}"
    )
    add("")
    header = ["", "ours", "TRL", "ours vs TRL"] + (["TRL on our samples", "ours vs that"] if replay else [])

    def tok(d: dict[str, Any]) -> int:
        return sum(d["prompt_lens"]) + sum(d["completion_lens"])

    def ctok(d: dict[str, Any]) -> int:
        return sum(d["completion_lens"])

    def ratio(a: float, b: float, suffix: str = "") -> str:
        return f"{a / b:.2f}x{suffix}" if b else "-"

    rows: list[list[str]] = []

    def row(
        name: str,
        value: Callable[[dict[str, Any]], str],
        compare: Callable[[dict[str, Any], dict[str, Any]], str] | None = None,
        replayed: bool = True,
    ) -> None:
        """`replayed=False`: a figure of the whole step or of generation, which the replay run does not have."""
        cells = [name, value(ours), value(trl), compare(ours, trl) if compare else ""]
        if replay:
            cells += [value(replay), compare(ours, replay) if compare else ""] if replayed else ["-", ""]
        rows.append(cells)

    def faster(key: str) -> Callable[[dict[str, Any], dict[str, Any]], str]:
        return lambda o, t: ratio(t[key], o[key], " faster")

    def per_s(num: Callable[[dict[str, Any]], float], key: str) -> Callable[[dict[str, Any]], float]:
        return lambda d: num(d) / d[key] if d[key] else 0.0

    def higher(f: Callable[[dict[str, Any]], float]) -> Callable[[dict[str, Any], dict[str, Any]], str]:
        return lambda o, t: ratio(f(o), f(t))

    row("step seconds", lambda d: fmt_s(d["step_seconds"]), faster("step_seconds"), replayed=False)
    row(
        "  generation s (+ reward)",
        lambda d: fmt_s(d["generation_seconds"]),
        faster("generation_seconds"),
        replayed=False,
    )
    row("  training s", lambda d: fmt_s(d["training_seconds"]), faster("training_seconds"))
    row("    forward (log-probs) s", lambda d: fmt_s(d["forward_seconds"]), faster("forward_seconds"))
    row("    backward s", lambda d: fmt_s(d["backward_seconds"]), faster("backward_seconds"))
    row("    clip + optimizer s", lambda d: fmt_s(d["optimizer_seconds"]))
    row(
        "  CPU cores busy, gen / train",
        lambda d: (
            f"{d['generation_cpu_seconds'] / max(d['generation_seconds'], 1e-9):.2f} / "
            f"{d['training_cpu_seconds'] / d['training_seconds']:.2f}"
        ),
        replayed=False,
    )
    row("batch tokens (prompt + completion)", lambda d: str(tok(d)))
    row("  completion tokens", lambda d: str(ctok(d)))
    row("  decode steps (longest completion)", lambda d: str(d["decode_steps"]), replayed=False)
    row(
        "  completions stopped / at the cap",
        lambda d: f"{d['finish_reasons']['stop']} / {d['finish_reasons']['length']}",
    )
    tps = per_s(tok, "step_seconds")
    row("tokens/s (batch tokens / step s)", lambda d: f"{tps(d):.1f}", higher(tps), replayed=False)
    gtps = per_s(ctok, "generation_seconds")
    row("  generation: completion tokens/s", lambda d: f"{gtps(d):.1f}", higher(gtps), replayed=False)
    ttps = per_s(tok, "training_seconds")
    row("  training: batch tokens/s", lambda d: f"{ttps(d):.1f}", higher(ttps))
    row("loss forward: padding share", lambda d: f"{d['forward_padding']:.1%}")
    row("loss forward: LM-head positions", lambda d: str(d["head_positions"]))
    for key, label in (("nominal", "6NT"), ("useful", "useful")):

        def gf(d: dict[str, Any], key: str = key) -> float:
            return d["flops"][key] / d["training_seconds"] / 1e9

        row(f"training GFLOP/s ({label})", lambda d, gf=gf: f"{gf(d):.1f} ({gf(d) / peak_gf:.0%})")
    row("reward mean", lambda d: f"{d['reward_mean']:.3f}")
    row("peak RSS GB (process)", lambda d: f"{d['peak_rss_gb']:.1f}")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    for r in [header] + rows:
        add("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    add("")
    add(
        f"headline: ours {tps(ours):.1f} tokens/s vs TRL {tps(trl):.1f} tokens/s = {tps(ours) / tps(trl):.2f}x "
        f"(target >= 1.5x); step time {trl['step_seconds'] / ours['step_seconds']:.2f}x shorter"
    )
    if replay:
        add(
            f"same tokens (TRL trained on our sampled completions): training phase "
            f"{replay['training_seconds'] / ours['training_seconds']:.2f}x faster"
        )
    add("")
    add(
        f"fp32 matmul peak (torch.mm 2048^3, {peak['threads']} threads): {peak['mm2048']:.1f} GFLOP/s at start, "
        f"{peak_end['mm2048']:.1f} at end; using the higher, {peak_gf:.1f}. At this model's shapes (best of both):"
    )
    for name in peak["shapes"]:
        value = max(peak["shapes"][name], peak_end["shapes"][name])
        add(f"  {name:36s} {value:7.1f} GFLOP/s ({value / peak_gf:.0%} of peak)")
    sh = ours["shape"]
    add(
        f"FLOP models: 6NT = 6 x {ours['trainable_params'] / 1e6:.1f}M trainable params x batch tokens; useful = "
        f"6 x ({sh['decoder_params'] / 1e6:.1f}M decoder params x batch tokens + {sh['head_params'] / 1e6:.1f}M "
        "LM-head params x completion tokens) + causal attention per sequence (no recompute, no padding)."
    )
    useful = ours["flops"]["useful"] / ours["training_seconds"] / 1e9 / peak_gf
    nominal = ours["flops"]["nominal"] / ours["training_seconds"] / 1e9 / peak_gf
    add(
        f"ours, training phase at {useful:.0%} of the matmul peak by useful FLOPs ({nominal:.0%} by 6NT); "
        "target >= 60%."
    )
    add("")
    sync = ours["sync"]
    delta_time = sync["delta_encode_seconds"] + sync["delta_decode_seconds"]
    full_time = sync["full_encode_seconds"] + sync["full_decode_seconds"]
    mb = 1024**2
    add(
        f"weight sync after one optimizer step ({sync['tensors']} tensors, {sync['raw_bytes'] / mb:.1f} MiB raw), "
        f"bit-exact after decode: {sync['bit_exact']}"
    )
    add(f"  {'':8s} {'bytes':>14s} {'MiB':>9s} {'encode s':>9s} {'decode s':>9s}")
    for kind in ("delta", "full"):
        add(
            f"  {kind:8s} {sync[kind + '_bytes']:14,.0f} {sync[kind + '_bytes'] / mb:9.2f} "
            f"{sync[kind + '_encode_seconds']:9.2f} {sync[kind + '_decode_seconds']:9.2f}"
        )
    add(
        f"  delta / full: {sync['delta_bytes'] / sync['full_bytes']:.1%} of the bytes, "
        f"{delta_time / full_time:.0%}"
        f" of the encode + decode time; loading the rebuilt weights into the rollout backend: "
        f"{sync['load_state_dict_seconds']:.2f} s"
    )
    add("")
    add("notes:")
    add(
        f"  ours: micro-batches of <= {ours['config']['max_tokens_per_pack']} tokens, decoder input shapes "
        f"{ours['forward_shapes']} (packed rows as long as the longest sequence), attn "
        f"{ours['config']['attn']}, drop_equal_groups={ours['config']['drop_equal_groups']}; importance ratio "
        f"mean {ours['ratio_mean']:.4f}, max {ours['ratio_max']:.4f} (sampler vs learner log-probs, same weights); "
        f"loss {ours['loss']:.4f}, grad norm {ours['grad_norm']:.3f}"
    )
    for d in [trl] + ([replay] if replay else []):
        add(
            f"  {d['side']}: loss forward shapes {d['forward_shapes']}, optim {d['config']['optim']}, attn "
            f"{d['config']['attn']}; logged loss {d['loss']:.3g}, grad norm {d['grad_norm']:.3f}; trainer.train() "
            f"wall {d['config']['train_runtime']:.1f} s (all steps + set-up)"
        )
    add(
        "  Each side samples its own completions (same prompts and seed, different samplers), so batch sizes in "
        "tokens differ; tokens/s normalises for that. 'TRL on our samples' replays our completions through TRL's "
        "rollout_func, so its training phase processes exactly our tokens (its generation column is a lookup)."
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 prompts x 2 completions x 16 tokens")
    parser.add_argument(
        "--gradient-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="both sides (default off: our TrainConfig default; TRL's own default is on)",
    )
    parser.add_argument("--max-tokens-per-pack", type=int, default=1024)
    parser.add_argument(
        "--drop-equal-groups",
        action="store_true",
        help="let our learner skip all-equal-reward groups (off: both train every sample)",
    )
    parser.add_argument("--profile", action="store_true", help="torch.profiler over our train_step")
    parser.add_argument(
        "--warmup-steps",
        type=int,
        default=1,
        help="untimed steps before the timed one (first-step costs: optimizer state, allocator)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run each side N times, alternating which goes first; the table shows the fastest",
    )
    parser.add_argument("--only", choices=["ours", "trl"], help="run one side only (prints its JSON)")
    parser.add_argument("--out", type=Path, help=f"where to save the report (default {RESULTS} for full runs)")
    parser.add_argument(
        "--no-replay",
        dest="replay_run",
        action="store_false",
        help="skip the extra TRL run that trains on our sampled completions",
    )
    parser.add_argument(
        "--wait-load",
        type=float,
        help="before each measurement, wait (up to 15 min) until the 1-minute load average per core is at most this "
        "(--max-load, from the shared load guard, refuses to start above its threshold instead)",
    )
    parser.add_argument("--render", help="print the report of a saved runs.json again (no benchmark)")
    parser.add_argument("--side", choices=["ours", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--json-out", help=argparse.SUPPRESS)
    parser.add_argument("--dump-samples", help=argparse.SUPPRESS)
    parser.add_argument("--replay", help=argparse.SUPPRESS)
    add_load_guard(parser)
    args = parser.parse_args()
    # a side runs as a subprocess of a run that was checked already; --render measures nothing
    if not (args.side or args.render):
        load_guard(args)
    size = QUICK if args.quick else FULL

    if args.render:
        saved = json.loads(Path(args.render).read_text())
        saved_runs = saved["runs"]
        best = {k: min(v, key=lambda d: d["step_seconds"]) if v else None for k, v in saved_runs.items()}
        print(
            report(
                argparse.Namespace(**saved["args"]),
                saved["size"],
                saved["peak"],
                saved["peak_end"],
                best["ours"],
                best["trl"],
                saved["started_load"],
                best["trl-replay"],
            )
        )
        return
    if args.side:
        data = run_ours(args, size) if args.side == "ours" else run_trl(args, size)
        Path(args.json_out).write_text(json.dumps(data, default=str))
        return

    started_load = loadavg()
    from workers.models import SMOLLM2, resolve_base_model

    log("resolving SmolLM2 (first time converts the GGUF, ~30 s)")
    resolve_base_model(SMOLLM2)
    if args.only:
        data = run_side(args.only, args)
        shapes = data.pop("profile_shapes", None)
        profile = data.pop("profile", None)
        print(json.dumps(data, default=str))
        if profile:
            print(profile)
            print(shapes)
        return
    log("fp32 matmul peak")
    wait_for_quiet(args.wait_load)
    peak = measure_peak(args.quick)
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "trl": [], "trl-replay": []}
    dump = Path(tempfile.mkdtemp(prefix="trainer-bench-")) / "samples.json"
    for index in range(args.repeat):
        order = ("ours", "trl") if index % 2 == 0 else ("trl", "ours")
        for side in order:
            extra = ("--dump-samples", str(dump)) if side == "ours" else ()
            runs[side].append(run_side(side, args, extra))
        if args.replay_run:
            runs["trl-replay"].append(run_side("trl", args, ("--replay", str(dump))))
    wait_for_quiet(args.wait_load)
    peak_end = measure_peak(args.quick)
    ours = min(runs["ours"], key=lambda d: d["step_seconds"])
    trl = min(runs["trl"], key=lambda d: d["step_seconds"])
    replay = min(runs["trl-replay"], key=lambda d: d["step_seconds"]) if runs["trl-replay"] else None
    raw = dump.parent / "runs.json"
    raw.write_text(
        json.dumps(
            {
                "args": vars(args),
                "size": size,
                "peak": peak,
                "peak_end": peak_end,
                "runs": runs,
                "started_load": started_load,
            },
            default=str,
        )
    )
    log(f"raw figures: {raw} (re-render with --render {raw})")
    text = report(args, size, peak, peak_end, ours, trl, started_load, replay)
    if args.repeat > 1:
        text += "\n\nall runs (the table shows each side's fastest step):\n" + "\n".join(
            f"  {side:4s} run {i + 1}: step {d['step_seconds']:.2f} s (generation {d['generation_seconds']:.2f}, "
            f"training {d['training_seconds']:.2f}), {sum(d['prompt_lens']) + sum(d['completion_lens'])} tokens, "
            f"load {d['loadavg_before']} -> {d['loadavg_after']}"
            for side in ("ours", "trl", "trl-replay")
            for i, d in enumerate(runs[side])
        )
    print(text)
    if ours.get("profile"):
        print("\nprofile of our train_step (torch.profiler, self CPU time):")
        print(ours["profile"])
        print(ours["profile_shapes"])
    out = args.out or (None if args.quick else RESULTS)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
        log(f"saved {out}")


if __name__ == "__main__":
    main()
