"""Import repository tasks (`python -m workers.jobs.repoimport`): every task checked in the sandbox before it is kept.

Reads the upload (`workers.coding.bundle`: JSONL with inline repositories, or a zip/tar.gz bundle), and for each
task runs `workers.coding.verify.verify_task`: its hidden tests must fail on the snapshot and pass with the
reference patch. A task without a reference patch is refused unless it says `"unverified": true`; then it is kept,
its row marked `"unverified": true`, and the report counts it (`unverified`). A kept task's snapshot is written to
`<snapshot_root>/<sha256>.tar.gz` (content-addressed, so writing it again is harmless and two tasks on one
repository share it) and its row, naming the snapshot, goes to `output_uri`; the report (`report_uri`) lists every
task kept or refused with the reason. The control plane's success hook (`apps.coding.services.repo_tasks_finalize`)
turns the rows into a dataset version, or, when a task was refused and the run did not ask to keep the valid ones,
stores nothing: an upload is imported whole or not at all.

Tasks are verified `workers` at a time in threads: each verification is two sandboxed test runs, separate
processes, so threads are enough to keep the cores busy.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from workers.coding.archive import pack
from workers.coding.bundle import BundleError, ImportedTask, parse_upload
from workers.coding.execute import CommandLimits
from workers.coding.stats import suite_statistics
from workers.coding.verify import Verification, verify_task
from workers.coding.workspace import Snapshot
from workers.jobs.common import load_spec, reporter_for
from workers.reporting import Reporter, configure_logging
from workers.specs import RepoImportSpec
from workers.storage import read_bytes, write_bytes

log = logging.getLogger("crucible.repoimport")


def snapshot_uri(root: str, sha256: str) -> str:
    return f"{root.rstrip('/')}/{sha256}.tar.gz"


def _verify(item: ImportedTask, limits: CommandLimits) -> Verification:
    return verify_task(item.task, Snapshot.from_files(item.files), limits=limits)


def import_tasks(
    spec: RepoImportSpec, reporter: Reporter | None = None, *, echo: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Verify, write the kept snapshots and rows, write the report; returns the report. Each progress line goes to
    `echo` when given (manage.py import_repo_tasks prints it), else to this module's logger, and to the reporter."""
    # One function on purpose: a job's wiring: verify, write the snapshots, write the rows and the report, each step
    # reporting progress.
    started = time.monotonic()

    def say(line: str) -> None:
        if echo is not None:
            echo(line)
        else:
            log.info(line)
        if reporter is not None:
            reporter.log(line)

    try:
        items = parse_upload(read_bytes(spec.upload_uri, spec.storage_options))
    except BundleError as exc:
        report = {"kind": "import", "tasks": 0, "kept": 0, "refused": [], "problems": exc.problems}
        write_bytes(spec.report_uri, json.dumps(report, indent=2).encode(), spec.storage_options)
        raise SystemExit(f"the upload cannot be imported: {exc}") from None
    say(f"{len(items)} task(s) in the upload; verifying each in the sandbox, {spec.workers} at a time")
    limits = CommandLimits(wall_seconds=spec.test_timeout_seconds, cpu_seconds=int(spec.test_timeout_seconds))
    kept: list[dict[str, Any]] = []
    refused: list[dict[str, Any]] = []
    unverified = 0
    done = 0
    if reporter is not None:
        reporter.progress(0, len(items))
    with ThreadPoolExecutor(max_workers=spec.workers) as pool:
        for item, verification in zip(items, pool.map(lambda i: _verify(i, limits), items), strict=True):
            done += 1
            if verification.ok:
                uri = snapshot_uri(spec.snapshot_root, item.task.snapshot.sha256)
                write_bytes(uri, pack(item.files), spec.storage_options)
                task = item.task.model_copy(update={"snapshot": item.task.snapshot.model_copy(update={"uri": uri})})
                kept.append(task.to_row())
                if verification.verified:
                    say(f"kept {item.task.id} (line {item.row})")
                else:
                    unverified += 1
                    say(f"kept {item.task.id} (line {item.row}) marked unverified: it has no reference patch")
            else:
                refused.append({"row": item.row, "id": item.task.id, "reason": verification.reason})
                say(f"refused {item.task.id} (line {item.row}): {verification.reason}")
            if reporter is not None:
                reporter.progress(done, len(items))
                reporter.metric(done, {"kept": float(len(kept)), "refused": float(len(refused))})
    rows = "".join(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n" for row in kept).encode()
    report = {
        "kind": "import",
        "tasks": len(items),
        "kept": len(kept),
        "unverified": unverified,
        "refused": refused,
        "keep_valid": spec.keep_valid,
        "statistics": suite_statistics(kept),
        "seconds": round(time.monotonic() - started, 2),
    }
    write_bytes(spec.output_uri, rows, spec.storage_options)
    write_bytes(spec.report_uri, json.dumps(report, indent=2, ensure_ascii=False).encode(), spec.storage_options)
    if reporter is not None:
        reporter.artifact("tasks.jsonl", spec.output_uri, size_bytes=len(rows), meta={"rows": len(kept)})
        reporter.artifact("report.json", spec.report_uri)
    marked = f" ({unverified} unverified)" if unverified else ""
    say(f"kept {len(kept)} of {len(items)} task(s){marked}, refused {len(refused)}, in {report['seconds']} s")
    return report


def run(spec: RepoImportSpec) -> dict[str, Any]:
    with reporter_for(spec) as reporter:
        report = import_tasks(spec, reporter)
        summary = {"tasks": report["tasks"], "kept": report["kept"], "refused": len(report["refused"])}
        reporter.summary(summary)
    return summary


def main() -> None:
    configure_logging()
    run(load_spec(RepoImportSpec))


if __name__ == "__main__":
    main()
