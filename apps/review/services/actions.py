"""What a confirmed hack leads to, each recorded as a ReviewAction: a reward draft with the suggested penalty, the task
promoted to a benchmark as a regression case, the task excluded from future training."""

from __future__ import annotations

import json
from typing import Any

from django.db import transaction
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from apps.accounts.models import User
from apps.benchmarks.models import Benchmark, BenchmarkTask, BenchmarkVersion, TaskProvenance
from apps.benchmarks.services import benchmark_create, benchmark_version_create
from apps.common.validators import SLUG
from apps.datasets.models import Dataset, DatasetKind, DatasetVersion
from apps.review.models import (
    ActionKind,
    DraftStatus,
    Flag,
    Label,
    ReviewAction,
    RewardDraft,
    TaskExclusion,
)
from apps.rewards.services import reward_version_create
from workers.detectors.registry import suggest_penalty


def _require_confirmed(flag: Flag) -> None:
    if not flag.reviews.filter(label=Label.CONFIRMED).exists():
        raise ValidationError(
            {"flag": [f"flag {flag.pk} has no 'confirmed hack' label; label it confirmed before acting on it"]}
        )


def _flag_task_id(flag: Flag, task_id: str = "") -> str:
    if task_id:
        return task_id
    summary = flag.trajectory
    if summary is None or not summary.task_id:
        raise ValidationError(
            {
                "task_id": [
                    f"trajectory {flag.trajectory_ref!r} of run {flag.run_id} has no stored summary (deleted, or "
                    "never ingested), so its task is unknown; pass task_id"
                ]
            }
        )
    return summary.task_id


@transaction.atomic
def reward_draft_create(*, flag: Flag, created_by: User) -> RewardDraft:
    """Draft the run's reward config with the penalty suggested for the flag's detector, for an operator to
    accept or discard. Nothing changes in the reward config until then."""
    _require_confirmed(flag)
    base = flag.run.reward_version
    if base is None:
        raise ValidationError({"flag": [f"run {flag.run_id} has no reward config version to draft a change of"]})
    latest = base.config.versions.order_by("-number").first() or base
    proposed, reason = suggest_penalty(latest.spec, flag.detector)
    draft = RewardDraft.objects.create(
        flag=flag, base_version=latest, proposed_spec=proposed, reason=reason, created_by=created_by
    )
    ReviewAction.objects.create(
        kind=ActionKind.REWARD_DRAFT, flag=flag, actor=created_by, draft=draft, detail={"reason": reason}
    )
    return draft


@transaction.atomic
def reward_draft_accept(*, draft: RewardDraft, user: User, spec: Any = None) -> RewardDraft:
    """Make the draft (or `spec`, the operator's edit of it) the next version of its reward config."""
    draft = RewardDraft.objects.select_for_update().select_related("base_version__config").get(pk=draft.pk)
    if draft.status != DraftStatus.DRAFT:
        raise ValidationError({"draft": [f"draft {draft.pk} was already {draft.status}"]})
    version = reward_version_create(
        config=draft.base_version.config,
        spec=draft.proposed_spec if spec is None else spec,
        created_by=user,
        notes=f"from review of flag {draft.flag_id}: {draft.reason}",
    )
    draft.status, draft.result_version, draft.decided_by, draft.decided_at = (
        DraftStatus.ACCEPTED,
        version,
        user,
        timezone.now(),
    )
    draft.save(update_fields=["status", "result_version", "decided_by", "decided_at"])
    ReviewAction.objects.create(
        kind=ActionKind.DRAFT_ACCEPT, flag_id=draft.flag_id, actor=user, draft=draft, reward_version=version
    )
    return draft


@transaction.atomic
def reward_draft_discard(*, draft: RewardDraft, user: User) -> RewardDraft:
    draft = RewardDraft.objects.select_for_update().get(pk=draft.pk)
    if draft.status != DraftStatus.DRAFT:
        raise ValidationError({"draft": [f"draft {draft.pk} was already {draft.status}"]})
    draft.status, draft.decided_by, draft.decided_at = DraftStatus.DISCARDED, user, timezone.now()
    draft.save(update_fields=["status", "decided_by", "decided_at"])
    ReviewAction.objects.create(kind=ActionKind.DRAFT_DISCARD, flag_id=draft.flag_id, actor=user, draft=draft)
    return draft


def _task_row(dataset_version: DatasetVersion, task_id: str) -> dict[str, Any] | None:
    with dataset_version.file.open("rb") as handle:
        for line in handle:
            if task_id.encode() not in line:
                continue
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and str(row.get("id")) == task_id:
                return row
    return None


@transaction.atomic
def task_promote(*, flag: Flag, benchmark_name: str, user: User, task_id: str = "") -> Any:
    """Add the flagged trajectory's task to benchmark `benchmark_name` as a regression case: a new version with
    the task row appended (provenance "review"), or a new benchmark in the run's environment. Returns the
    benchmark version."""
    _require_confirmed(flag)
    task_id = _flag_task_id(flag, task_id)
    run = flag.run
    source = run.dataset_version
    if source is None or source.dataset.kind != DatasetKind.TASKS:
        raise ValidationError(
            {"flag": [f"run {run.pk} did not run on a tasks dataset, so task {task_id!r}'s row cannot be found"]}
        )
    row = _task_row(source, task_id)
    if row is None:
        raise ValidationError({"task_id": [f"{source} has no task with id {task_id!r}"]})
    config = run.spec.get("config") or {}
    benchmark = Benchmark.objects.filter(name=benchmark_name).first()
    previous: BenchmarkVersion | None = None
    if benchmark is None:
        if not SLUG.fullmatch(benchmark_name or ""):
            raise ValidationError({"benchmark": ["use 1-100 letters, digits, '-' or '_' (e.g. search-regressions)"]})
        benchmark = benchmark_create(
            name=benchmark_name,
            environment=str(config.get("environment") or "exact_answer"),
            owner=user,
            description="Regression cases promoted from reviewed reward hacks",
        )
    else:
        previous = benchmark.versions.order_by("-number").first()
    old_tasks = list(previous.tasks.order_by("id")) if previous is not None else []
    if any(task.task_id == task_id for task in old_tasks):
        raise ValidationError({"task_id": [f"task {task_id!r} is already in {previous}"]})
    corpus_pk = run.spec.get("corpus_version")
    version, _ = benchmark_version_create(
        benchmark=benchmark,
        tasks=[task.payload for task in old_tasks] + [row],
        created_by=user,
        env_params=previous.env_params if previous is not None else config.get("env_params") or {},
        provenance=TaskProvenance.REVIEW,
        source_ref=f"run {run.pk} trajectory {flag.trajectory_ref} (flag {flag.pk})",
        excluded_training_data=list(previous.excluded_training_data.all()) if previous is not None else [],
        notes=f"regression case {task_id} from the review of flag {flag.pk}",
        corpus_version=DatasetVersion.objects.filter(pk=corpus_pk).first() if corpus_pk else None,
    )
    # benchmark_version_create marks every row with one provenance: the rows carried over keep their own.
    carried = {task.task_id: task for task in old_tasks}
    rows = list(BenchmarkTask.objects.filter(version=version, task_id__in=list(carried)))
    for task in rows:
        task.provenance, task.source_ref = carried[task.task_id].provenance, carried[task.task_id].source_ref
    BenchmarkTask.objects.bulk_update(rows, ["provenance", "source_ref"], batch_size=2000)
    ReviewAction.objects.create(
        kind=ActionKind.BENCHMARK_PROMOTE,
        flag=flag,
        actor=user,
        benchmark_version=version,
        detail={"task_id": task_id, "benchmark": benchmark.name},
    )
    return version


@transaction.atomic
def task_exclude(
    *, flag: Flag, user: User, task_id: str = "", dataset: Dataset | None = None, reason: str = ""
) -> TaskExclusion:
    """Keep the flagged trajectory's task out of future training on `dataset` (default: the run's dataset)."""
    _require_confirmed(flag)
    task_id = _flag_task_id(flag, task_id)
    if dataset is None:
        if flag.run.dataset_version is None:
            raise ValidationError({"dataset": [f"run {flag.run_id} has no dataset; name the dataset to exclude from"]})
        dataset = flag.run.dataset_version.dataset
    existing = TaskExclusion.objects.filter(dataset=dataset, task_id=task_id).select_related("created_by").first()
    if existing is not None:
        raise ValidationError(
            {
                "task_id": [
                    f"task {task_id!r} is already excluded from {dataset} (by {existing.created_by} on "
                    f"{existing.created_at:%Y-%m-%d})"
                ]
            }
        )
    exclusion = TaskExclusion.objects.create(
        dataset=dataset, task_id=task_id, flag=flag, reason=reason or f"confirmed {flag.detector} hack", created_by=user
    )
    ReviewAction.objects.create(
        kind=ActionKind.TASK_EXCLUDE,
        flag=flag,
        actor=user,
        exclusion=exclusion,
        detail={"task_id": task_id, "dataset": dataset.name},
    )
    return exclusion
