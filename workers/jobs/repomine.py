"""Ray job: mine repository tasks from a git history (`workers.coding.mining`), then verify and store them as an
import does (`workers.jobs.repoimport`), in one run.

The source is a path on the cluster (used in place), a URL git can clone, or the storage URI of an uploaded git
bundle (each cloned bare into a scratch folder). The mined instances and the repository's bundle become an import
bundle (`tasks.jsonl` + `repos/<owner>__<name>.bundle`), which the import reads, verifies in the sandbox and writes
(its report gains `mining`: commits read, candidates, kept and dropped by reason). Progress: candidates mined, then
tasks verified.
"""

from __future__ import annotations

import io
import json
import subprocess
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from workers.coding.execute import CommandLimits
from workers.coding.mining import bundle_bytes, mine
from workers.coding.swebench import bundle_path
from workers.jobs.common import load_spec, reporter_for
from workers.jobs.repoimport import import_tasks
from workers.reporting import Reporter, configure_logging
from workers.specs import RepoImportSpec, RepoMineSpec
from workers.storage import read_bytes, write_bytes

CLONE_TIMEOUT_SECONDS = 900


def local_repository(spec: RepoMineSpec, scratch: Path) -> Path:
    """A git directory holding the source's history (module docstring)."""
    source = spec.source
    if Path(source).is_dir():
        return Path(source)
    target = scratch / "repo.git"
    if "://" in source and not source.startswith(("http://", "https://", "git://", "ssh://")):
        bundle = scratch / "source.bundle"  # an uploaded bundle in object storage
        bundle.write_bytes(read_bytes(source, spec.storage_options))
        source = str(bundle)
    done = subprocess.run(
        ["git", "clone", "--quiet", "--bare", source, str(target)],
        capture_output=True,
        text=True,
        timeout=CLONE_TIMEOUT_SECONDS,
        check=False,
    )
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise SystemExit(f"cannot clone {spec.source}: {lines[-1] if lines else 'git clone failed'}")
    return target


def mine_and_import(spec: RepoMineSpec, reporter: Reporter | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="crucible-repomine-") as tmp:
        scratch = Path(tmp)
        repository = local_repository(spec, scratch)
        limits = CommandLimits(wall_seconds=spec.test_timeout_seconds, cpu_seconds=int(spec.test_timeout_seconds))

        def progress(done: int, total: int, kept: int) -> None:
            if reporter is not None:
                reporter.progress(done, total)
                reporter.metric(done, {"mined": float(kept)})

        mined = mine(repository, spec.params(), repo=spec.repo, limits=limits, progress=progress)
        if reporter is not None:
            reporter.log(
                f"mined {mined.report['kept']} task(s) from {mined.report['candidates']} candidate commit(s); "
                f"dropped {json.dumps({k: v for k, v in mined.report['dropped'].items() if v})}"
            )
        if not mined.instances:
            report = {"kind": "mine", "tasks": 0, "kept": 0, "refused": [], "mining": mined.report}
            write_bytes(spec.output_uri, b"", spec.storage_options)
            write_bytes(spec.report_uri, json.dumps(report, indent=2).encode(), spec.storage_options)
            return report
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("tasks.jsonl", "".join(json.dumps(row) + "\n" for row in mined.instances))
            archive.writestr(bundle_path(spec.repo), bundle_bytes(repository))
        upload = scratch / "upload.zip"
        upload.write_bytes(buffer.getvalue())
        imported = RepoImportSpec(
            run_id=spec.run_id,
            kind="repoimport",
            ingest_url=spec.ingest_url,
            storage_options=spec.storage_options,
            upload_uri=f"file://{upload}",
            output_uri=spec.output_uri,
            report_uri=spec.report_uri,
            snapshot_root=spec.snapshot_root,
            keep_valid=True,
            workers=spec.workers,
            test_timeout_seconds=spec.test_timeout_seconds,
        )
        report = {**import_tasks(imported, reporter), "kind": "mine", "mining": mined.report}
        write_bytes(spec.report_uri, json.dumps(report, indent=2, ensure_ascii=False).encode(), spec.storage_options)
        return report


def run(spec: RepoMineSpec) -> dict[str, Any]:
    with reporter_for(spec) as reporter:
        report = mine_and_import(spec, reporter)
        summary = {
            "tasks": report["tasks"],
            "kept": report["kept"],
            "refused": len(report["refused"]),
            "mined_from": report["mining"]["candidates"],
        }
        reporter.summary(summary)
    return summary


def main() -> None:
    configure_logging()
    run(load_spec(RepoMineSpec))


if __name__ == "__main__":
    main()
