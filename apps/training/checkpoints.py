"""Which checkpoint a resume continues from: the latest one in the run's lineage, registered or only in storage.

A training job writes each checkpoint to `runs/<id>/checkpoints/step-NNNNNN.pt` (a sharded one, from a learner
of several ranks, to the folder `step-NNNNNN.dcp/`), then its checksum beside it (`workers.storage`), then
reports it. When the report is lost (the control plane was down as
the job died), the file is still there: `recover_checkpoints` registers every checkpoint whose bytes match their
checksum and whose checksum names this run (`workers.storage.run_key`), so a resume finds it. A file
without a checksum, or whose bytes do not match, was cut short and is never used; one with another run's key was
left by an earlier database whose run had the same id.
"""

from __future__ import annotations

import json
import logging
import re

from django.core.files.storage import default_storage

from apps.runs.models import Checkpoint, Run, RunKind
from apps.runs.services import ingest_token_for
from apps.runs.storage import storage_uri
from workers.storage import CHECKSUM_SUFFIX, run_key, stream_digest

log = logging.getLogger(__name__)

CHECKPOINT_NAME = re.compile(r"^step-(\d{6,})\.pt$")
SHARDED_CHECKSUM_NAME = re.compile(r"^step-(\d{6,})\.dcp\.sha256$")
"""A sharded checkpoint is a folder (`step-NNNNNN.dcp/`); its checksum file beside it lists every file in it."""


def _file_digest(name: str) -> tuple[str, int]:
    with default_storage.open(name, "rb") as handle:
        return stream_digest(handle)


def _verified(name: str, key: str) -> bool:
    """Whether the checkpoint `name` (a file, or a sharded checkpoint's folder) matches its checksum file, every
    file of it, and the checksum names this run."""
    try:
        with default_storage.open(name + CHECKSUM_SUFFIX, "rb") as handle:
            expected = json.loads(handle.read())
        if "files" in expected:  # sharded: each file listed, none missing or cut short
            files = expected["files"]
            whole = bool(files) and all(
                _file_digest(f"{name}/{path}") == (meta.get("sha256"), meta.get("bytes"))
                for path, meta in files.items()
            )
        else:
            whole = _file_digest(name) == (expected.get("sha256"), expected.get("bytes"))
    except (OSError, ValueError, AttributeError) as exc:
        log.info("checkpoint %s not usable: %s", name, exc)
        return False
    return bool(whole and expected.get("run_key") == key)


def recover_checkpoints(run: Run) -> list[Checkpoint]:
    """Register the run's checkpoints that are whole in storage but were never reported; returns the new rows."""
    folder = f"runs/{run.pk}/checkpoints"
    try:
        _, files = default_storage.listdir(folder)
    except (OSError, NotImplementedError):
        return []
    known = set(run.checkpoints.values_list("step", flat=True))
    key = run_key(ingest_token_for(run))
    recovered = []
    for filename in sorted(files):
        sharded = SHARDED_CHECKSUM_NAME.match(filename)
        match = sharded or CHECKPOINT_NAME.match(filename)
        if not match or int(match.group(1)) in known:
            continue
        name = f"{folder}/{filename.removesuffix(CHECKSUM_SUFFIX) if sharded else filename}"
        if not _verified(name, key):
            continue
        checkpoint, created = Checkpoint.objects.get_or_create(
            run=run,
            step=int(match.group(1)),
            defaults={"uri": storage_uri(name), "metrics": {}},
        )
        if created:
            log.warning("run %s: checkpoint %s was in storage but never reported; registered", run.pk, name)
            recovered.append(checkpoint)
    return recovered


def lineage(run: Run) -> list[Run]:
    """The run, its parent, its parent's parent... (training runs only; stops at a cycle, which cannot happen)."""
    chain: list[Run] = []
    seen: set[int] = set()
    current: Run | None = run
    while current is not None and current.pk not in seen and current.kind == RunKind.TRAIN:
        chain.append(current)
        seen.add(current.pk)
        current = current.parent
    return chain


def latest_in_lineage(run: Run) -> Checkpoint | None:
    """The checkpoint with the highest step across the run's lineage (the nearest run wins a tie): a resumed run
    that died before its first checkpoint resumes from what its parent left, not from nothing."""
    best: Checkpoint | None = None
    for ancestor in lineage(run):
        recover_checkpoints(ancestor)
        latest = ancestor.checkpoints.order_by("-step").first()
        if latest is not None and (best is None or latest.step > best.step):
            best = latest
    return best
