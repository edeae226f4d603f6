"""Agent-swarm figures (issue 19): sub-agent fan-out on Ray, orchestration overhead per assign_task, and a single
agent against the swarm on held-out wide tasks.

    .venv/bin/python bench/swarm.py [--quick] [--rounds R] [--fanout N] [--tasks T] [--model NAME]

Everything runs in one invocation on a local Ray (2 CPUs, this machine) over the Python standard-library corpus
(`workers.search.stdlib_corpus`, about 5,300 chunks) with a BM25 index (the dense part is left out: embedding the
corpus takes minutes on 2 cores and measures nothing about the swarm). Nothing asserts on time; the load average
is printed beside the figures because the machine may be shared. Sides alternate within each round.

1. Fan-out: N sub-agent jobs (wide lookups of N different items, "Find `x` and report: document, kind,
   first_parameter") run (a) as N Ray tasks at once, (b) as Ray tasks one after another, (c) on N threads in this
   process, (d) one after another in this process. Wall-clock per batch, median and spread over the rounds; the
   speed-up is sequential / parallel on the same runner. Two sub-agent policies: `scripted` (the scripted searcher:
   two search steps, milliseconds of work each) and a model checkpoint (`--model`, greedy, `--steps` replies of up
   to `--tokens` tokens each: the frozen-model case, where generation dominates).
2. Overhead per assign_task: one orchestrator reply with N assign_task calls through the swarm environment, minus
   the slowest sub-agent's own time, divided by N (what the environment adds: job building, dispatch, collection,
   rendering), for the Ray and thread runners with the scripted sub-agent.
3. Single agent vs swarm on `--tasks` held-out wide tasks (seed 1000, never used elsewhere): the scripted
   orchestrator alone (one search per item, a grep when the search missed) and as a swarm (one lookup sub-agent per
   item, all in parallel; Ray runner, and threads in this process). Item-F1, critical steps (K2) and wall-clock per
   episode, same tasks, same index, alternating per task. A scripted step costs microseconds, so this wall-clock
   is dispatch overhead, not the work a model does per step; part 1's model fan-out measures that.
   Kimi reports 3-4.5x lower wall-clock at equal item-F1 with trained models on GPU clusters; the critical-step
   ratio here is what the swarm's shape gives, independent of hardware.

Results: bench/results/swarm.txt and .json (swarm-quick.* for --quick).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._noise import add_load_guard, load_guard  # noqa: E402

FULL = {"rounds": 5, "fanout": 4, "tasks": 20, "model": "smollm2-135m-instruct", "steps": 2, "tokens": 48}
QUICK = {"rounds": 2, "fanout": 3, "tasks": 4, "model": "tiny-llama-smollm2-tokenizer", "steps": 1, "tokens": 8}


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    for name in FULL:
        parser.add_argument(f"--{name}", type=type(FULL[name]), default=None)
    add_load_guard(parser)
    args = parser.parse_args()
    load_guard(args)
    size = dict(QUICK if args.quick else FULL)
    size.update({k: v for k, v in vars(args).items() if k in size and v is not None})

    import ray

    from workers.envs.registry import make_env
    from workers.search.corpus import build_corpus
    from workers.search.index import IndexConfig, SearchIndex
    from workers.search.index_store import save_index
    from workers.search.stdlib_corpus import stdlib_documents
    from workers.search.wide import WideParams, synthesize_wide, wide_entities
    from workers.swarm.metrics import swarm_episode_metrics
    from workers.swarm.scripted import ScriptedOrchestrator, run_episode
    from workers.swarm.subagents import SubagentJob, run_subagents

    results: dict[str, Any] = {"size": size, "loadavg_before": loadavg()}
    chunks, _ = build_corpus(stdlib_documents())
    index = SearchIndex.build(chunks, IndexConfig(dense=False))
    tmp = Path(tempfile.mkdtemp(prefix="crucible-bench-swarm-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    os.environ["CRUCIBLE_INDEX_CACHE"] = str(tmp / "cache")
    uri = f"file://{tmp}/index"
    save_index(index, uri)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="crucible-bench-swarm")

    from workers.search.synth_corpus import SynthCorpus

    columns = ["document", "kind", "first_parameter"]
    items = [name for name, _, _ in wide_entities(SynthCorpus(chunks), columns)]
    fanout = size["fanout"]

    def jobs(checkpoint: str, round_: int) -> list[SubagentJob]:
        picked = items[round_ * fanout * 7 % len(items) :][:fanout]
        return [
            SubagentJob(
                run_id=f"r{round_}-{i}",
                agent="lookup",
                system_prompt="You look up one API item in the corpus.",
                prompt=f"Find `{name}` in the corpus and report: {', '.join(columns)}.",
                checkpoint=checkpoint,
                max_steps=size["steps"] if checkpoint != "scripted" else 5,
                index_uri=uri,
                max_new_tokens=size["tokens"],
            )
            for i, name in enumerate(picked)
        ]

    def timed(call: Any) -> tuple[float, Any]:
        started = time.perf_counter()
        out = call()
        return time.perf_counter() - started, out

    sides = {
        "ray_parallel": lambda js: run_subagents(js, runner="ray", timeout_s=600),
        "ray_sequential": lambda js: [run_subagents([j], runner="ray", timeout_s=600)[0] for j in js],
        "threads_parallel": lambda js: run_subagents(js, runner="threads", timeout_s=600, index=index),
        "in_process_sequential": lambda js: run_subagents(js, runner="serial", timeout_s=600, index=index),
    }
    fan: dict[str, Any] = {}
    for checkpoint in ("scripted", size["model"]):
        # Warm-up: every Ray worker process that may run a sub-agent loads the index (and the model) once.
        for _ in range(2):
            run_subagents(jobs(checkpoint, 99), runner="ray", timeout_s=600)
        run_subagents(jobs(checkpoint, 99), runner="threads", timeout_s=600, index=index)
        walls: dict[str, list[float]] = {name: [] for name in sides}
        finished: dict[str, int] = {name: 0 for name in sides}
        order = list(sides)
        for round_ in range(size["rounds"]):
            for name in order if round_ % 2 == 0 else list(reversed(order)):
                batch = jobs(checkpoint, round_)
                seconds, out = timed(lambda name=name, batch=batch: sides[name](batch))
                walls[name].append(seconds)
                finished[name] += sum(1 for r in out if r.finished)
        fan[checkpoint] = {
            "walls": {name: summary(values) for name, values in walls.items()},
            "finished": finished,
            "speedup_ray": statistics.median(walls["ray_sequential"]) / statistics.median(walls["ray_parallel"]),
            "speedup_threads": statistics.median(walls["in_process_sequential"])
            / statistics.median(walls["threads_parallel"]),
        }
    results["fanout"] = fan

    # 2. overhead per assign_task
    from workers.envs.toolcalls import format_tool_call
    from workers.swarm.environment import ASSIGN_TOOL, CREATE_TOOL

    overhead: dict[str, list[float]] = {"ray": [], "threads": []}
    for round_ in range(size["rounds"]):
        for runner in ("ray", "threads") if round_ % 2 == 0 else ("threads", "ray"):
            env = make_env("swarm", index_uri=uri, subagent_runner=runner, max_parallel=fanout)
            env.bind_index(index)
            env.reset(env.validate_task_row({"id": f"o{round_}", "prompt": "overhead", "gold_chunk_ids": ["x"]}))
            env.step(format_tool_call(CREATE_TOOL, {"name": "lookup", "system_prompt": "look up"}))
            calls = [
                format_tool_call(ASSIGN_TOOL, {"agent": "lookup", "prompt": job.prompt})
                for job in jobs("scripted", round_ + 10)
            ]
            seconds, _ = timed(lambda calls=calls, env=env: env.step("\n".join(calls)))
            slowest = max(float(s["seconds"]) for s in env.swarm_record()["subagents"])
            overhead[runner].append((seconds - slowest) / fanout)
    results["overhead_per_assign"] = {runner: summary(values) for runner, values in overhead.items()}

    # 3. single agent vs swarm on held-out wide tasks
    tasks = synthesize_wide(chunks, WideParams(num_tasks=size["tasks"], min_rows=4, max_rows=8, seed=1000)).tasks
    modes = {"single": ("single", "ray"), "swarm": ("swarm", "ray"), "swarm_threads": ("swarm", "threads")}
    compare: dict[str, dict[str, list[float]]] = {
        mode: {"item_f1": [], "critical_steps": [], "seconds": []} for mode in modes
    }
    for i, row in enumerate(tasks):
        for mode in list(modes) if i % 2 == 0 else list(reversed(modes)):
            policy, runner = modes[mode]
            env = make_env("swarm", index_uri=uri, subagent_runner=runner)
            env.bind_index(index)
            seconds, record = timed(
                lambda env=env, policy=policy, row=row: run_episode(env, ScriptedOrchestrator(policy), row)
            )
            metrics = swarm_episode_metrics(record)
            compare[mode]["item_f1"].append(metrics["item_f1"])
            compare[mode]["critical_steps"].append(metrics["critical_steps"])
            compare[mode]["seconds"].append(seconds)
    results["single_vs_swarm"] = {
        "tasks": len(tasks),
        "rows_per_task": statistics.mean(len(t["table"]["rows"]) for t in tasks),
        **{
            mode: {name: {"mean": statistics.mean(v), "median": statistics.median(v)} for name, v in figures.items()}
            for mode, figures in compare.items()
        },
    }
    side = results["single_vs_swarm"]
    side["critical_steps_ratio"] = side["single"]["critical_steps"]["mean"] / side["swarm"]["critical_steps"]["mean"]
    side["wall_clock_ratio"] = side["single"]["seconds"]["median"] / side["swarm"]["seconds"]["median"]
    results["loadavg_after"] = loadavg()
    ray.shutdown()

    lines = [
        f"Agent swarm (issue 19), {'quick' if args.quick else 'full'} run: {size}",
        f"load average {results['loadavg_before']} -> {results['loadavg_after']}; Ray with 2 CPUs, BM25 index over "
        f"{len(chunks)} stdlib chunks",
        "",
        f"1. fan-out of {fanout} sub-agents, wall-clock per batch (median [min, max] over {size['rounds']} rounds):",
    ]
    for checkpoint, figures in fan.items():
        lines.append(f"  {checkpoint}:")
        for name, s in figures["walls"].items():
            lines.append(
                f"    {name:<22} {s['median']:8.3f} s  [{s['min']:.3f}, {s['max']:.3f}]  "
                f"finished {figures['finished'][name]}/{fanout * size['rounds']}"
            )
        lines.append(
            f"    speed-up parallel vs sequential: Ray {figures['speedup_ray']:.2f}x, "
            f"threads {figures['speedup_threads']:.2f}x"
        )
    lines.append("")
    lines.append("2. orchestration overhead per assign_task (reply wall-clock minus the slowest sub-agent, / N):")
    for runner, s in results["overhead_per_assign"].items():
        lines.append(f"  {runner:<8} {s['median'] * 1000:8.1f} ms  [{s['min'] * 1000:.1f}, {s['max'] * 1000:.1f}]")
    lines.append("")
    lines.append(
        f"3. single agent vs swarm, scripted orchestrators, {side['tasks']} held-out wide tasks "
        f"({side['rows_per_task']:.1f} rows each on average), Ray runner:"
    )
    for mode in modes:
        m = side[mode]
        lines.append(
            f"  {mode:<14} item-F1 {m['item_f1']['mean']:.3f}  critical steps {m['critical_steps']['mean']:.1f}  "
            f"wall-clock median {m['seconds']['median']:.3f} s"
        )
    lines.append(
        f"  single / swarm: critical steps {side['critical_steps_ratio']:.2f}x, "
        f"wall-clock {side['wall_clock_ratio']:.2f}x"
    )
    text = "\n".join(lines)
    print(text)
    stem = "swarm-quick" if args.quick else "swarm"
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.txt").write_text(text + "\n")
    (out / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
