"""Writes of the review app: labels, queues and their locks, and what a confirmed hack leads to (a reward draft,
a regression case in a benchmark, a task excluded from training)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from apps.accounts.models import User
from apps.benchmarks.models import Benchmark, BenchmarkTask, BenchmarkVersion, TaskProvenance
from apps.benchmarks.services import benchmark_create, benchmark_version_create
from apps.common.validators import SLUG
from apps.datasets.models import Dataset, DatasetKind, DatasetVersion
from apps.review.models import (
    SEVERITY_PRIORITY,
    ActionKind,
    DraftStatus,
    Flag,
    ItemStatus,
    Label,
    QueueItem,
    Review,
    ReviewAction,
    ReviewQueue,
    RewardDraft,
    Severity,
    TaskExclusion,
)
from apps.rewards.services import reward_version_create
from apps.runs.models import Run
from workers.detectors.registry import detectors, suggest_penalty

MIN_LOCK_TIMEOUT_S = 10


def review_submit(*, flag: Flag, reviewer: User, label: str, note: str = "") -> Review:
    if label not in Label.values:
        raise ValidationError({"label": [f"unknown label {label!r}; choose one of {Label.values}"]})
    try:
        with transaction.atomic():
            return Review.objects.create(flag=flag, reviewer=reviewer, label=label, note=note)
    except IntegrityError:
        raise ValidationError({"flag": [f"you already reviewed flag {flag.pk}; each reviewer labels a flag once"]})


# --- queues ---------------------------------------------------------------------------------------------------


def _queue_flags(queue: ReviewQueue) -> Any:
    flags = Flag.objects.all()
    if queue.run_id is not None:
        flags = flags.filter(run_id=queue.run_id)
    if queue.detector:
        flags = flags.filter(detector=queue.detector)
    if queue.min_severity:
        floor = SEVERITY_PRIORITY[Severity(queue.min_severity)]
        flags = flags.filter(severity__in=[s for s, rank in SEVERITY_PRIORITY.items() if rank >= floor])
    return flags


@transaction.atomic
def queue_create(
    *,
    name: str,
    created_by: User,
    run_id: int | None = None,
    detector: str = "",
    min_severity: str = "",
    required_reviews: int = 1,
    lock_timeout_s: int = 900,
    description: str = "",
) -> ReviewQueue:
    """A queue, filled at once with the flags that match it."""
    problems: dict[str, list[str]] = {}
    if not SLUG.fullmatch(name or ""):
        problems["name"] = ["use 1-100 letters, digits, '-' or '_' (e.g. run-12-high)"]
    elif ReviewQueue.objects.filter(name=name).exists():
        problems["name"] = [f"a queue named {name!r} exists; pick another name"]
    if run_id is not None and not Run.objects.filter(pk=run_id).exists():
        problems["run"] = [f"there is no run {run_id}"]
    if detector and detector not in detectors():
        problems["detector"] = [f"unknown detector {detector!r}; choose one of {', '.join(detectors())}"]
    if min_severity and min_severity not in Severity.values:
        problems["min_severity"] = [f"choose one of {', '.join(Severity.values)}, or leave it blank for any"]
    if not isinstance(required_reviews, int) or required_reviews < 1:
        problems["required_reviews"] = ["an item needs at least 1 review"]
    if not isinstance(lock_timeout_s, int) or lock_timeout_s < MIN_LOCK_TIMEOUT_S:
        problems["lock_timeout_s"] = [f"a lock lasts at least {MIN_LOCK_TIMEOUT_S} seconds"]
    if problems:
        raise ValidationError(problems)
    queue = ReviewQueue.objects.create(
        name=name,
        description=description,
        run_id=run_id,
        detector=detector,
        min_severity=min_severity,
        required_reviews=required_reviews,
        lock_timeout_s=lock_timeout_s,
        created_by=created_by,
    )
    queue_sync(queue=queue)
    return queue


@transaction.atomic
def queue_sync(*, queue: ReviewQueue) -> int:
    """Add the matching flags not yet queued, one item per trajectory (its most severe flag); returns how many
    items were added. Safe to run concurrently: the (queue, run, trajectory) constraint drops repeats."""
    queued = QueueItem.objects.filter(queue=queue, run_id=OuterRef("run_id"), trajectory_ref=OuterRef("trajectory_ref"))
    flags = (
        _queue_flags(queue)
        .filter(~Exists(queued))
        .only("id", "run_id", "trajectory_ref", "severity")
        .order_by("run_id", "trajectory_ref", "id")
    )
    best: dict[tuple[int, str], Flag] = {}
    for flag in flags.iterator(chunk_size=2000):
        key = (flag.run_id, flag.trajectory_ref)
        kept = best.get(key)
        if kept is None or SEVERITY_PRIORITY[Severity(flag.severity)] > SEVERITY_PRIORITY[Severity(kept.severity)]:
            best[key] = flag
    before = QueueItem.objects.filter(queue=queue).count()
    QueueItem.objects.bulk_create(
        [
            QueueItem(
                queue=queue,
                flag_id=flag.pk,
                run_id=flag.run_id,
                trajectory_ref=flag.trajectory_ref,
                priority=SEVERITY_PRIORITY[Severity(flag.severity)],
            )
            for flag in best.values()
        ],
        ignore_conflicts=True,
        batch_size=2000,
    )
    queue.synced_at = timezone.now()
    queue.save(update_fields=["synced_at"])
    return QueueItem.objects.filter(queue=queue).count() - before


def queue_sync_all() -> int:
    return sum(queue_sync(queue=queue) for queue in ReviewQueue.objects.all())


@transaction.atomic
def queue_next(*, queue: ReviewQueue, reviewer: User, skip: QueueItem | None = None) -> QueueItem | None:
    """Claim the next open item of `queue` that `reviewer` has not reviewed and lock it for the queue's timeout;
    None when nothing is left for them. An item the reviewer already holds comes back first; an item whose lock
    expired is taken over. `skip` (an item the reviewer passes on) is released and not offered this time.

    Two reviewers asking at once never get the same item: rows locked by a concurrent claim are skipped
    (`SKIP LOCKED`) rather than waited for."""
    now = timezone.now()
    if skip is not None:
        QueueItem.objects.filter(pk=skip.pk, locked_by=reviewer).update(locked_by=None, locked_until=None)
    reviewed = Review.objects.filter(flag_id=OuterRef("flag_id"), reviewer=reviewer)
    candidates = (
        QueueItem.objects.filter(queue=queue, status=ItemStatus.OPEN)
        .filter(Q(locked_by__isnull=True) | Q(locked_until__lt=now) | Q(locked_by=reviewer))
        .filter(~Exists(reviewed))
    )
    if skip is not None:
        candidates = candidates.exclude(pk=skip.pk)
    candidates = candidates.order_by("-priority", "id").select_for_update(skip_locked=True, of=("self",))
    item = candidates.filter(locked_by=reviewer).first() or candidates.first()
    if item is None:
        return None
    item.locked_by = reviewer
    item.locked_until = now + timedelta(seconds=queue.lock_timeout_s)
    item.save(update_fields=["locked_by", "locked_until"])
    return item


def _lock_problem(item: QueueItem, reviewer: User, now: Any) -> str | None:
    if item.locked_by_id == reviewer.pk:
        return None  # its own lock, even expired, as long as nobody took the item over
    if item.locked_by_id is not None and item.locked_until is not None and item.locked_until > now:
        holder = User.objects.filter(pk=item.locked_by_id).values_list("username", flat=True).first()
        return (
            f"item {item.pk} is locked by {holder} until {timezone.localtime(item.locked_until):%Y-%m-%d %H:%M:%S %Z}; "
            "take the next item instead"
        )
    return f"you do not hold item {item.pk}; claim it with 'next' before labelling it"


@transaction.atomic
def item_label(*, item: QueueItem, reviewer: User, label: str, note: str = "") -> Review:
    """Record `reviewer`'s label on the item's flag: only the lock holder may, and only once. Releases the lock;
    the item is done once the queue's required number of reviewers labelled its flag."""
    now = timezone.now()
    item = QueueItem.objects.select_for_update().select_related("queue").get(pk=item.pk)
    if Review.objects.filter(flag_id=item.flag_id, reviewer=reviewer).exists():
        raise ValidationError(
            {"item": [f"you already labelled item {item.pk} (flag {item.flag_id}); each reviewer labels it once"]}
        )
    if item.status == ItemStatus.DONE:
        raise ValidationError({"item": [f"item {item.pk} already has its {item.queue.required_reviews} review(s)"]})
    problem = _lock_problem(item, reviewer, now)
    if problem:
        raise ValidationError({"item": [problem]})
    review = review_submit(flag=item.flag, reviewer=reviewer, label=label, note=note)
    item.locked_by, item.locked_until = None, None
    fields = ["locked_by", "locked_until"]
    if Review.objects.filter(flag_id=item.flag_id).count() >= item.queue.required_reviews:
        item.status, item.done_at = ItemStatus.DONE, now
        fields += ["status", "done_at"]
    item.save(update_fields=fields)
    return review


# --- labels flow back -----------------------------------------------------------------------------------------


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


def excluded_tasks_in(dataset_version: DatasetVersion) -> list[str]:
    """The task ids of `dataset_version` excluded from training (sorted); [] without reading the file when its
    dataset has no exclusions."""
    excluded = set(
        TaskExclusion.objects.filter(dataset_id=dataset_version.dataset_id).values_list("task_id", flat=True)
    )
    if not excluded:
        return []
    found: set[str] = set()
    with dataset_version.file.open("rb") as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and str(row.get("id")) in excluded:
                found.add(str(row["id"]))
    return sorted(found)


def task_exclusion_guard(*, dataset_version: DatasetVersion, allow: bool) -> list[str]:
    """Refuse training on a dataset version holding excluded tasks (a 400 naming them), or, with `allow`, return
    them for the run's spec to record."""
    found = excluded_tasks_in(dataset_version)
    if found and not allow:
        shown: Sequence[str] = found[:20]
        more = f" and {len(found) - 20} more" if len(found) > 20 else ""
        raise ValidationError(
            {
                "dataset_version": [
                    f"{dataset_version} holds {len(found)} task(s) excluded from training after review: "
                    f"{', '.join(shown)}{more}. Upload a version without them, or launch with allow_excluded"
                ]
            }
        )
    return found


def flags_record(*, run: Run, findings: Sequence[Any], step: int, evidence: dict[str, Any] | None = None) -> None:
    """Store run-level detector findings (no trajectory: `trajectory_ref` is "run:<id>") as flags of `run`, once
    per detector (a repeat is ignored); `evidence` is added to each finding's own."""
    Flag.objects.bulk_create(
        [
            Flag(
                run=run,
                trajectory_ref=f"run:{run.pk}",
                detector=finding.detector,
                detector_version=finding.version,
                severity=finding.severity,
                evidence={**finding.evidence, **(evidence or {})},
                step=step,
            )
            for finding in findings
        ],
        ignore_conflicts=True,
    )
