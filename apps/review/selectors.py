"""Reads of the review app: queues with their progress, detector precision, and what the review page shows."""

from __future__ import annotations

import html
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, Q, QuerySet
from django.utils.safestring import SafeString, mark_safe

from apps.review.models import ItemStatus, Label, QueueItem, Review, ReviewQueue
from apps.runs.selectors import find_record


@dataclass
class QueueProgress:
    queue: ReviewQueue
    items: int = 0
    done: int = 0
    by_reviewer: list[tuple[str, int]] = field(default_factory=list)

    @property
    def open(self) -> int:
        return self.items - self.done


def queue_list() -> list[QueueProgress]:
    """Every queue with its item counts and how many of its items each reviewer labelled (three queries)."""
    queues = list(
        ReviewQueue.objects.select_related("run").annotate(
            n_items=Count("items"), n_done=Count("items", filter=Q(items__status=ItemStatus.DONE))
        )
    )
    per_reviewer: dict[int, list[tuple[str, int]]] = defaultdict(list)
    rows = (
        Review.objects.filter(flag__queue_items__queue__in=queues)
        .values("flag__queue_items__queue", "reviewer__username")
        .annotate(n=Count("id"))
        .order_by("flag__queue_items__queue", "-n", "reviewer__username")
    )
    for row in rows:
        per_reviewer[row["flag__queue_items__queue"]].append((row["reviewer__username"], row["n"]))
    return [QueueProgress(queue=q, items=q.n_items, done=q.n_done, by_reviewer=per_reviewer[q.pk]) for q in queues]


@dataclass(frozen=True)
class DetectorPrecision:
    detector: str
    reviewed: int
    confirmed: int
    false_positive: int
    unclear: int

    @property
    def precision(self) -> float | None:
        """Confirmed hacks over all labels given to the detector's flags (an 'unclear' counts as reviewed)."""
        return self.confirmed / self.reviewed if self.reviewed else None


def detector_precision() -> list[DetectorPrecision]:
    """Per detector, over every review of its flags: labels given and the share that confirmed a hack."""
    rows = (
        Review.objects.values("flag__detector")
        .annotate(
            reviewed=Count("id"),
            confirmed=Count("id", filter=Q(label=Label.CONFIRMED)),
            false_positive=Count("id", filter=Q(label=Label.FALSE_POSITIVE)),
            unclear=Count("id", filter=Q(label=Label.UNCLEAR)),
        )
        .order_by("flag__detector")
    )
    return [
        DetectorPrecision(
            detector=row["flag__detector"],
            reviewed=row["reviewed"],
            confirmed=row["confirmed"],
            false_positive=row["false_positive"],
            unclear=row["unclear"],
        )
        for row in rows
    ]


def queue_items(queue: ReviewQueue) -> QuerySet[QueueItem]:
    return (
        QueueItem.objects.filter(queue=queue)
        .select_related("flag", "locked_by")
        .annotate(n_reviews=Count("flag__reviews"))
        .order_by("status", "-priority", "id")
    )


def item_for_review(item_id: int) -> QueueItem:
    return QueueItem.objects.select_related("queue", "flag__run__reward_version", "flag__trajectory", "locked_by").get(
        pk=item_id
    )


def highlighted(text: str, span: Any) -> SafeString:
    """`text` escaped, with the evidence's [start, end) character span wrapped in <mark>; unmarked when the span
    does not fit the text."""
    if (
        isinstance(span, list | tuple)
        and len(span) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in span)
        and 0 <= span[0] <= span[1] <= len(text)
    ):
        start, end = span
        return mark_safe(  # noqa: S308 - every piece is escaped
            html.escape(text[:start])
            + '<mark class="evidence">'
            + html.escape(text[start:end])
            + "</mark>"
            + html.escape(text[end:])
        )
    return mark_safe(html.escape(text))  # noqa: S308


def evidence_view(item: QueueItem) -> dict[str, Any]:
    """What the review page shows of the flag's trajectory: whether it is still stored, the flagged turn's text
    with the evidence span marked, and the other flags on the same trajectory."""
    flag = item.flag
    evidence = flag.evidence if isinstance(flag.evidence, dict) else {}
    turn_index = evidence.get("turn")
    summary = flag.trajectory
    view: dict[str, Any] = {
        "evidence": evidence,
        "turn_index": turn_index if isinstance(turn_index, int) and not isinstance(turn_index, bool) else None,
        "summary": summary,
        "missing": "",
        "turn": None,
        "turn_text": None,
        "extra": {k: v for k, v in evidence.items() if k not in {"message", "turn", "span", "excerpt"}},
    }
    if summary is None:
        view["missing"] = (
            f"Trajectory {flag.trajectory_ref} of run {flag.run_id} is no longer stored (deleted, or its summary "
            "never arrived). Label it from the detector's stored evidence below."
        )
        return view
    record = find_record(summary.storage_uri, summary.trajectory_id) if summary.storage_uri else None
    if record is None:
        view["missing"] = (
            f"Only the summary of trajectory {flag.trajectory_ref} is stored (its full record was not kept or its "
            "file is gone). Label it from the detector's stored evidence below."
        )
        return view
    raw_turns = record.get("turns")
    turns: list[Any] = raw_turns if isinstance(raw_turns, list) else []
    if view["turn_index"] is not None and 0 <= view["turn_index"] < len(turns):
        turn = turns[view["turn_index"]] if isinstance(turns[view["turn_index"]], dict) else {}
        raw_content = turn.get("content")
        content = raw_content if isinstance(raw_content, str) else ""
        view["turn"] = {"role": turn.get("role", ""), "tool": turn.get("tool")}
        view["turn_text"] = highlighted(content, evidence.get("span"))
    view["record"] = True
    return view
