"""Sync vs async vs async with weights updated mid-rollout (partial rollouts): the real trainer (workers.jobs.train)
on a local Ray, the same tasks, model, seed and steps, the modes in alternating rounds (issue 23 part 2).

    .venv/bin/python bench/async_modes.py               # SmolLM2-135M, 2 rounds of each mode (~25 minutes)
    .venv/bin/python bench/async_modes.py --quick       # the tiny test model, 1 round: checks the script runs

Each run is a fresh subprocess calling `workers.jobs.train.run` with its real reporter, which posts its events to a
small HTTP sink in this process (the control plane's ingest is not what is measured). Figures come from the
trainer's own per-step metrics, the first step left out (Ray start, model load, the first rollout):
  tokens/s            sampled tokens / wall time (`step_seconds`: from one step's end to the next's)
  generation idle     1 - engine generation seconds / wall time
  learner idle        1 - (train_seconds + sync_seconds, the learner's encode of the update) / wall time
  lag 1 share         share of trained tokens sampled by weights one version old (0 in sync mode)
  mixed episodes      episodes whose tokens come from two versions (only partial rollouts make them)
Placement: sync colocates one engine with the learner on both cores (it sleeps while the learner trains); async
splits them, one core each, so generation of step t+1 overlaps training of step t.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._noise import add_load_guard, load_guard  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "async_modes.txt"
MODES = {
    "sync": {"mode": "sync"},
    "async": {"mode": "async", "max_staleness": 1},
    "async + partial rollouts": {"mode": "async", "max_staleness": 1, "partial_rollout": True},
}


class _Sink(BaseHTTPRequestHandler):
    """Accepts the reporter's batches (any path ending in the run id) and keeps the metric events."""

    store: dict[str, list[dict[str, Any]]] = {}
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        with self.lock:
            self.store.setdefault(self.path, []).extend(e for e in body.get("events", []) if e["kind"] == "metric")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"stored": true}')

    def log_message(self, *args: Any) -> None:
        return


def _child(spec_path: str) -> None:
    from workers.jobs.train import run
    from workers.specs import TrainSpec

    run(TrainSpec.model_validate_json(Path(spec_path).read_text()))


def _figures(events: list[dict[str, Any]]) -> dict[str, float]:
    steps = sorted({e["step"]: e["values"] for e in events}.items())[1:]  # the first step warms up
    values = [v for _, v in steps]
    wall = sum(v["step_seconds"] for v in values)
    tokens = sum(v["sampled_tokens"] for v in values)
    return {
        "tokens_per_second": tokens / wall,
        "generation_idle": 1 - sum(v["generation_seconds"] for v in values) / wall,
        "learner_idle": 1 - sum(v["train_seconds"] + v.get("sync_seconds", 0.0) for v in values) / wall,
        "lag_1_share": statistics.fmean(v.get("versions/lag_1_share", 0.0) for v in values),
        "mixed_episodes": sum(v.get("versions/mixed_samples", 0.0) for v in values),
        "step_seconds": statistics.median(v["step_seconds"] for v in values),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    add_load_guard(parser)
    args = parser.parse_args()
    load = load_guard(args)
    from workers.envs.registry import arithmetic_tasks

    model = "tiny-llama-smollm2-tokenizer" if args.quick else "smollm2-135m-instruct"
    rounds = args.rounds or (1 if args.quick else 2)
    steps = args.steps or (3 if args.quick else 4)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    work = Path(tempfile.mkdtemp(prefix="crucible-async-bench-"))
    tasks = work / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in arithmetic_tasks(64, seed=3)))
    env = {**os.environ, "CRUCIBLE_INGEST_TOKEN": "bench", "CRUCIBLE_SPOOL_DIR": str(work / "spool")}
    env.pop("RAY_ADDRESS", None)  # a local Ray per run, started by the trainer
    results: dict[str, list[dict[str, float]]] = {name: [] for name in MODES}
    run_id = 0
    for round_ in range(rounds):
        order = list(MODES) if round_ % 2 == 0 else list(reversed(MODES))  # ABC CBA ...
        for name in order:
            run_id += 1
            config = {
                "base_model": model,
                "environment": "calculator",
                "env_params": {"max_turns": 2},
                "steps": steps,
                "prompts_per_step": 2,
                "group_size": 4,
                "learning_rate": 1e-5,
                "checkpoint_every": 1000,
                "trajectory_samples_per_step": 0,
                "sampling": {"max_new_tokens": 32},
                "compute": {"cpus": 2, "memory_gb": 4},
                **MODES[name],
            }
            spec = {
                "run_id": run_id,
                "kind": "train",
                "ingest_url": f"http://127.0.0.1:{server.server_address[1]}/ingest/{run_id}",
                "input_uri": f"file://{tasks}",
                "reward": {"terms": [{"type": "exact_match"}]},
                "output_prefix": f"file://{work}/out-{run_id}",
                "config": config,
            }
            spec_path = work / f"spec-{run_id}.json"
            spec_path.write_text(json.dumps(spec))
            done = subprocess.run(
                [sys.executable, __file__, "--child", str(spec_path)],
                env=env,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=open(work / f"run-{run_id}.log", "w"),  # noqa: SIM115 (closed when the child exits)
                timeout=1800,
            )
            if done.returncode != 0:
                raise SystemExit(f"{name} run failed: {work / f'run-{run_id}.log'}")
            figures = _figures(_Sink.store[f"/ingest/{run_id}"])
            results[name].append(figures)
            print(f"round {round_ + 1} {name}: {json.dumps({k: round(v, 3) for k, v in figures.items()})}", flush=True)
    server.shutdown()
    after = os.getloadavg()
    lines = [
        f"async_modes: {model}, calculator (2 turns), 2 prompts x 4, 32 new tokens, {steps} steps (first left out), "
        f"{rounds} alternating rounds; load {load[0]:.2f} -> {after[0]:.2f}",
        f"{'mode':<26} {'tokens/s':>16} {'gen idle':>14} {'learner idle':>14} {'lag-1 share':>12} {'mixed ep.':>10}",
    ]

    def cell(name: str, key: str, fmt: str) -> str:
        xs = [r[key] for r in results[name]]
        med = statistics.median(xs)
        return f"{med:{fmt}} ({min(xs):{fmt}}-{max(xs):{fmt}})" if len(xs) > 1 else f"{med:{fmt}}"

    for name in MODES:
        lines.append(
            f"{name:<26} {cell(name, 'tokens_per_second', '.1f'):>16} {cell(name, 'generation_idle', '.0%'):>14} "
            f"{cell(name, 'learner_idle', '.0%'):>14} {cell(name, 'lag_1_share', '.2f'):>12} "
            f"{statistics.median(r['mixed_episodes'] for r in results[name]):>10.0f}"
        )
    base = statistics.median(r["tokens_per_second"] for r in results["sync"])
    for name in list(MODES)[1:]:
        ratio = statistics.median(r["tokens_per_second"] for r in results[name]) / base
        lines.append(f"{name} / sync tokens/s: {ratio:.2f}x")
    text = "\n".join(lines)
    print(text)
    if not args.quick:
        RESULTS.write_text(text + "\n")
    shutil.rmtree(work, ignore_errors=True)  # kept when a run fails: the error names its log in there


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _child(sys.argv[2])
    else:
        main()
