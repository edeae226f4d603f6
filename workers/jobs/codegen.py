"""Repository tasks generated from vendored libraries, as a Ray job (`python -m workers.jobs.codegen`).

Runs `workers.coding.generate.generate_tasks` with the spec's parameters (sources, families, max_tasks,
max_candidates, seed, test limits, workers), reports progress as it goes (`progress`: tasks kept out of
max_tasks; a `metric` per candidate: candidates, kept, dropped and dropped/<reason, in snake case>; a `log` line
every few candidates), and writes three kinds of output:

    <snapshot_root>/<sha256>.tar.gz   each kept task's repository snapshot (the mutated library less its hidden
                                      test files), a canonical tar.gz (`workers.coding.archive.pack`) named by the
                                      content hash of its files; written once per distinct snapshot, before any
                                      row names it, so a crash leaves at worst an unreferenced archive
    <output_uri>                      the kept tasks, one repo_task/v1 row a line (`RepoTask.to_row`), sorted keys;
                                      `snapshot.uri` is the archive above, `provenance.ids` carries the run id,
                                      the generator, the seed and the candidate id, `source` the library, version,
                                      sdist sha256, file, function, operator and the mutation
    <report_uri>                      the report (JSON, schema "codegen_report/v1"):
        params                        the parameters the run used
        sources                       per library: version, sdist and its sha256, licence, files, mutable files,
                                      test files, functions, and the baseline (tests passing in the sandbox,
                                      unstable ones, ones failing there, seconds)
        available_candidates          candidates the sources offered; candidates: how many were looked at
        kept, target, stopped         tasks kept, max_tasks, and why it stopped ("target reached", "candidate
                                      limit reached", "candidates exhausted")
        dropped                       {reason: count}; the reasons are `workers.coding.generate.DROP_REASONS`
        per_source, per_family,       {name: {candidates, kept, dropped: {reason: count}}}
        per_operator
        statistics                    `workers.coding.stats.suite_statistics` of the kept rows: count, median lines
                                      changed by the reference patch, median instruction characters, families,
                                      sources, CursorBench's figures beside them
        seconds, candidates_per_minute, median_check_seconds
        checked                       one entry per candidate in the order looked at: id, library, family,
                                      operator, path, function, line, mutation, outcome ("kept" or the drop
                                      reason), detail, fail_to_pass, task_id, seconds, timings
        outputs                       {"tasks": output_uri, "snapshots": {sha256: uri}}

The control plane's success hook turns the rows into a repo_tasks dataset version; the report has no "refused"
list (that is the import job's word for tasks a user gave that failed), so nothing here asks it to store nothing.

Everything runs in the job's driver: candidates are checked `workers` at a time in threads, each check being
sandboxed pytest runs in their own processes, so threads keep the cores busy without Ray tasks, and one process
keeps the output a pure function of the sources, the parameters and the seed.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Mapping
from typing import Any

from workers.coding.generate import GenerationResult, generate_tasks
from workers.jobs.common import load_spec, reporter_for
from workers.reporting import Reporter, configure_logging
from workers.specs import CodegenSpec
from workers.storage import write_bytes

log = logging.getLogger("crucible.codegen")

LOG_EVERY = 10  # candidates between progress lines in the run's log


def _metric_name(reason: str) -> str:
    """A drop reason as a metric name: "tests do not catch it" -> "tests_do_not_catch_it"."""
    return re.sub(r"[^a-z0-9]+", "_", reason.lower()).strip("_")


def snapshot_uri(root: str, sha256: str) -> str:
    return f"{root.rstrip('/')}/{sha256}.tar.gz"


def generate(spec: CodegenSpec, reporter: Reporter | None = None) -> GenerationResult:
    """Generate, write the snapshots, the rows and the report; `reporter` (if any) gets progress, metrics, logs."""
    params = spec.params()
    started = time.monotonic()

    def say(line: str) -> None:
        log.info(line)
        if reporter is not None:
            reporter.log(line)

    def on_progress(checked: int, kept: int, dropped: Mapping[str, int]) -> None:
        if reporter is not None:
            reporter.progress(kept, params.max_tasks)
            values = {"candidates": float(checked), "kept": float(kept), "dropped": float(sum(dropped.values()))}
            values.update({f"dropped/{_metric_name(reason)}": float(count) for reason, count in dropped.items()})
            reporter.metric(checked, values)
        if checked % LOG_EVERY == 0:
            say(f"{checked} candidates checked: {kept} kept, {sum(dropped.values())} dropped")

    if reporter is not None:
        reporter.progress(0, params.max_tasks)
    say(
        f"generating up to {params.max_tasks} tasks from {', '.join(params.sources)} "
        f"({', '.join(params.families)}; at most {params.max_candidates} candidates, seed {params.seed})"
    )
    result = generate_tasks(params, on_progress=on_progress, say=say)
    uris: dict[str, str] = {}
    for sha256, archive in sorted(result.snapshots.items()):
        uris[sha256] = snapshot_uri(spec.snapshot_root, sha256)
        write_bytes(uris[sha256], archive, spec.storage_options)
    rows = []
    for task in result.tasks:
        provenance = {**task.provenance, "ids": {**task.provenance["ids"], "run": str(spec.run_id)}}
        snapshot = task.snapshot.model_copy(update={"uri": uris[task.snapshot.sha256]})
        rows.append(task.model_copy(update={"snapshot": snapshot, "provenance": provenance}).to_row())
    data = "".join(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n" for row in rows).encode()
    report = {**result.report, "outputs": {"tasks": spec.output_uri, "snapshots": uris}}
    encoded = json.dumps(report, indent=2, ensure_ascii=False).encode()
    write_bytes(spec.output_uri, data, spec.storage_options)
    write_bytes(spec.report_uri, encoded, spec.storage_options)
    if reporter is not None:
        reporter.progress(len(rows), params.max_tasks)
        reporter.artifact("tasks.jsonl", spec.output_uri, size_bytes=len(data), meta={"rows": len(rows)})
        reporter.artifact("report.json", spec.report_uri, size_bytes=len(encoded))
    dropped = report["dropped"]
    say(
        f"kept {report['kept']} of {report['candidates']} candidates in {time.monotonic() - started:.1f}s "
        f"({report['stopped']}); dropped {dropped or 'none'}; {len(uris)} snapshots written"
    )
    result.report = report
    return result


def report_summary(report: Mapping[str, Any]) -> dict[str, Any]:
    """The counts of a report, small enough for the run's summary (the per-candidate list stays in report.json)."""
    return {
        "target": report["target"],
        "candidates": report["candidates"],
        "kept": report["kept"],
        "dropped": report["dropped"],
        "stopped": report["stopped"],
        "seconds": report["seconds"],
        "candidates_per_minute": report["candidates_per_minute"],
        "statistics": {k: v for k, v in report["statistics"].items() if k != "cursorbench"},
    }


def run(spec: CodegenSpec) -> dict[str, Any]:
    with reporter_for(spec) as reporter:
        result = generate(spec, reporter)
        summary = report_summary(result.report)
        reporter.summary(summary)
    return summary


def main() -> None:
    configure_logging()
    run(load_spec(CodegenSpec))


if __name__ == "__main__":
    main()
