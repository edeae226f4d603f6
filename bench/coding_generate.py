"""A real generation run of repository tasks over the vendored libraries (issue 17 §1's figures).

    python bench/coding_generate.py [--sources toolz,isodate,cachetools,webcolors] [--max-tasks 60]
                                    [--max-candidates 400] [--seed 0] [--workers 2] [--out DIR] [--reverify]

Runs `workers.coding.generate.generate_tasks` in the real sandbox (each candidate: the library's related tests on
the mutated tree; each kept task: `verify_task`, two more runs) and writes bench/results/coding_generate.txt (the
figures: candidates, kept, dropped by reason, per source, family and operator, wall time, candidates per minute,
the suite statistics beside CursorBench's, and a few instructions) and bench/results/coding_generate.json (the
whole report, every candidate included). --reverify checks every kept task again from its archive alone (two more
sandboxed runs each) and its instruction for quoted test lines. With --out, also what the codegen job writes:
DIR/tasks.jsonl and DIR/snapshots/<sha256>.tar.gz (rows whose snapshot uris are those files). The machine has 2
cores and may be busy with other work: the load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._noise import add_load_guard, load_guard  # noqa: E402
from workers.coding.candidates import DEFAULT_SOURCES, CodegenParams  # noqa: E402
from workers.coding.generate import GenerationResult, generate_tasks  # noqa: E402
from workers.coding.instructions import leaked_lines  # noqa: E402
from workers.coding.stats import patch_lines_changed  # noqa: E402
from workers.coding.task import RepoTask  # noqa: E402
from workers.coding.verify import verify_task  # noqa: E402
from workers.coding.workspace import Snapshot  # noqa: E402


def _table(title: str, groups: dict[str, Any]) -> list[str]:
    lines = [title]
    for name, group in groups.items():
        dropped = ", ".join(f"{reason} {count}" for reason, count in group["dropped"].items()) or "none"
        lines.append(f"  {name:<28} {group['candidates']:>4} candidates  {group['kept']:>3} kept  dropped: {dropped}")
    return lines


def reverify(result: GenerationResult, workers: int) -> tuple[int, float, list[str]]:
    """Every kept task checked again from its archive alone, as an import would: (verified, seconds, problems)."""
    started = time.monotonic()

    def check(task: RepoTask) -> str:
        verification = verify_task(task, Snapshot.from_archive(result.snapshots[task.snapshot.sha256]))
        leaked = leaked_lines(task.instruction, task.hidden_tests.files)
        if not verification.ok:
            return f"{task.id}: {verification.reason}"
        return f"{task.id}: the instruction quotes {leaked}" if leaked else ""

    with ThreadPoolExecutor(max_workers=workers) as pool:
        problems = [problem for problem in pool.map(check, result.tasks) if problem]
    return len(result.tasks) - len(problems), time.monotonic() - started, problems


def _spread(values: list[int]) -> str:
    if not values:
        return "none"
    return f"median {statistics.median(values):g}, min {min(values)}, max {max(values)} (n={len(values)})"


def summary_text(
    result: GenerationResult, load: tuple[float, float, float], checked: tuple[int, float, list[str]] | None
) -> str:
    report = result.report
    stats = report["statistics"]
    lines = [
        "Repository-task generation (bench/coding_generate.py)",
        f"params: {json.dumps({k: v for k, v in report['params'].items() if k != 'operators'})}",
        f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (2 cores)",
        "",
        "sources:",
    ]
    for name, source in report["sources"].items():
        base = source["baseline"]
        lines.append(
            f"  {name} {source['version']} ({source['license']}): {source['functions']} functions in "
            f"{len(source['mutable_files'])} files; baseline {base['passing']} tests pass in the sandbox "
            f"({base['seconds']} s), {base['failing_in_sandbox']} fail there, {base['unstable']} unstable"
        )
    lines += [
        "",
        f"candidates available: {report['available_candidates']}; looked at: {report['candidates']}; "
        f"kept: {report['kept']} (target {report['target']}; {report['stopped']})",
        "dropped by reason: "
        + (", ".join(f"{reason} {count}" for reason, count in report["dropped"].items()) or "none"),
        f"wall time: {report['seconds']} s; {report['candidates_per_minute']} candidates/minute; "
        f"median seconds per checked candidate (one worker): {report['median_check_seconds']}",
        "",
        *_table("per source:", report["per_source"]),
        *_table("per family:", report["per_family"]),
        *_table("per operator:", report["per_operator"]),
        "",
        "suite statistics (CursorBench: median 181 lines changed, 390 instruction characters):",
        f"  tasks {stats['tasks']}; median lines changed by the reference patch {stats['median_lines_changed']}; "
        f"median instruction {stats['median_instruction_chars']} characters",
        f"  families {stats['families']}; sources {stats['sources']}",
        *(
            f"  lines changed, {family}: "
            + _spread([patch_lines_changed(t.reference_patch) for t in result.tasks if t.family == family])
            for family in ("repair", "implement")
        ),
        f"  instruction characters: {_spread([len(t.instruction) for t in result.tasks])}",
        "",
        (
            f"independent re-verification (verify_task from each archive, instruction leak check): {checked[0]} of "
            f"{len(result.tasks)} pass in {checked[1]:.0f} s" + (f"; problems: {checked[2]}" if checked[2] else "")
            if checked is not None
            else "independent re-verification: not run (--reverify)"
        ),
        "",
        "instructions (the first task of each source and family):",
    ]
    seen: set[tuple[str, str]] = set()
    for task in result.tasks:
        key = (str(task.source["library"]), task.family)
        if key in seen:
            continue
        seen.add(key)
        lines.append(f"  [{task.id}] {task.instruction}")
    return "\n".join(lines) + "\n"


def write_outputs(result: GenerationResult, out: Path) -> None:
    """What the codegen job writes, into a folder: tasks.jsonl and snapshots/<sha256>.tar.gz."""
    (out / "snapshots").mkdir(parents=True, exist_ok=True)
    uris = {}
    for sha256, archive in result.snapshots.items():
        path = out / "snapshots" / f"{sha256}.tar.gz"
        path.write_bytes(archive)
        uris[sha256] = f"file://{path.resolve()}"
    rows = []
    for task in result.tasks:
        snapshot = task.snapshot.model_copy(update={"uri": uris[task.snapshot.sha256]})
        rows.append(task.model_copy(update={"snapshot": snapshot}).to_row())
    text = "".join(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n" for row in rows)
    (out / "tasks.jsonl").write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sources", default=",".join(DEFAULT_SOURCES))
    parser.add_argument("--max-tasks", type=int, default=60)
    parser.add_argument("--max-candidates", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="also write tasks.jsonl and snapshots/ here")
    parser.add_argument("--reverify", action="store_true", help="verify every kept task again from its archive")
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "results")
    add_load_guard(parser)
    args = parser.parse_args()
    load_guard(args)
    params = CodegenParams(
        sources=args.sources.split(","),
        max_tasks=args.max_tasks,
        max_candidates=args.max_candidates,
        seed=args.seed,
        workers=args.workers,
    )
    load = os.getloadavg()
    started = time.monotonic()

    def on_progress(checked: int, kept: int, dropped: Mapping[str, int]) -> None:
        if checked % 10 == 0:
            elapsed = time.monotonic() - started
            print(f"[{elapsed:6.0f} s] {checked} candidates: {kept} kept, {dropped}", flush=True)

    result = generate_tasks(params, on_progress=on_progress, say=lambda line: print(line, flush=True))
    checked = reverify(result, args.workers) if args.reverify else None
    text = summary_text(result, load, checked)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "coding_generate.txt").write_text(text)
    (args.results / "coding_generate.json").write_text(json.dumps(result.report, indent=1, ensure_ascii=False))
    if args.out is not None:
        write_outputs(result, args.out)
    print(text)


if __name__ == "__main__":
    main()
