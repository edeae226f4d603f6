"""What every job entrypoint shares: its spec from the environment, its reporter, and its storage access."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any, TypeVar

import fsspec

from workers.detectors.base import Finding
from workers.jobs.specs import JobSpec
from workers.reporting import Reporter

SpecT = TypeVar("SpecT", bound="JobSpec")


def configure_logging() -> None:
    logging.basicConfig(level=logging.INFO)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per ingest request would drown the log


def load_spec(model: type[SpecT]) -> SpecT:
    raw = os.environ.get("CRUCIBLE_JOB_SPEC")
    if not raw:
        raise SystemExit("CRUCIBLE_JOB_SPEC is not set: this module runs as a Ray job submitted by Crucible")
    return model.model_validate_json(raw)


def reporter_for(spec: JobSpec) -> Reporter:
    token = os.environ.get("CRUCIBLE_INGEST_TOKEN", "")
    if not token:
        raise SystemExit("CRUCIBLE_INGEST_TOKEN is not set: the run's ingest token is handed over by Crucible")
    return Reporter(ingest_url=spec.ingest_url, token=token)


def read_bytes(uri: str, storage_options: dict[str, Any]) -> bytes:
    with fsspec.open(uri, "rb", **storage_options) as handle:
        data: bytes = handle.read()
    return data


def write_bytes(uri: str, data: bytes, storage_options: dict[str, Any]) -> None:
    fs, path = fsspec.core.url_to_fs(uri, **storage_options)
    parent = path.rsplit("/", 1)[0]
    if parent:
        fs.makedirs(parent, exist_ok=True)
    with fs.open(path, "wb") as handle:
        handle.write(data)


def report_flags(reporter: Reporter, findings: Iterable[Finding], *, step: int) -> int:
    """Send each trajectory finding as a `flag` event at `step`; returns how many were sent. Run-scope findings
    (no trajectory) are left out: a flag names a trajectory."""
    sent = 0
    for finding in findings:
        if finding.trajectory_id:
            reporter.flag(
                trajectory_id=finding.trajectory_id,
                detector=finding.detector,
                detector_version=finding.version,
                severity=finding.severity,
                evidence=finding.evidence,
                step=step,
            )
            sent += 1
    return sent
