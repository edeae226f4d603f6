"""Object storage as every job and worker reads and writes it (fsspec: local paths, file://, s3://, memory://),
and the checkpoint files' checksums, which the control plane checks before it resumes from one."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import fsspec

STORAGE_OPTIONS: dict[str, Any] = {}
"""The job's fsspec options for object storage (credentials, endpoint), which the environments use to load what
they read themselves (search its index, coding_agent its repository snapshots). A job sets them once, with
`workers.envs.registry.configure_storage`; a sub-agent worker with its job's options."""

SHARDED_SUFFIX = ".dcp"
"""A sharded checkpoint (`torch.distributed.checkpoint`, learner strategy ddp or fsdp2) is a directory
`step-NNNNNN.dcp/`; its checksum file `step-NNNNNN.dcp.sha256` lists every file in it."""


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


def is_sharded_checkpoint(uri: str) -> bool:
    return uri.rstrip("/").endswith(SHARDED_SUFFIX)


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
