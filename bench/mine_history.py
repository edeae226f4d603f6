"""Repository tasks mined from real git histories, their suite statistics beside CursorBench's (issue 40 part 3).

    .venv/bin/python bench/mine_history.py REPO_PATH=owner/name [...] [--max-commits N] [--max-tasks N]

For each repository (a clone or a bare git directory with its history): `workers.coding.mining.mine` reads its
commits newest first, keeps those that change code and tests and whose tests show a fail-to-pass (each tree run
twice), then every kept instance is verified in the sandbox by the import (`workers.jobs.repoimport.import_tasks`),
exactly as a `repomine` run does. Printed per repository and for all together: commits read, candidates, mined,
verified, drops by reason, and the verified suite's median lines changed, files changed and instruction length
beside CursorBench's published medians (181 lines; SWE-bench's 7-10 for reference). The tests of each commit run
with this machine's Python and packages, so a commit whose tests need what is not installed drops as
`no_tests_collected` or `no_fail_to_pass`. Results: bench/results/mine_history.{txt,json}.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("repos", nargs="+", help="PATH=owner/name")
    parser.add_argument("--max-commits", type=int, default=400)
    parser.add_argument("--max-tasks", type=int, default=20)
    parser.add_argument("--min-lines", type=int, default=1, help="fewest non-test lines a commit changes")
    parser.add_argument("--max-lines", type=int, default=2000)
    parser.add_argument("--out", default="", help="results path without suffix (default: mine_history[-min<N>])")
    args = parser.parse_args()
    suffix = f"-min{args.min_lines}" if args.min_lines > 1 else ""
    out = args.out or str(ROOT / "bench" / "results" / f"mine_history{suffix}")

    from workers.coding.execute import CommandLimits
    from workers.coding.mining import MineParams, bundle_bytes, mine
    from workers.coding.stats import CURSORBENCH, suite_statistics
    from workers.coding.swebench import bundle_path
    from workers.jobs.repoimport import import_tasks
    from workers.specs import RepoImportSpec

    results: dict[str, Any] = {"repositories": {}, "loadavg_before": os.getloadavg()}
    every: list[dict[str, Any]] = []
    lines = [
        f"Repository tasks mined from git history (issue 40 part 3), {args.max_commits} commits read per repository, "
        f"at most {args.max_tasks} tasks each, {args.min_lines}-{args.max_lines} lines changed; "
        f"load average {os.getloadavg()[0]:.2f}",
        "",
        "| repository | commits read | candidates | mined | verified | median lines changed | median files changed "
        "| median instruction chars | minutes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for item in args.repos:
        path, _, name = item.partition("=")
        started = time.perf_counter()
        params = MineParams(
            max_commits=args.max_commits, max_tasks=args.max_tasks, min_lines=args.min_lines, max_lines=args.max_lines
        )
        mined = mine(path, params, repo=name, limits=CommandLimits(wall_seconds=180, cpu_seconds=180))
        rows: list[dict[str, Any]] = []
        report: dict[str, Any] = {"refused": []}
        if mined.instances:
            with tempfile.TemporaryDirectory(prefix="crucible-mine-bench-") as tmp:
                folder = Path(tmp)
                buffer = io.BytesIO()
                with zipfile.ZipFile(buffer, "w") as archive:
                    archive.writestr("tasks.jsonl", "".join(json.dumps(r) + "\n" for r in mined.instances))
                    archive.writestr(bundle_path(name), bundle_bytes(path))
                (folder / "upload.zip").write_bytes(buffer.getvalue())
                spec = RepoImportSpec(
                    run_id=1,
                    kind="repoimport",
                    ingest_url="http://localhost/unused",
                    upload_uri=f"file://{folder / 'upload.zip'}",
                    output_uri=f"file://{folder / 'tasks.jsonl'}",
                    report_uri=f"file://{folder / 'report.json'}",
                    snapshot_root=f"file://{folder / 'snapshots'}",
                    keep_valid=True,
                    test_timeout_seconds=180,
                )
                report = import_tasks(spec, echo=lambda line: None)
                rows = [json.loads(x) for x in (folder / "tasks.jsonl").read_text().splitlines() if x]
        stats = suite_statistics(rows)
        minutes = (time.perf_counter() - started) / 60
        every += rows
        results["repositories"][name] = {
            "mining": mined.report,
            "verified": len(rows),
            "refused": report["refused"],
            "statistics": stats,
            "minutes": minutes,
            "tasks": [
                {
                    "id": r["id"],
                    "instruction": r["instruction"][:300],
                    "fail_to_pass": len(r["hidden_tests"]["fail_to_pass"]),
                    "pass_to_pass": len(r["hidden_tests"]["pass_to_pass"]),
                    "created_at": (r.get("source") or {}).get("created_at"),
                }
                for r in rows
            ],
        }
        lines.append(
            f"| {name} | {mined.report['commits_read']} | {mined.report['candidates']} | {mined.report['kept']} "
            f"| {len(rows)} | {stats['median_lines_changed']} | {stats['median_files_changed']} "
            f"| {stats['median_instruction_chars']} | {minutes:.1f} |"
        )
        print(lines[-1], flush=True)
    total = suite_statistics(every)
    lines.append(
        f"| **all** | | | | {len(every)} | {total['median_lines_changed']} | {total['median_files_changed']} "
        f"| {total['median_instruction_chars']} | |"
    )
    lines.append(
        f"| CursorBench (published) | | | | | {CURSORBENCH['median_lines_changed']} | | "
        f"{CURSORBENCH['median_instruction_chars']} | |"
    )
    lines += ["", "Drops by reason:"]
    for name, figures in results["repositories"].items():
        dropped = {k: v for k, v in figures["mining"]["dropped"].items() if v}
        lines.append(f"- {name}: {dropped}; refused at verification: {len(figures['refused'])}")
    if every:
        lines += ["", f"lines changed, per task: {sorted(int(x) for x in _lines(every))}"]
    results["all"] = total
    text = "\n".join(lines)
    print(text)
    Path(out + ".txt").write_text(text + "\n")
    Path(out + ".json").write_text(json.dumps(results, indent=2, default=str) + "\n")


def _lines(rows: list[dict[str, Any]]) -> list[int]:
    from workers.coding.stats import patch_lines_changed

    return [patch_lines_changed(r.get("reference_patch")) for r in rows]


if __name__ == "__main__":
    main()
