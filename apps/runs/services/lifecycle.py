"""A run's one lifecycle, whatever its kind: dispatch to Ray, reconcile with Ray, cancel, finish, and the
hooks the owning app and its subscribers registered for the points after it (apps.runs.kinds)."""

from __future__ import annotations

import json
import logging
import re
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from apps.accounts.models import User
from apps.runs import kinds, ray_jobs, tasks
from apps.runs.kinds import LifecyclePoint
from apps.runs.live import publish_events
from apps.runs.models import TERMINAL_STATUSES, Run, RunStatus
from apps.runs.selectors import run_state
from apps.runs.services import queue
from apps.runs.services.create import worker_spec
from apps.runs.services.tokens import ingest_token_for

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 200
RAY_SILENCE_LIMIT = timedelta(seconds=60)
SUBMIT_CLAIM = timedelta(seconds=120)
"""How long a dispatcher's claim on a submission holds off the others (a submission's deadline is well under it)."""


def publish_status_on_commit(run: Run) -> None:
    state = run_state(run)
    transaction.on_commit(lambda: publish_events(run.pk, [], state))


def finish(run: Run, status: str, *, reason: str = "", log_tail: str | None = None) -> None:
    """Make a locked run terminal; the kind's success hooks follow the commit."""
    run.status = status
    run.finished_at = timezone.now()
    fields = ["status", "finished_at"]
    if reason:
        run.failure_reason = reason
        fields.append("failure_reason")
    if log_tail:
        run.log_tail = log_tail
        fields.append("log_tail")
    run.save(update_fields=fields)
    publish_status_on_commit(run)
    if run.resources:  # what it held (or the place it had in the queue) may let queued runs start
        transaction.on_commit(lambda: tasks.admit_queued_runs.delay())
    if status == RunStatus.SUCCEEDED and kinds.has_hooks(run.kind, "succeeded"):
        transaction.on_commit(lambda: tasks.run_lifecycle.delay(run.pk, "succeeded", []))


def run_admit_queued() -> list[int]:
    """One admission pass over the queue; the runs it admits are dispatched after the commit. Open pages hear of
    it only when something moved (beat runs a pass every reconcile)."""
    if not Run.objects.filter(status=RunStatus.QUEUED).exists():
        return []
    capacity = queue.cluster_capacity()
    with transaction.atomic():
        queue.lock()
        admitted, changed = queue.admit_in_order(capacity)
        # an admission moves every position behind it; otherwise only the runs whose reason changed are news
        news = Run.objects.filter(pk__in=admitted) | Run.objects.filter(
            status=RunStatus.QUEUED, **({} if admitted else {"pk__in": changed})
        )
        for run in news:
            publish_status_on_commit(run)
        queue.dispatch_after_commit(admitted)
    return admitted


def run_set_priority(*, run: Run, priority: int) -> Run:
    """A run's place in the queue: higher first. A queued run moves at once (an admission pass follows)."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)
        if run.is_terminal:
            raise ValidationError({"priority": [f"run {run.pk} is already {run.status}: priority no longer counts"]})
        run.priority = priority
        run.save(update_fields=["priority"])
        if run.status == RunStatus.QUEUED:
            publish_status_on_commit(run)
            transaction.on_commit(lambda: tasks.admit_queued_runs.delay())
    return run


def run_owner_hook(*, run_id: int, point: LifecyclePoint, steps: list[int]) -> list[str]:
    """Run the owning app's hook for `point` of the run; returns the names of the subscribers to run next (each in
    its own task). Nothing for a succeeded hook of a run that is not succeeded (a stale task)."""
    run = Run.objects.only("pk", "kind", "status").get(pk=run_id)
    if point == "succeeded" and run.status != RunStatus.SUCCEEDED:
        return []
    handler = kinds.handler_for(run.kind)
    if point == "succeeded" and handler.on_succeeded is not None:
        handler.on_succeeded(run_id=run.pk)
    elif point == "checkpoints" and handler.on_checkpoints is not None:
        handler.on_checkpoints(run_id=run.pk, steps=steps)
    return list(kinds.subscribers(run.kind, point))


def run_subscriber_hook(*, run_id: int, point: LifecyclePoint, name: str, steps: list[int]) -> None:
    run = Run.objects.only("pk", "kind").get(pk=run_id)
    hook = kinds.subscribers(run.kind, point).get(name)
    if hook is None:  # unsubscribed since the task was queued (a deploy in between)
        log.warning("no %s subscriber %r for %s runs any more; skipped for run %s", point, name, run.kind, run_id)
        return
    if point == "succeeded":
        hook(run_id=run.pk)
    else:
        hook(run_id=run.pk, steps=steps)


def run_dispatch(*, run_id: int, final_attempt: bool = True) -> Run:
    """Submit the run's Ray job (after the queue admits it). Safe to repeat and to run on several Celery workers at
    once: the first claims the submission under the row lock (`submitted_at`), the others leave it alone while the
    claim is fresh (SUBMIT_CLAIM), and the submission id is the run's, so Ray would launch it once anyway.

    The submission happens outside the row lock (it uploads the working directory and may take seconds); a cancel
    that lands meanwhile is honoured by stopping the job just submitted."""
    before = Run.objects.filter(pk=run_id).values("resources", "admitted_at", "kind").first()
    if before is not None and before["kind"] in kinds.external_kinds():  # trained elsewhere: nothing to submit
        return Run.objects.get(pk=run_id)
    queues = bool(before and before["resources"] and before["admitted_at"] is None)
    capacity = queue.cluster_capacity() if queues else None  # asked before any lock is taken
    with transaction.atomic():
        if queues:
            queue.lock()
        run = (
            Run.objects.select_for_update(of=("self",))
            .select_related("dataset_version__dataset", "reward_version")
            .get(pk=run_id)
        )
        if run.is_terminal or run.ray_job_id:
            return run
        if run.cancel_requested_at is not None:
            finish(run, RunStatus.STOPPED, reason="cancelled before it was submitted")
            return run
        if run.admitted_at is None and not queue.admit(run, capacity):
            publish_status_on_commit(run)  # queued: the page shows its position and what it waits for
            return run
        now = timezone.now()
        if run.submitted_at is not None and now - run.submitted_at < SUBMIT_CLAIM:
            return run  # another worker is submitting it this moment
        run.submitted_at = now
        run.save(update_fields=["submitted_at"])
        env = {"CRUCIBLE_JOB_SPEC": json.dumps(worker_spec(run)), "CRUCIBLE_INGEST_TOKEN": ingest_token_for(run)}
        if settings.EXTRA_ENVIRONMENTS:  # environments from the user's own code load in the job too
            env["CRUCIBLE_ENVIRONMENTS"] = settings.EXTRA_ENVIRONMENTS
        submission_id, module = run.submission_id, kinds.job_spec_for(run.kind).entrypoint
    try:
        job_id = ray_jobs.submit(submission_id=submission_id, module=module, env_vars=env)
    except ray_jobs.RayUnavailable as exc:
        if not final_attempt:
            Run.objects.filter(pk=run_id, ray_job_id="").update(submitted_at=None)  # the retry may claim it again
            raise
        with transaction.atomic():
            run = Run.objects.select_for_update().get(pk=run_id)
            if not run.is_terminal and not run.ray_job_id:
                finish(run, RunStatus.FAILED, reason=str(exc))
            return run
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        now = timezone.now()
        run.ray_job_id = job_id
        run.ray_address = settings.RAY_ADDRESS
        run.submitted_at = run.submitted_at or now
        run.ray_checked_at = now
        run.save(update_fields=["ray_job_id", "ray_address", "submitted_at", "ray_checked_at"])
        if run.cancel_requested_at is not None:
            _stop_on_commit(run)
        elif not run.is_terminal:
            publish_status_on_commit(run)
        return run


RAY_TO_STATUS = {
    "PENDING": RunStatus.PENDING,
    "RUNNING": RunStatus.RUNNING,
    "SUCCEEDED": RunStatus.SUCCEEDED,
    "FAILED": RunStatus.FAILED,
    "STOPPED": RunStatus.STOPPED,
}


def run_reconcile(*, run_id: int, now: datetime | None = None) -> Run:
    """Bring one run's row in line with its Ray job. A job Ray no longer knows, or a cluster silent for
    RAY_SILENCE_LIMIT, fails the run with that reason: no row stays running after its job is gone."""
    now = now or timezone.now()
    run = Run.objects.get(pk=run_id)
    if run.is_terminal or not run.ray_job_id:
        return run
    if run.cancel_requested_at is not None:
        # A cancel whose stop request was lost (Ray down at the time) is re-sent on every pass until Ray confirms.
        try:
            ray_jobs.stop(run.ray_job_id, run.ray_address or None)
        except ray_jobs.RayUnavailable:
            pass
    try:
        ray_state = ray_jobs.state(run.ray_job_id, run.ray_address or None)
    except ray_jobs.RayJobNotFound:
        status, reason = lost_job_outcome(
            run,
            f"its Ray job {run.ray_job_id} is not on the cluster at {run.ray_address or settings.RAY_ADDRESS} any "
            "more: the cluster was restarted or replaced while the run was running (a stopped launcher, a lost "
            "head node), and the job ended with it",
        )
        return _reconcile_apply(run_id, status, reason)
    except ray_jobs.RayUnavailable as exc:
        last = run.ray_checked_at or run.submitted_at or run.created_at
        if now - last > RAY_SILENCE_LIMIT:
            status, reason = lost_job_outcome(
                run, f"the Ray cluster at {run.ray_address} has not answered since {last:%H:%M:%S} ({exc})"
            )
            return _reconcile_apply(run_id, status, reason)
        return run
    status = RAY_TO_STATUS.get(ray_state.status, RunStatus.RUNNING)
    tail = None
    if status == RunStatus.FAILED:
        # The worker's own log lines stay; Ray's output (the traceback) follows them.
        ray_tail = ray_jobs.logs_tail(run.ray_job_id, run.ray_address or None)
        reported = run.log_tail.splitlines()[-(LOG_TAIL_LINES // 2) :]
        tail = "\n".join([*reported, "--- Ray job output ---", *ray_tail.splitlines()]) if ray_tail else None
    reason = explain_ray_failure(ray_state.message) if status == RunStatus.FAILED else ""
    return _reconcile_apply(run_id, status, reason, log_tail=tail, checked_at=now)


RESUME_HINT = "; resume it from its last checkpoint"


def lost_job_outcome(run: Run, cause: str) -> tuple[str, str]:
    """How a run whose job can no longer be asked ended: as the worker's own `end` event said, when it sent one
    (a run that reported success is never marked failed), otherwise failed, with `cause` as the reason."""
    if run.reported_outcome == RunStatus.SUCCEEDED:
        return RunStatus.SUCCEEDED, ""
    if run.reported_outcome == RunStatus.FAILED:
        return RunStatus.FAILED, f"the job failed: {run.reported_error or 'no error message'}"
    hint = RESUME_HINT if run.kind == "train" else ""
    return RunStatus.FAILED, cause + hint


_SIGNALS = {9: "SIGKILL", 15: "SIGTERM", 6: "SIGABRT", 11: "SIGSEGV"}


def explain_ray_failure(message: str) -> str:
    """Ray's failure message, with what an exit code means in words: a driver killed by a signal (-9: by a person,
    a supervisor, or the kernel's out-of-memory killer) reads differently from a job that raised."""

    match = re.search(r"exit code (-?\d+)", message or "")
    if not match:
        return message
    code = int(match.group(1))
    signum = -code if code < 0 else code - 128 if code > 128 else 0
    if signum == 9:
        return (
            f"{message} (the job's driver was killed with SIGKILL: by a person, a supervisor, or the kernel's "
            "out-of-memory killer when the node ran out of memory)"
        )
    if signum in _SIGNALS:
        return f"{message} (the job's driver was stopped by {_SIGNALS[signum]})"
    return message


@transaction.atomic
def _reconcile_apply(
    run_id: int, status: str, reason: str, *, log_tail: str | None = None, checked_at: datetime | None = None
) -> Run:
    run = Run.objects.select_for_update().get(pk=run_id)
    if run.is_terminal:
        return run
    if checked_at is not None:
        run.ray_checked_at = checked_at
        run.save(update_fields=["ray_checked_at"])
    if status in TERMINAL_STATUSES:
        finish(run, status, reason=reason, log_tail=log_tail)
    elif status != run.status:
        run.status = status
        fields = ["status"]
        if status == RunStatus.RUNNING and run.started_at is None:
            run.started_at = timezone.now()
            fields.append("started_at")
        run.save(update_fields=fields)
        publish_status_on_commit(run)
    return run


def run_cancel(*, run: Run, user: User) -> Run:
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)
        if run.is_terminal:
            raise ValidationError({"status": [f"run {run.pk} is already {run.status}; nothing to cancel"]})
        run.cancel_requested_at = timezone.now()
        run.save(update_fields=["cancel_requested_at"])
        if not run.ray_job_id:
            finish(run, RunStatus.STOPPED, reason=f"cancelled by {user.username} before it was submitted")
            return run
    _stop_on_commit(run)
    return run


def _stop_on_commit(run: Run) -> None:
    transaction.on_commit(lambda: tasks.cancel_run.delay(run.pk))


def run_stop_ray_job(*, run_id: int) -> None:
    run = Run.objects.get(pk=run_id)
    if run.ray_job_id:
        ray_jobs.stop(run.ray_job_id, run.ray_address or None)
    run_reconcile(run_id=run_id)


STACK_STOPPED = (
    "the launcher (make run) was stopped while the run was going, and the Ray head it had started stopped with it"
)


def runs_stopped_with_cluster(*, ray_address: str, cause: str = STACK_STOPPED) -> list[int]:
    """End every run still going on the Ray cluster at `ray_address`, which its launcher is stopping: with the
    worker's own outcome if it sent one, otherwise failed with `cause`. Returns the ids it ended."""
    ended = []
    for run_id in (
        Run.objects.filter(ray_address=ray_address).exclude(status__in=TERMINAL_STATUSES).values_list("pk", flat=True)
    ):
        run = Run.objects.get(pk=run_id)
        status, reason = lost_job_outcome(run, cause)
        if not _reconcile_apply(run_id, status, reason).is_terminal:
            continue
        ended.append(run_id)
    return ended
