"""Celery tasks: thin, take IDs, call a service, return in seconds (docs/architecture.md, "Celery is the glue").

The services queue these tasks and these tasks call the services: each module imports the other as a module and
reads its names at call time, so either can be imported first."""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import Task, shared_task
from django.utils import timezone

from apps.runs import health, kinds, ray_jobs, services, stall
from apps.runs.kinds import LifecyclePoint
from apps.runs.models import Run, RunStatus

log = logging.getLogger(__name__)

DISPATCH_RETRIES = 3


# soft_time_limit: every Ray call has its own deadline (ray_jobs); this is the backstop that frees the worker.
@shared_task(bind=True, max_retries=DISPATCH_RETRIES, acks_late=True, soft_time_limit=120)
def dispatch_run(self: Task, run_id: int) -> None:
    final = self.request.retries >= DISPATCH_RETRIES
    try:
        services.run_dispatch(run_id=run_id, final_attempt=final)
    except ray_jobs.RayUnavailable as exc:
        raise self.retry(exc=exc, countdown=2**self.request.retries)


@shared_task(bind=True, max_retries=5, acks_late=True)
def cancel_run(self: Task, run_id: int) -> None:
    """Stop the run's Ray job. If Ray is down, retry with backoff; beat's reconcile keeps re-sending it after that."""
    try:
        services.run_stop_ray_job(run_id=run_id)
    except ray_jobs.RayUnavailable as exc:
        raise self.retry(exc=exc, countdown=2**self.request.retries)


@shared_task(bind=True, max_retries=5, acks_late=True)
def run_lifecycle(self: Task, run_id: int, point: LifecyclePoint, steps: list[int]) -> list[str]:
    """The owning app's hook for a lifecycle point of a run (apps.runs.kinds), then one task per subscriber: the
    owner's work (e.g. an eval's metrics) is done before anyone reacts to it, and a failing subscriber retries
    alone."""
    try:
        names = services.run_owner_hook(run_id=run_id, point=point, steps=steps)
    except OSError as exc:  # storage briefly unreachable
        raise self.retry(exc=exc, countdown=2**self.request.retries)
    for name in names:
        run_subscriber.delay(run_id, point, name, steps)
    return names


@shared_task(bind=True, max_retries=5, acks_late=True)
def run_subscriber(self: Task, run_id: int, point: LifecyclePoint, name: str, steps: list[int]) -> None:
    try:
        services.run_subscriber_hook(run_id=run_id, point=point, name=name, steps=steps)
    except OSError as exc:
        raise self.retry(exc=exc, countdown=2**self.request.retries)


@shared_task(acks_late=True, soft_time_limit=60)
def admit_queued_runs() -> list[int]:
    """Start the queued runs that now fit (after a run ended, and on every beat: nodes come and go)."""
    return services.run_admit_queued()


@shared_task
def reconcile_runs() -> int:
    """Beat: reconcile every live run with Ray, re-dispatch pending runs whose dispatch was lost, and admit the
    queued runs that fit now."""
    live = list(
        Run.objects.filter(status__in=[RunStatus.PENDING, RunStatus.RUNNING])
        .exclude(kind__in=kinds.external_kinds())  # trained elsewhere: no Ray job to reconcile or dispatch
        .values_list("pk", "ray_job_id", "created_at")
    )
    stale = timezone.now() - timedelta(seconds=30)
    for run_id, ray_job_id, created_at in live:
        if ray_job_id:
            services.run_reconcile(run_id=run_id)
        elif created_at < stale:
            dispatch_run.delay(run_id)
    services.run_admit_queued()
    for run_id in stall.silent_runs():  # the stall watchdog: dumps are taken in their own task
        mark_stalled.delay(run_id)
    # The list's health column, computed here a few runs per tick rather than as tasks of their own: a backlog of
    # refreshes (every finished run after an upgrade) must never queue ahead of dispatches on the workers.
    for run_id in health.claim_runs_needing_health(limit=health.REFRESH_PER_TICK):
        try:
            health.health_refresh(run_id=run_id)
        except Exception:  # one run's panel must not stop the reconcile; it is retried when it changes again
            log.exception("health refresh of run %s failed", run_id)
    return len(live)


@shared_task(acks_late=True, soft_time_limit=300)
def mark_stalled(run_id: int) -> bool:
    """Mark a silent run stalled with the stack dumps of its processes (apps/runs/stall.py)."""
    return stall.run_mark_stalled(run_id=run_id).stalled_at is not None
