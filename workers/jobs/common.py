"""What every job entrypoint shares: its spec from the environment, its reporter, and its storage access."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

import fsspec

from workers.detectors.base import Finding
from workers.jobs.specs import JobSpec
from workers.reporting import Reporter, replay_spools
from workers.rl.checkpoints import SHARDED_SUFFIX

SpecT = TypeVar("SpecT", bound="JobSpec")


def configure_logging() -> None:
    logging.basicConfig(level=logging.INFO)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per ingest request would drown the log


def load_spec(model: type[SpecT]) -> SpecT:
    raw = os.environ.get("CRUCIBLE_JOB_SPEC")
    if not raw:
        raise SystemExit("CRUCIBLE_JOB_SPEC is not set: this module runs as a Ray job submitted by Crucible")
    return model.model_validate_json(raw)


def spool_dir() -> Path:
    """Where reporters on this node spool unacknowledged events (CRUCIBLE_SPOOL_DIR; ~/.crucible/spool)."""
    configured = os.environ.get("CRUCIBLE_SPOOL_DIR")
    return Path(configured) if configured else Path.home() / ".crucible" / "spool"


def reporter_for(spec: JobSpec) -> Reporter:
    """The job's reporter, spooling to this node's spool dir. First, in the background, it replays what jobs
    killed on this node left unsent (their runs get their missing events, marked late if they have ended)."""
    token = os.environ.get("CRUCIBLE_INGEST_TOKEN", "")
    if not token:
        raise SystemExit("CRUCIBLE_INGEST_TOKEN is not set: the run's ingest token is handed over by Crucible")
    directory = spool_dir()
    threading.Thread(target=replay_spools, args=(directory,), name="crucible-spool-replay", daemon=True).start()
    outage = float(os.environ.get("CRUCIBLE_INGEST_OUTAGE_SECONDS", "900"))
    return Reporter(ingest_url=spec.ingest_url, token=token, spool_dir=directory, outage_seconds=outage)


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


CHECKSUM_SUFFIX = ".sha256"


def run_key(ingest_token: str) -> str:
    """Names the run a file in storage belongs to without storing its secret: a hash of its ingest token, which
    the control plane can compute too. A storage folder left from an earlier database (run ids start again at 1)
    never passes for this run's."""
    return hashlib.sha256(b"crucible-run-key:" + ingest_token.encode()).hexdigest()[:32]


def write_checkpoint(uri: str, blob: bytes, storage_options: dict[str, Any]) -> str:
    """Write a checkpoint, then its checksum beside it (`<uri>.sha256`: JSON with sha256, bytes and the run's key).
    The checksum goes last, so a checkpoint with a matching checksum was written whole: the control plane can
    resume from it even when the event that announced it never arrived. Returns the sha256."""
    digest = hashlib.sha256(blob).hexdigest()
    meta = {"sha256": digest, "bytes": len(blob), "run_key": run_key(os.environ.get("CRUCIBLE_INGEST_TOKEN", ""))}
    write_bytes(uri, blob, storage_options)
    write_bytes(uri + CHECKSUM_SUFFIX, json.dumps(meta).encode(), storage_options)
    return digest


SHARDED_CHECKPOINT_SUFFIX = SHARDED_SUFFIX
"""A sharded checkpoint (`torch.distributed.checkpoint`, learner strategy ddp or fsdp2) is a directory
`step-NNNNNN.dcp/`; its checksum file `step-NNNNNN.dcp.sha256` lists every file in it."""


def is_sharded_checkpoint(uri: str) -> bool:
    return uri.rstrip("/").endswith(SHARDED_CHECKPOINT_SUFFIX)


def stream_digest(handle: Any) -> tuple[str, int]:
    """(sha256 hex, bytes) of what an open binary file yields, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    size = 0
    for chunk in iter(lambda: handle.read(1 << 20), b""):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def sharded_manifest(uri: str, storage_options: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{relative path: {sha256, bytes}} of every file under a sharded checkpoint's directory."""
    fs, root = fsspec.core.url_to_fs(uri, **storage_options)
    root = root.rstrip("/")
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(fs.find(root)):
        with fs.open(path, "rb") as handle:
            digest, size = stream_digest(handle)
        files[path[len(root) + 1 :]] = {"sha256": digest, "bytes": size}
    return files


def write_sharded_checksum(uri: str, storage_options: dict[str, Any]) -> int:
    """After every rank has written its shards: `<uri>.sha256` with each file's checksum and the run's key (the
    one-file checkpoint's rule: a checkpoint whose checksum file matches was written whole). Returns the bytes."""
    files = sharded_manifest(uri, storage_options)
    meta = {"files": files, "run_key": run_key(os.environ.get("CRUCIBLE_INGEST_TOKEN", ""))}
    write_bytes(uri.rstrip("/") + CHECKSUM_SUFFIX, json.dumps(meta).encode(), storage_options)
    return sum(int(f["bytes"]) for f in files.values())


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
