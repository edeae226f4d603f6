"""Copy-on-write workspaces against full copies, and the cost of a sandboxed tool call (issue 17's figures).

    python bench/coding_workspace.py [--files 5000] [--rounds 7] [--calls 10]

A synthetic repository of `--files` Python files (about 2 KiB each, in 100 packages) is loaded as a snapshot; a
workspace over it has 20 files edited (an episode a few turns in). Then, in alternating rounds:

1. Fork: `Workspace.fork()` after one more edit (so every fork freezes a layer, and every 16th compacts the chain:
   the amortised cost), against the two ways to copy the same state without layers: the merged file map
   (`Workspace.files()`, a dict of every path) and `shutil.copytree` of the tree written on disk. Per round, the
   median of 100 forks and of 5 copies each; reported: the median over rounds, the spread (min-max of the round
   medians) and the ratio of medians. The issue's target: fork <= 50 ms and >= 20x faster than a full copy.
2. Tool-call overhead: `execute.run_command(workspace, "true")` on the 5,000-file workspace and on a 2-file one,
   against a raw `subprocess.run(["/bin/sh", "-c", "true"])`, `--calls` calls each, alternating. The difference
   is what the harness adds to every `run` tool call: writing the tree into the sandbox's tmpfs, the namespaces,
   Landlock, hashing the tree before and after, and reading back the changes.
3. Hidden tests: `hidden_tests.run_hidden_tests` on a small task (2 hidden tests, pytest in a fresh sandbox),
   `--calls` runs: p50 and p95.

The machine has 2 cores and may be busy with other work: the load average is printed beside the figures. Results:
bench/results/coding_workspace.{txt,json}. Nothing here asserts on time.
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
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._noise import add_load_guard, load_guard  # noqa: E402
from workers.coding.execute import run_command  # noqa: E402
from workers.coding.hidden_tests import run_hidden_tests  # noqa: E402
from workers.coding.task import HiddenTests  # noqa: E402
from workers.coding.workspace import Snapshot, Workspace  # noqa: E402


def synthetic_repository(files: int) -> dict[str, str]:
    """`files` modules of about 2 KiB, 100 packages, plus a README: text a real repository could hold."""
    repo: dict[str, str] = {"README.md": "# synthetic\n"}
    for i in range(files - 1):
        body = "".join(f"def f{i}_{j}(x):\n    return x * {j} + {i}  # line {j}\n\n" for j in range(40))
        repo[f"src/pkg{i % 100}/mod{i}.py"] = f'"""Module {i}."""\n\n{body}'
    return repo


def _ms(seconds: float) -> float:
    return seconds * 1000.0


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))] if ordered else float("nan")


def _timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def bench_fork(repo: dict[str, str], rounds: int) -> dict[str, Any]:
    snapshot = Snapshot.from_files(repo)
    workspace = Workspace(snapshot)
    paths = snapshot.paths
    for path in paths[1:21]:
        workspace.write_text(path, workspace.read_text(path) + "# edited\n")
    scratch = Path(tempfile.mkdtemp(prefix="crucible-bench-ws-"))
    try:
        tree = workspace.materialize(scratch / "tree")
        per_round: dict[str, list[float]] = {"fork": [], "fork (mean, amortised)": [], "files": [], "copytree": []}
        for round_index in range(rounds):
            forks: list[float] = []
            for i in range(100):
                workspace.write_text(paths[21 + (i % 50)], f"# round {round_index} edit {i}\n")
                forks.append(_timed(workspace.fork))
            copies = [_timed(workspace.files) for _ in range(5)]
            trees: list[float] = []
            for i in range(5):
                target = scratch / f"copy-{round_index}-{i}"
                trees.append(_timed(lambda target=target: shutil.copytree(tree, target)))
                shutil.rmtree(target)
            per_round["fork"].append(_median(forks))
            per_round["fork (mean, amortised)"].append(statistics.fmean(forks))
            per_round["files"].append(_median(copies))
            per_round["copytree"].append(_median(trees))
        chain = workspace.chain_length
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    summary = {
        name: {
            "median_ms": _ms(_median(values)),
            "min_ms": _ms(min(values)),
            "max_ms": _ms(max(values)),
        }
        for name, values in per_round.items()
    }
    return {"files": len(repo), "rounds": rounds, "chain_length_at_end": chain, "timings": summary}


def bench_tool_calls(repo: dict[str, str], calls: int) -> dict[str, Any]:
    big = Workspace(Snapshot.from_files(repo))
    small = Workspace(Snapshot.from_files({"a.py": "x = 1\n", "b.py": "y = 2\n"}))
    times: dict[str, list[float]] = {"raw": [], "small": [], "big": []}
    run_command(small, "true")  # warm the interpreter's caches once
    for _ in range(calls):
        times["raw"].append(_timed(lambda: subprocess.run(["/bin/sh", "-c", "true"], check=True)))
        times["small"].append(_timed(lambda: run_command(small, "true")))
        times["big"].append(_timed(lambda: run_command(big, "true")))
    return {
        name: {"p50_ms": _ms(_median(values)), "p95_ms": _ms(_p95(values)), "min_ms": _ms(min(values))}
        for name, values in times.items()
    }


def bench_hidden_tests(calls: int) -> dict[str, Any]:
    workspace = Workspace(Snapshot.from_files({"mathx/__init__.py": "def clamp(x, lo, hi):\n    return max(lo, x)\n"}))
    tests = HiddenTests(
        files={
            "tests/test_clamp.py": "from mathx import clamp\n\n\ndef test_low():\n    assert clamp(-1, 0, 5) == 0\n\n\n"
            "def test_high():\n    assert clamp(9, 0, 5) == 5\n"
        },
        fail_to_pass=["tests/test_clamp.py::test_high"],
        pass_to_pass=["tests/test_clamp.py::test_low"],
    )
    times: list[float] = []
    for _ in range(calls):
        started = time.perf_counter()
        report = run_hidden_tests(workspace, tests)
        times.append(time.perf_counter() - started)
        assert report.outcomes == {
            "tests/test_clamp.py::test_high": "failed",
            "tests/test_clamp.py::test_low": "passed",
        }
    return {"p50_ms": _ms(_median(times)), "p95_ms": _ms(_p95(times)), "runs": calls}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=10)
    add_load_guard(parser)
    args = parser.parse_args()
    load_guard(args)

    load_start = os.getloadavg()
    repo = synthetic_repository(args.files)
    size = sum(len(text) for text in repo.values())
    fork = bench_fork(repo, args.rounds)
    tools = bench_tool_calls(repo, args.calls)
    hidden = bench_hidden_tests(args.calls)
    load_end = os.getloadavg()

    t = fork["timings"]
    rows = [
        ("Workspace.fork() after an edit (median)", t["fork"]),
        ("Workspace.fork() after an edit (mean: compaction every 16th included)", t["fork (mean, amortised)"]),
        ("full copy: Workspace.files() (merged map of every file)", t["files"]),
        ("full copy: shutil.copytree of the tree on disk", t["copytree"]),
    ]
    lines = [
        f"bench/coding_workspace.py, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores (shared; other work "
        f"may be running), load average {load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end",
        f"Synthetic repository: {fork['files']} files, {size / 1e6:.1f} MB; a workspace with 20 edited files. "
        f"{args.rounds} rounds, alternating; per round the median of 100 forks and of 5 copies each.",
        "",
        "| operation | median | spread (min-max of round medians) | vs fork |",
        "| --- | --- | --- | --- |",
    ]
    for name, figures in rows:
        ratio = figures["median_ms"] / t["fork"]["median_ms"]
        lines.append(
            f"| {name} | {figures['median_ms']:.4f} ms | {figures['min_ms']:.4f}-{figures['max_ms']:.4f} ms "
            f"| {ratio:,.0f}x |"
        )
    lines += [
        "",
        f"Chain length at the end: {fork['chain_length_at_end']} frozen layers (compacted past 16).",
        "",
        f"Tool-call overhead, {args.calls} calls each, alternating (p50 / p95 / min):",
        "",
        "| call | p50 | p95 | min |",
        "| --- | --- | --- | --- |",
    ]
    for name, label in (
        ("raw", "subprocess.run(['/bin/sh', '-c', 'true']) (raw)"),
        ("small", "run_command(workspace, 'true'), 2-file workspace"),
        ("big", f"run_command(workspace, 'true'), {fork['files']}-file workspace"),
    ):
        figures = tools[name]
        lines.append(
            f"| {label} | {figures['p50_ms']:.1f} ms | {figures['p95_ms']:.1f} ms | {figures['min_ms']:.1f} ms |"
        )
    lines += [
        "",
        f"Hidden tests (2 tests, pytest in a fresh sandbox), {hidden['runs']} runs: p50 {hidden['p50_ms']:.0f} ms, "
        f"p95 {hidden['p95_ms']:.0f} ms.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "coding_workspace.txt").write_text(text)
    result = {
        "fork": fork,
        "tool_calls": tools,
        "hidden_tests": hidden,
        "load_average": {"start": load_start, "end": load_end},
        "cpu_count": os.cpu_count(),
    }
    (out / "coding_workspace.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
