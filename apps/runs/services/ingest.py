"""Ingest: a batch of worker events stored exactly once per (run, seq), then published to the run's group.

Runs stores the kinds every run reports (metrics, logs, progress, trajectories, artifacts, checkpoints, task
results, summaries; histograms live in the ledger only). An event kind another app owns is handed to the store
that app registered (`register_event_store`, from its `hooks` module): review stores flags. The stores run
inside the batch's transaction, after the run's own rows, so a flag finds the trajectory that came with it.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, get_args

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.runs import kinds, tasks
from apps.runs.live import publish_events
from apps.runs.models import (
    Artifact,
    Checkpoint,
    IngestedRange,
    MetricPoint,
    Run,
    RunEvent,
    RunStatus,
    TaskResult,
    TrajectorySummary,
)
from apps.runs.selectors import run_state
from apps.runs.services.lifecycle import LOG_TAIL_LINES, finish
from apps.runs.services.metrics import METRIC_POINT_COLUMNS, copy_rows, rollup_metrics
from workers.events import EVENTS_LIST, Event


@dataclass(frozen=True)
class IngestContext:
    """What a registered event store may use besides its events: the locked run and this batch's new rows."""

    run: Run
    new_trajectory_ids: list[str]


EventStore = Callable[[IngestContext, list[Any]], None]

CORE_EVENT_KINDS = frozenset(
    {"metric", "log", "progress", "trajectory", "histogram", "artifact", "checkpoint", "task_result", "summary", "end"}
)
_event_stores: dict[str, EventStore] = {}


def register_event_store(kind: str, store: EventStore) -> None:
    if kind in CORE_EVENT_KINDS or _event_stores.get(kind, store) is not store:
        raise ValueError(f"event kind {kind!r} already has a store")
    _event_stores[kind] = store


def event_kinds_without_store() -> list[str]:
    """Worker event kinds (workers.events) that nothing would store (the system check reports them)."""
    known = [get_args(cls.model_fields["kind"].annotation)[0] for cls in get_args(get_args(Event)[0])]
    return [kind for kind in known if kind not in CORE_EVENT_KINDS and kind not in _event_stores]


@dataclass(frozen=True)
class IngestResult:
    accepted: int
    duplicates: int
    last_seq: int
    payloads: list[dict[str, Any]] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)


def _ts(event: Any, default: datetime) -> datetime:
    if event.time is None:
        return default
    return datetime.fromtimestamp(event.time, tz=timezone.get_current_timezone())


class RunEnded(Exception):
    """A batch for a run that ended more than CRUCIBLE_INGEST_GRACE_SECONDS ago, with events made after that: its
    token no longer ingests (the endpoint answers 409; nothing is stored)."""


def ingest_cutoff(run: Run) -> datetime | None:
    """When the run's ingest token stops taking new events: its end plus the grace (None while it runs, and for an
    ended row without an end time, which is treated as just ended)."""
    if not run.is_terminal or run.finished_at is None:
        return None
    return run.finished_at + timedelta(seconds=settings.INGEST_GRACE_SECONDS)


def _refuse_after_the_end(run: Run, events: list[Any], now: datetime) -> None:
    """After the grace only events made before its end (a spool a dead driver left, replayed later, an outage the
    job waited out) still land; a batch with any event made later, or carrying no time, is refused whole."""
    cutoff = ingest_cutoff(run)
    if cutoff is None or now <= cutoff:
        return
    limit = cutoff.timestamp()
    later = sum(1 for event in events if event.time is None or event.time > limit)
    if not later:
        return
    raise RunEnded(
        f"run {run.pk} ended ({run.status}) at {run.finished_at:%Y-%m-%d %H:%M:%S} UTC: its ingest token took new "
        f"events for {settings.INGEST_GRACE_SECONDS} s more (CRUCIBLE_INGEST_GRACE_SECONDS), until "
        f"{cutoff:%H:%M:%S}, and takes only events made before then since (a replayed spool). {later} of these "
        f"{len(events)} events were made later or carry no time: nothing was stored. Stop the job that still "
        "reports, or launch a new run."
    )


def ingest_batch(*, run_id: int, events: list[Any], publish: bool = True) -> IngestResult:
    """Store a batch of worker events exactly once per (run, seq), then publish the new ones to the run's group.

    A run that has ended takes events for CRUCIBLE_INGEST_GRACE_SECONDS more (those in flight: the job's last
    reports, a flush that raced the reconcile), and after that only events made before the cutoff (a spool
    replayed by the next job on the node); both are counted as late. Anything else raises RunEnded.

    With publish=False the caller publishes `payloads` itself after this returns (the transaction has committed):
    the async ingest view does, so the publish reuses the server's event loop and Redis connection."""
    now = timezone.now()
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        _refuse_after_the_end(run, events, now)
        unique: dict[int, Any] = {}
        for event in events:
            unique.setdefault(event.seq, event)
        # Seqs above the run's high-water mark cannot be stored yet: only the rest needs a lookup (none when in order).
        maybe_seen = [seq for seq in unique if seq <= run.last_seq]
        existing = _stored_seqs(run.pk, maybe_seen) if maybe_seen else set()
        fresh = [unique[s] for s in sorted(unique) if s not in existing]
        if not fresh:
            return IngestResult(accepted=0, duplicates=len(events), last_seq=run.last_seq)

        run.ingest_batches += 1
        payloads = _payloads(fresh)
        by_kind: dict[str, list[Any]] = defaultdict(list)
        for event in fresh:
            by_kind[event.kind].append(event)
        _store_ledger(run, fresh, payloads, now)
        new_trajectory_ids = _store_rows(run, by_kind, now)
        context = IngestContext(run=run, new_trajectory_ids=new_trajectory_ids)
        for kind, store in _event_stores.items():  # every batch: a store may link earlier rows to new trajectories
            store(context, by_kind.get(kind, []))
        _update_run_row(run, fresh, by_kind, now)

        state = {**run_state(run), "batch": run.ingest_batches}
        if publish:
            transaction.on_commit(lambda: publish_events(run.pk, payloads, state))
        return IngestResult(
            accepted=len(fresh),
            duplicates=len(events) - len(fresh),
            last_seq=run.last_seq,
            payloads=payloads,
            state=state,
        )


def _payloads(events: list[Any]) -> list[dict[str, Any]]:
    """The events as JSON-ready dicts, as `EVENTS_LIST.dump_python(events, mode="json")` gives them (what the
    ledger stores and the run's group is sent). A metric event is built by hand: it is most of every batch, its
    fields are plain JSON already, and pydantic's serializer costs about 5 us per event (a test holds the two
    equal)."""
    others = [e for e in events if e.kind != "metric"]
    dumped = iter(EVENTS_LIST.dump_python(others, mode="json") if others else ())
    return [
        {"seq": e.seq, "time": e.time, "kind": "metric", "step": e.step, "values": e.values}
        if e.kind == "metric"
        else next(dumped)
        for e in events
    ]


def _store_ledger(run: Run, fresh: list[Any], payloads: list[dict[str, Any]], now: datetime) -> None:
    """The idempotency ranges, and every non-metric event for replay (metric values live in MetricPoint only)."""
    batch = run.ingest_batches
    ranges = [(run.pk, lo, hi, batch) for lo, hi in _seq_ranges([e.seq for e in fresh])]
    ledger = [
        (run.pk, event.seq, batch, event.kind, _ledger_json(payload), now)
        for event, payload in zip(fresh, payloads, strict=True)
        if event.kind != "metric"
    ]
    copy_rows(IngestedRange._meta.db_table, ["run_id", "lo", "hi", "batch"], ranges)
    copy_rows(RunEvent._meta.db_table, ["run_id", "seq", "batch", "kind", "data", "created_at"], ledger)


def _ledger_json(payload: dict[str, Any]) -> str:
    # allow_nan=False: a NaN inside a free-form field (summary, meta) refuses the batch (a 400), stores nothing.
    return json.dumps({k: v for k, v in payload.items() if k != "seq"}, allow_nan=False)


def _store_rows(run: Run, by_kind: dict[str, list[Any]], now: datetime) -> list[str]:
    """The rows of the core event kinds; returns the ids of the trajectory summaries in the batch."""
    run_id = run.pk
    metrics = [(run_id, e.step, k, v, _ts(e, now)) for e in by_kind.get("metric", []) for k, v in e.values.items()]
    copy_rows(MetricPoint._meta.db_table, METRIC_POINT_COLUMNS, metrics)
    rollup_metrics(run.pk, metrics)
    trajectories = [
        TrajectorySummary(
            run=run,
            trajectory_id=e.trajectory_id,
            task_id=e.task_id,
            step=e.step,
            reward=e.reward,
            terms=e.terms,
            num_turns=e.num_turns,
            completion_tokens=e.completion_tokens,
            error=e.error or "",
            storage_uri=e.storage_uri,
        )
        for e in by_kind.get("trajectory", [])
    ]
    TrajectorySummary.objects.bulk_create(trajectories, ignore_conflicts=True, batch_size=2000)
    Artifact.objects.bulk_create(
        [Artifact(run=run, name=e.name, uri=e.uri, size_bytes=e.size_bytes, meta=e.meta) for e in by_kind["artifact"]],
        ignore_conflicts=True,
    )
    checkpoints = [Checkpoint(run=run, step=e.step, uri=e.uri, metrics=e.metrics) for e in by_kind["checkpoint"]]
    Checkpoint.objects.bulk_create(checkpoints, ignore_conflicts=True)
    if checkpoints and kinds.has_hooks(run.kind, "checkpoints"):
        steps = [c.step for c in checkpoints]
        transaction.on_commit(lambda: tasks.run_lifecycle.delay(run.pk, "checkpoints", steps), robust=True)
    TaskResult.objects.bulk_create(
        [TaskResult(run=run, **e.model_dump(exclude={"seq", "time", "kind"})) for e in by_kind["task_result"]],
        ignore_conflicts=True,
    )
    return [t.trajectory_id for t in trajectories]


def _update_run_row(run: Run, fresh: list[Any], by_kind: dict[str, list[Any]], now: datetime) -> None:
    fields = ["last_seq", "ingest_batches", "last_event_at"]
    run.last_seq = max(run.last_seq, fresh[-1].seq)
    run.last_event_at = now  # what the stall watchdog measures silence from
    if run.stalled_at is not None:  # it talks again: no longer stalled (the report stays, saying so)
        run.stall_report = f"Recovered at {now:%Y-%m-%d %H:%M:%S} UTC: events arrived again.\n\n{run.stall_report}"
        run.stalled_at = None
        fields += ["stalled_at", "stall_report"]
    # Batches can commit out of seq order (a retry, two flushes racing): progress and the log tail follow
    # seq order, never commit order, so neither goes backwards.
    progress = max(by_kind["progress"], key=lambda e: e.seq, default=None)
    if progress is not None and progress.seq > run.progress_seq:
        run.progress_done, run.progress_total, run.progress_seq = progress.done, progress.total, progress.seq
        fields += ["progress_done", "progress_total", "progress_seq"]
        if progress.phase and progress.phase != run.phase:
            run.phase = progress.phase
            fields.append("phase")
    log_events = by_kind["log"]
    if log_events:
        if log_events[0].seq > run.log_seq:
            lines = [line for event in log_events for line in event.lines]
            run.log_tail = "\n".join((run.log_tail.splitlines() + lines)[-LOG_TAIL_LINES:])
        else:
            run.log_tail = _log_tail_from_ledger(run.pk)
        run.log_seq = max(run.log_seq, log_events[-1].seq)
        fields += ["log_tail", "log_seq"]
    if by_kind["summary"]:
        summary = dict(run.summary)
        for event in by_kind["summary"]:
            summary.update(event.data)
        run.summary = summary
        fields.append("summary")
    end = max(by_kind["end"], key=lambda e: e.seq, default=None)
    if end is not None:
        run.reported_outcome, run.reported_error = end.outcome, end.error
        fields += ["reported_outcome", "reported_error"]
    if run.is_terminal:
        # Stored all the same (they are this run's, numbered once), and counted where people see them.
        run.late_events += len(fresh)
        fields.append("late_events")
    elif run.status == RunStatus.PENDING:
        # The worker is talking, so its job runs, whatever the last reconcile saw.
        run.status = RunStatus.RUNNING
        run.started_at = run.started_at or now
        fields += ["status", "started_at"]
    run.save(update_fields=fields)
    if end is not None and not run.is_terminal and run.kind in kinds.external_kinds():
        # Trained elsewhere: no Ray job whose status decides, so the reporter's own word ends the run.
        status = RunStatus.SUCCEEDED if end.outcome == "succeeded" else RunStatus.FAILED
        finish(run, status, reason=f"the trainer reported: {end.error}" if end.error else "")


def _seq_ranges(seqs: list[int]) -> list[tuple[int, int]]:
    """Sorted seqs as closed ranges of consecutive numbers: [1, 2, 3, 7] -> [(1, 3), (7, 7)]."""
    ranges: list[tuple[int, int]] = []
    for seq in seqs:
        if ranges and seq == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], seq)
        else:
            ranges.append((seq, seq))
    return ranges


def _stored_seqs(run_id: int, seqs: list[int]) -> set[int]:
    """Which of `seqs` an earlier batch stored (only asked for seqs at or below the run's high-water mark)."""
    low, high = min(seqs), max(seqs)
    ranges = IngestedRange.objects.filter(run_id=run_id, hi__gte=low, lo__lte=high).values_list("lo", "hi")
    return {seq for lo, hi in ranges for seq in seqs if lo <= seq <= hi}


def _log_tail_from_ledger(run_id: int) -> str:
    """The last LOG_TAIL_LINES lines in seq order, rebuilt from the ledger (only when a late batch arrives)."""
    recent = RunEvent.objects.filter(run_id=run_id, kind="log").order_by("-seq").values_list("data", flat=True)
    lines: list[str] = []
    for data in recent[:LOG_TAIL_LINES]:
        lines[:0] = data["lines"]
        if len(lines) >= LOG_TAIL_LINES:
            break
    return "\n".join(lines[-LOG_TAIL_LINES:])
