"""Writes for runs, one module per seam: `create` (the one `run_create`), `lifecycle` (dispatch, reconcile,
cancel, hooks), `ingest` (worker events), `metrics` (points and roll-ups), `tokens` (the per-run ingest token).
The names below are the app's public service API."""

from apps.runs.services.create import job_envelope, job_problems, run_create, worker_spec
from apps.runs.services.ingest import (
    IngestContext,
    IngestResult,
    RunEnded,
    ingest_batch,
    register_event_store,
)
from apps.runs.services.lifecycle import (
    publish_status_on_commit,
    run_admit_queued,
    run_cancel,
    run_dispatch,
    run_owner_hook,
    run_reconcile,
    run_set_priority,
    run_stop_ray_job,
    run_subscriber_hook,
)
from apps.runs.services.metrics import metric_rollups_rebuild, metric_series_replace
from apps.runs.services.tokens import ingest_token_for, ingest_token_valid

__all__ = [
    "IngestContext",
    "IngestResult",
    "RunEnded",
    "ingest_batch",
    "ingest_token_for",
    "ingest_token_valid",
    "job_envelope",
    "job_problems",
    "metric_rollups_rebuild",
    "metric_series_replace",
    "publish_status_on_commit",
    "register_event_store",
    "run_admit_queued",
    "run_cancel",
    "run_create",
    "run_dispatch",
    "run_owner_hook",
    "run_reconcile",
    "run_set_priority",
    "run_stop_ray_job",
    "run_subscriber_hook",
    "worker_spec",
]
