"""The example recipe on one GPU (issue 37, section 5): the first screen's example run (GRPO of SmolLM2-135M with LoRA
on sums and differences, `workers.rl.example_recipe`) with the engine and the learner in one process, for as many
steps as fit in --minutes, then its base and its last policy evaluated greedily on the example's 128 held-out tasks.

    .venv/bin/python bench/gpu_learning.py                      # CUDA: engine in bf16, learner under bf16 autocast
    .venv/bin/python bench/gpu_learning.py --device cpu --minutes 8   # the same on the CPU, for the side by side
    .venv/bin/python bench/gpu_learning.py --quick              # CPU, tiny model, 2 steps: checks the script runs

No Ray, no vLLM, no Django: the engine is the transformers backend (`workers.models.hf`), the learner, rollout
worker, weight sync and environment are the ones a run uses (`workers.rl`), so a GPU machine needs PyTorch,
transformers and the workers' pure-Python dependencies (pydantic, peft, numpy, scipy). Each device writes
bench/results/gpu_learning-<device>.json (the reward per step, tokens/s of generation, seconds of training per
step, the held-out verdict) and the run prints the other device's figures beside its own when they are there.
Per step, as a run does it: sample 8 prompts x 4 at temperature 1 on the engine, train one GRPO step on the
learner, send the LoRA-merged weights to the engine (the delta weight sync). Held-out: 128 tasks, paired per task,
McNemar's exact test and a paired bootstrap interval (`workers.evals.stats`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workers.evals.learned import eval_verdict, linear_trend  # noqa: E402
from workers.evals.paired import paired_bootstrap  # noqa: E402
from workers.evals.stats import mcnemar_exact  # noqa: E402
from workers.models import make_backend  # noqa: E402
from workers.models.registry import TINY_LLAMA, resolve_base_model  # noqa: E402
from workers.rl.config import TrainConfig  # noqa: E402
from workers.rl.example_recipe import EXAMPLE_CONFIG, example_split  # noqa: E402
from workers.rl.learner import Learner  # noqa: E402
from workers.rl.rollout import RolloutWorker  # noqa: E402
from workers.rl.steps import data_order  # noqa: E402
from workers.rl.weightsync import WeightSyncReceiver  # noqa: E402

REWARD = {"terms": [{"type": "normalized_match"}]}  # the example run's reward config ("exact-answer")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def evaluate(worker: RolloutWorker, rows: list[dict[str, Any]], label: str) -> list[float]:
    """One greedy answer per held-out task: 1 when it is right."""
    temperature, worker.temperature = worker.temperature, 0.0
    scores: list[float] = []
    started = time.perf_counter()
    for at in range(0, len(rows), 64):
        result = worker.rollout(rows[at : at + 64], group_size=1, seed=0, id_prefix=f"eval-{label}-")
        scores += [float(s.reward) for s in result.samples]
    worker.temperature = temperature
    log(
        f"{label}: {statistics.mean(scores):.3f} on {len(scores)} held-out tasks ({time.perf_counter() - started:.0f}s)"
    )
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--minutes", type=float, default=8.0, help="training time budget (steps stop after it)")
    parser.add_argument("--max-steps", type=int, default=400)
    parser.add_argument("--model", default=str(EXAMPLE_CONFIG["base_model"]), help="built-in name or model directory")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (CPU side)")
    parser.add_argument("--quick", action="store_true", help="CPU, tiny model, 2 steps, 8 held-out tasks")
    parser.add_argument("--out", default="", help="default: bench/results/gpu_learning-<device>.json")
    args = parser.parse_args()
    import torch

    if args.quick:
        args.device, args.model, args.max_steps = "cpu", TINY_LLAMA, 2
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("no CUDA device here: run with --device cpu for the CPU figures (or --quick to check the script)")
    torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    path = str(resolve_base_model(args.model))
    train, held_out = example_split()
    if args.quick:
        held_out = held_out[:8]
    recipe = {**EXAMPLE_CONFIG, "base_model": path, "steps": args.max_steps, "checkpoint_every": args.max_steps}
    config = TrainConfig(**recipe)
    backend = make_backend("transformers", path, device=args.device, dtype=torch.bfloat16 if cuda else torch.float32)
    worker = RolloutWorker(
        backend,
        environment=config.environment,
        env_params=config.env_params,
        reward=REWARD,
        temperature=config.sampling.temperature,
        max_new_tokens=config.sampling.max_new_tokens,
    )
    learner = Learner(path, config, device=args.device, threads=args.threads)
    receiver = WeightSyncReceiver()
    blob, _ = learner.weight_update()
    receiver.receive(blob)
    name = torch.cuda.get_device_name() if cuda else f"cpu ({args.threads} threads)"
    log(f"{name}: {Path(path).name}, {len(train)} training tasks, {len(held_out)} held out")
    base = evaluate(worker, held_out, "base")

    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
    history: list[dict[str, float]] = []
    started = time.perf_counter()
    for step in range(config.steps):
        if time.perf_counter() - started > args.minutes * 60:
            break
        order = data_order(len(train), config.seed, step, config.prompts_per_step)
        result = worker.rollout(
            [train[i] for i in order], group_size=config.group_size, seed=step, id_prefix=f"s{step}-", step=step
        )
        with autocast:
            metrics = learner.train_step(result.samples)
        sync_started = time.perf_counter()
        blob, _ = learner.weight_update()
        if blob is not None:
            worker.backend.load_state_dict(receiver.receive(blob), learner.version)
        history.append(
            {
                "step": step + 1,
                "reward_mean": metrics["reward_mean"],
                "tokens_per_second": result.sampled_tokens / max(result.generation_seconds, 1e-9),
                "generation_seconds": result.generation_seconds,
                "train_seconds": metrics["train_seconds"],
                "sync_seconds": time.perf_counter() - sync_started,
                "elapsed_seconds": time.perf_counter() - started,
            }
        )
        log(
            f"step {step + 1}: reward {metrics['reward_mean']:.3f}, {history[-1]['tokens_per_second']:.0f} tokens/s "
            f"sampled, {metrics['train_seconds']:.1f}s train"
        )
    last = evaluate(worker, held_out, "last")

    diff, low, high, _ = paired_bootstrap(base, last)
    b = sum(1 for x, y in zip(base, last, strict=True) if x > y)  # right before, wrong after
    c = sum(1 for x, y in zip(base, last, strict=True) if y > x)
    p = mcnemar_exact(b, c)
    rewards = [h["reward_mean"] for h in history]
    trend = linear_trend([h["step"] for h in history], rewards, window=3)
    figures = {
        "command": " ".join(sys.argv),
        "device": name,
        "model": Path(path).name,
        "config": {k: v for k, v in EXAMPLE_CONFIG.items() if k != "base_model"},
        "steps": len(history),
        "minutes": round((history[-1]["elapsed_seconds"] if history else 0.0) / 60, 2),
        "history": history,
        "reward_first3": statistics.mean(rewards[:3]) if rewards else None,
        "reward_last3": statistics.mean(rewards[-3:]) if rewards else None,
        "trend": None if trend is None else trend.to_dict(),
        "tokens_per_second": statistics.median(h["tokens_per_second"] for h in history) if history else None,
        "train_seconds_per_step": statistics.median(h["train_seconds"] for h in history) if history else None,
        "held_out": {
            "tasks": len(base),
            "base": statistics.mean(base),
            "last": statistics.mean(last),
            "difference": diff,
            "ci95": [low, high],
            "better_worse": [c, b],
            "mcnemar_p": p,
            "verdict": eval_verdict(diff, p),
        },
    }
    print(json.dumps({k: v for k, v in figures.items() if k != "history"}, indent=2))
    if args.quick:
        return
    out = Path(args.out or ROOT / "bench" / "results" / f"gpu_learning-{'cuda' if cuda else 'cpu'}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2))
    log(f"wrote {out}")
    other = out.with_name(f"gpu_learning-{'cpu' if cuda else 'cuda'}.json")
    if other.exists():
        side = json.loads(other.read_text())
        print(f"\n{'':<28}{'this run':>14}{'other device':>14}")
        for label, key in (
            ("steps in budget", "steps"),
            ("minutes", "minutes"),
            ("tokens/s sampled", "tokens_per_second"),
            ("train s/step", "train_seconds_per_step"),
            ("reward, last 3 steps", "reward_last3"),
        ):
            print(f"{label:<28}{figures[key] or 0:>14.3f}{side.get(key) or 0:>14.3f}")
        print(
            f"{'held-out, last - base':<28}{figures['held_out']['difference']:>+14.3f}"
            f"{side['held_out']['difference']:>+14.3f}"
        )


if __name__ == "__main__":
    main()
