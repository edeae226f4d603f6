"""What every job entrypoint shares: its spec from the environment and its reporter (logging and the spool
folder are `workers.reporting`'s, storage is `workers.storage`)."""

from __future__ import annotations

import os
import threading
from typing import TypeVar

from workers.reporting import Reporter
from workers.specs import JobSpec
from workers.spool import replay_spools, spool_dir

SpecT = TypeVar("SpecT", bound="JobSpec")


def load_spec(model: type[SpecT]) -> SpecT:
    raw = os.environ.get("CRUCIBLE_JOB_SPEC")
    if not raw:
        raise SystemExit("CRUCIBLE_JOB_SPEC is not set: this module runs as a Ray job submitted by Crucible")
    return model.model_validate_json(raw)


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
