"""The one way a run row is made, and the JSON its Ray job receives."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from typing import Any

from django.conf import settings
from django.db import transaction
from pydantic import ValidationError as PydanticError
from rest_framework.exceptions import ValidationError

from apps.accounts.models import User
from apps.common.errors import pydantic_problems
from apps.datasets.models import DatasetVersion
from apps.rewards.models import RewardConfigVersion
from apps.runs import kinds, tasks
from apps.runs.models import Run
from apps.runs.services import queue
from apps.runs.storage import worker_storage_options
from workers.specs import JobSpec

JobInput = dict[str, Any]


def job_envelope(run: Run) -> dict[str, Any]:
    """What every job gets besides its kind's own input (`workers.specs.JobSpec`)."""
    ingest_url = f"{settings.CRUCIBLE_PUBLIC_URL.rstrip('/')}/api/v1/runs/{run.pk}/ingest/"
    return {"run_id": run.pk, "kind": run.kind, "ingest_url": ingest_url, "storage_options": worker_storage_options()}


def worker_spec(run: Run) -> dict[str, Any]:
    """The self-contained JSON a Ray job receives: everything it needs, no database access."""
    job = run.spec.get("job")
    if job is None:  # a row made before the job input was stored with it
        builder = kinds.handler_for(run.kind).job_from_row
        if builder is None:
            raise ValueError(f"run {run.pk} ({run.kind}) has no job input in its spec")
        job = builder(run)
    return {**job_envelope(run), **job}


def parse_job(run: Run, job: JobInput) -> tuple[JobSpec | None, dict[str, list[str]]]:
    """The worker's own job spec parsed from `job`, or what it refuses (as `job.<field>` paths)."""
    spec_cls = kinds.job_spec_for(run.kind)
    try:
        return spec_cls.model_validate({**job_envelope(run), **job}), {}
    except PydanticError as exc:
        return None, pydantic_problems(exc, "job")


def job_problems(run: Run, job: JobInput) -> dict[str, list[str]]:
    """What the worker's own job spec refuses in `job` (as `job.<field>` paths); {} when it would start."""
    return parse_job(run, job)[1]


def run_create(
    *,
    kind: str,
    created_by: User,
    name: str,
    job: JobInput | Callable[[Run], JobInput],
    spec: dict[str, Any] | None = None,
    dataset_version: DatasetVersion | None = None,
    reward_version: RewardConfigVersion | None = None,
    parent: Run | None = None,
    tags: Sequence[str] = (),
    progress_total: int = 0,
    progress_done: int = 0,
) -> Run:
    """Create a run of `kind` and dispatch it to Ray once the transaction commits.

    `job` is the worker's input (or a function of the new row, for inputs that name the run's own storage
    folder); it is stored as `spec["job"]` beside the caller's `spec` and checked against the kind's job spec now,
    so a mis-built job is a 400 naming the field (`job.config.steps`) and leaves no row, not a failure on the
    cluster. What the job will ask the cluster for (`JobSpec.resource_plan`) is stored with the run; a run the
    cluster or its owner's GPU quota can never hold is a 400 naming the resource (apps.runs.services.queue)."""
    handler = kinds.handler_for(kind)
    with transaction.atomic():
        run = Run.objects.create(
            kind=handler.kind,
            name=name[:200],
            spec=dict(spec or {}),
            dataset_version=dataset_version,
            reward_version=reward_version,
            parent=parent,
            tags=list(tags),
            ingest_nonce=secrets.token_hex(16),
            created_by=created_by,
            progress_total=progress_total,
            progress_done=progress_done,
        )
        job_input = job(run) if callable(job) else dict(job)
        parsed, problems = parse_job(run, job_input)
        if parsed is None:
            raise ValidationError(problems)
        need = queue.need_of(parsed.resource_plan())
        problem = queue.refusal(need, created_by)
        if problem:
            raise ValidationError({kinds.job_spec_for(kind).resources_field or "resources": [problem]})
        run.spec, run.resources = {**run.spec, "job": job_input}, need
        run.save(update_fields=["spec", "resources"])
        transaction.on_commit(lambda: tasks.dispatch_run.delay(run.pk))
    return run
