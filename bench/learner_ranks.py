"""The learner on 1 vs 2 CPU ranks (DDP, FSDP2), sharded vs one-file checkpoints, and the weight broadcast to 1, 2
and 4 rollout engines (issue 20's figures).

    .venv/bin/python bench/learner_ranks.py             # SmolLM2-135M, 3 alternating rounds (~10 minutes)
    .venv/bin/python bench/learner_ranks.py --quick     # the tiny test model: checks the script runs

1. Learner throughput: the same batch (16 samples of 96-224 tokens, GRPO, full parameters, fp32) trained by
   - `single, 2 threads`: today's one-process learner using both cores;
   - `single, 1 thread, half batch`: what one rank computes when two share the batch (the compute-only reference);
   - `ddp, 2 ranks x 1 thread` and `fsdp2, 2 ranks x 1 thread`: gloo process groups on this machine.
   The configurations run in alternating rounds, each in fresh processes, and each times `--steps` optimizer steps
   after one warm-up step. Tokens/s is the batch's tokens over the step time. The communication share of a 2-rank
   step is measured with torch's profiler on one more step: the time rank 0's gloo threads spent inside collectives
   (all-reduce, all-gather, broadcast; waiting for the other rank included) over that step's wall time. The older
   estimate 1 - t(half batch, one thread) / t(2-rank step) is printed beside it.
2. Checkpoints: save and load time and bytes, sharded (DCP, FSDP2 on 2 ranks, each rank its shards) vs one file
   (the single learner's torch.save of weights + AdamW state), to local disk.
3. Weight broadcast: the learner's update (a full sync, then a delta after one step) put once in Ray's object
   store and applied by 1, 2 and 4 engines (Ray actors holding the transformers backend) on this node; seconds
   until every engine has loaded it.
Results: bench/results/learner_ranks.{txt,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from bench._noise import add_load_guard, load_guard  # noqa: E402
from workers.models.registry import SMOLLM2, TINY_LLAMA, resolve_base_model  # noqa: E402
from workers.rl.config import TrainConfig  # noqa: E402
from workers.rl.distributed import free_port, init_process_group  # noqa: E402
from workers.rl.learner import Learner  # noqa: E402
from workers.rl.rollout import Sample  # noqa: E402

CONFIGS = [
    ("single, 2 threads", "single", 1, 2, False),
    ("single, 1 thread, half batch", "single", 1, 1, True),
    ("ddp, 2 ranks x 1 thread", "ddp", 2, 1, False),
    ("fsdp2, 2 ranks x 1 thread", "fsdp2", 2, 1, False),
]


def _config(model: str, strategy: str, ranks: int) -> TrainConfig:
    return TrainConfig(
        base_model=model,
        algorithm="grpo",
        prompts_per_step=4,
        group_size=4,
        learning_rate=1e-6,
        max_tokens_per_pack=1024,
        sampling={"max_new_tokens": 160},
        loss={"kl_coef": 0.0},
        learner={"strategy": strategy, "ranks": ranks},
    )


def _batch(count: int, seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    samples = []
    for i in range(count):
        prompt = [rng.randrange(100, 40000) for _ in range(64)]
        completion = [rng.randrange(100, 40000) for _ in range(32 + (i * 37) % 128)]
        samples.append(
            Sample(
                task_id=f"t{i // 4}",
                group=i // 4,
                token_ids=prompt + completion,
                completion_start=len(prompt),
                loss_mask=[1] * len(completion),
                old_logprobs=[-10.0] * len(completion),
                reward=float(rng.random() < 0.5),
                terms={},
                policy_version=0,
                num_turns=1,
                malformed_tool_calls=0,
                finish_reason="length",
                error=None,
                trajectory={"id": f"s{i}"},
            )
        )
    return samples


def _worker(rank: int, world: int, port: int, job: dict[str, Any], out: str) -> None:
    torch.set_num_threads(job["threads"])
    if job["strategy"] != "single":
        init_process_group(rank, world, "127.0.0.1", port)
    learner = Learner(job["model"], _config(job["model"], job["strategy"], world))
    batch = _batch(16)
    if job["half"]:
        batch = batch[::2]
    learner.train_step(batch)  # warm-up
    started = time.perf_counter()
    tokens = 0.0
    for _ in range(job["steps"]):
        tokens += sum(s.total_tokens for s in batch)
        learner.train_step(batch)
    seconds = (time.perf_counter() - started) / job["steps"]
    result: dict[str, Any] = {"step_seconds": seconds, "tokens": tokens / job["steps"]}
    if job["strategy"] != "single":
        result.update(_communication(learner, batch))
    folder = Path(job["folder"])
    if job.get("checkpoint"):
        if job["strategy"] == "single":
            began = time.perf_counter()
            blob = learner.checkpoint_bytes(data_position=0)
            (folder / "full.pt").write_bytes(blob)
            os.sync()
            result["save_seconds"] = time.perf_counter() - began
            result["bytes"] = len(blob)
            began = time.perf_counter()
            learner.load_checkpoint((folder / "full.pt").read_bytes())
            result["load_seconds"] = time.perf_counter() - began
        else:
            began = time.perf_counter()
            learner.save_sharded(str(folder / "sharded"), data_position=0)
            os.sync()
            result["save_seconds"] = time.perf_counter() - began
            result["bytes"] = sum(p.stat().st_size for p in (folder / "sharded").iterdir())
            began = time.perf_counter()
            learner.load_sharded(str(folder / "sharded"))
            result["load_seconds"] = time.perf_counter() - began
    if rank == 0:
        Path(out).write_text(json.dumps(result))
    if job["strategy"] != "single":
        torch.distributed.destroy_process_group()


def _communication(learner: Learner, batch: list[Sample]) -> dict[str, float]:
    """One more step under torch's profiler: the time this rank's gloo threads spent in collectives (`gloo:*`
    events: all-reduce, all-gather, broadcast, with the waiting for the other rank inside them), against the
    profiled step's wall time. Gloo runs them on its own threads, partly overlapped with the backward pass."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        began = time.perf_counter()
        learner.train_step(batch)
        wall = time.perf_counter() - began
    collectives = [e for e in prof.events() if e.name.startswith("gloo:")]
    inside = sum(e.cpu_time_total for e in collectives) / 1e6
    return {"profiled_step_seconds": wall, "collective_seconds": inside, "collective_calls": float(len(collectives))}


def _run(job: dict[str, Any], world: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        job = {**job, "folder": folder}
        out = f"{folder}/result.json"
        mp.start_processes(_worker, args=(world, free_port(), job, out), nprocs=world, join=True, start_method="spawn")
        result: dict[str, Any] = json.loads(Path(out).read_text())
        return result


def throughput(model: str, rounds: int, steps: int) -> dict[str, Any]:
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name, *_ in CONFIGS}
    for round_ in range(rounds):
        order = CONFIGS if round_ % 2 == 0 else CONFIGS[::-1]  # alternate, so drift hits every side alike
        for name, strategy, ranks, threads, half in order:
            job = {"model": model, "strategy": strategy, "threads": threads, "half": half, "steps": steps}
            job["checkpoint"] = round_ == 0 and name in ("single, 2 threads", "fsdp2, 2 ranks x 1 thread")
            rows[name].append(_run(job, ranks))
            print(f"  round {round_ + 1}: {name}: {rows[name][-1]['step_seconds']:.2f} s/step", flush=True)
    return rows


class _Engine:
    def __init__(self, path: str) -> None:
        torch.set_num_threads(1)
        from workers.models import make_backend
        from workers.rl.weightsync import WeightSyncReceiver

        self.backend = make_backend("transformers", path, threads=1)
        self.receiver = WeightSyncReceiver()

    def ready(self) -> bool:
        return True

    def apply(self, blob: bytes, version: int) -> int:
        self.backend.load_state_dict(self.receiver.receive(blob), version)
        return version


def broadcast(model: str, engines: list[int], rounds: int) -> dict[str, Any]:
    import ray

    ray.init(num_cpus=max(engines) + 1, log_to_driver=False, include_dashboard=False)
    learner = Learner(model, _config(model, "single", 1), threads=2)
    full, _ = learner.weight_update()
    learner.train_step(_batch(8))
    delta, _ = learner.weight_update()
    assert full is not None and delta is not None
    actor: Any = ray.remote(num_cpus=1)(_Engine)
    out: dict[str, Any] = {"full_bytes": len(full), "delta_bytes": len(delta)}
    for count in engines:
        times: dict[str, list[float]] = {"full": [], "delta": []}
        for _ in range(rounds):
            group = [actor.remote(model) for _ in range(count)]
            ray.get([engine.ready.remote() for engine in group])  # started and loaded before the clock starts
            for kind, blob in (("full", full), ("delta", delta)):
                began = time.perf_counter()
                ref = ray.put(blob)  # once per node: engines on it read the same shared-memory copy
                ray.get([engine.apply.remote(ref, 1) for engine in group])
                times[kind].append(time.perf_counter() - began)
            for engine in group:
                ray.kill(engine)
        out[str(count)] = times
        print(
            f"  {count} engine(s): full {statistics.median(times['full']):.2f} s, delta "
            f"{statistics.median(times['delta']):.2f} s",
            flush=True,
        )
    ray.shutdown()
    return out


def _spread_pct(values: list[float]) -> str:
    return f"{statistics.median(values):.0%} [{min(values):.0%}-{max(values):.0%}]"


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2)
    add_load_guard(parser)
    args = parser.parse_args()
    load_guard(args)
    model = str(resolve_base_model(TINY_LLAMA if args.quick else SMOLLM2))
    if args.quick:
        args.rounds, args.steps = 1, 1
    load_before = os.getloadavg()
    print(f"model {model}; load average {load_before[0]:.2f}")
    rows = throughput(model, args.rounds, args.steps)
    casts = broadcast(model, [1, 2, 4], 1 if args.quick else 2)
    load_after = os.getloadavg()

    lines = [
        f"model {Path(model).name}, {args.rounds} alternating rounds x {args.steps} steps; load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after",
        "",
    ]
    lines.append(f"{'learner':<32} {'s/step median [min-max]':>26} {'tokens/s':>9} {'vs single 2 threads':>20}")
    base = statistics.median(r["step_seconds"] for r in rows["single, 2 threads"])
    tokens = rows["single, 2 threads"][0]["tokens"]
    half = statistics.median(r["step_seconds"] for r in rows["single, 1 thread, half batch"])
    summary: dict[str, Any] = {"rows": rows, "broadcast": casts, "load": [load_before, load_after]}
    for name, *_ in CONFIGS:
        seconds = [r["step_seconds"] for r in rows[name]]
        median = statistics.median(seconds)
        batch_tokens = rows[name][0]["tokens"]
        ratio = base / median * batch_tokens / tokens
        lines.append(f"{name:<32} {_spread(seconds):>26} {batch_tokens / median:9.0f} {ratio:19.2f}x")
        if name.endswith("x 1 thread"):
            share = max(0.0, 1 - half / median)
            summary.setdefault("communication_share", {})[name] = share
            inside = [r["collective_seconds"] / r["profiled_step_seconds"] for r in rows[name]]
            calls = rows[name][0]["collective_calls"]
            summary.setdefault("collective_share", {})[name] = statistics.median(inside)
            lines.append(
                f"{'':<4}in gloo collectives (profiler, rank 0): {_spread_pct(inside)} of the step, {calls:.0f} calls; "
                f"1 - t(half batch) / t(step): {share:.0%}"
            )
    lines.append("")
    for name in ("single, 2 threads", "fsdp2, 2 ranks x 1 thread"):
        first = rows[name][0]
        kind = "one file (torch.save)" if name.startswith("single") else "sharded (DCP, 2 ranks)"
        lines.append(
            f"checkpoint {kind:<24} save {first['save_seconds']:.2f} s, load {first['load_seconds']:.2f} s, "
            f"{first['bytes'] / 1e6:.0f} MB"
        )
    lines.append("")
    lines.append(
        f"weight broadcast (ray.put once, every engine applies): full {casts['full_bytes'] / 1e6:.0f} MB, "
        f"delta {casts['delta_bytes'] / 1e6:.0f} MB"
    )
    for count in ("1", "2", "4"):
        lines.append(
            f"  {count} engine(s): full {_spread(casts[count]['full'])} s, delta {_spread(casts[count]['delta'])} s"
        )
    text = "\n".join(lines)
    print()
    print(text)
    if not args.quick:
        results = ROOT / "bench" / "results"
        results.mkdir(parents=True, exist_ok=True)
        (results / "learner_ranks.txt").write_text(text + "\n")
        (results / "learner_ranks.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
