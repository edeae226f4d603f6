"""Labels and review queues: a queue fills with the flags that match it (one item per trajectory), reviewers claim
items under a lock that expires, and an item is done after its required number of reviews."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from apps.accounts.models import User
from apps.common.validators import SLUG
from apps.review.models import (
    SEVERITY_PRIORITY,
    Flag,
    ItemStatus,
    Label,
    QueueItem,
    Review,
    ReviewQueue,
    Severity,
)
from apps.runs.models import Run
from workers.detectors.registry import detectors

MIN_LOCK_TIMEOUT_S = 10


def review_submit(*, flag: Flag, reviewer: User, label: str, note: str = "") -> Review:
    if label not in Label.values:
        raise ValidationError({"label": [f"unknown label {label!r}; choose one of {Label.values}"]})
    try:
        with transaction.atomic():
            return Review.objects.create(flag=flag, reviewer=reviewer, label=label, note=note)
    except IntegrityError:
        raise ValidationError({"flag": [f"you already reviewed flag {flag.pk}; each reviewer labels a flag once"]})


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
