"""Reads of runs: a run's live state and queue position, the cluster page, a reconnecting page's missed events,
metric series, stored trajectory records and the event accounting. The runs list's reads (filters, sort, columns,
sparklines) are in `apps.runs.selectors_list`."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Q, QuerySet

from apps.accounts.models import Capability, User
from apps.runs import ray_jobs
from apps.runs.models import ROLLUP_STEPS, TERMINAL_STATUSES, IngestedRange, Run, RunEvent, RunStatus, TrajectorySummary
from apps.runs.storage import read_storage_uri
from workers.rl.placement import add, readable


def run_state(run: Run) -> dict[str, Any]:
    """The run's live state as the page and the websocket show it."""
    return {
        "id": run.pk,
        "status": run.status,
        "progress_done": run.progress_done,
        "progress_total": run.progress_total,
        "failure_reason": run.failure_reason,
        "last_seq": run.last_seq,
        "queue_position": queue_position(run),
        "queued_reason": run.queued_reason if run.status == RunStatus.QUEUED else "",
        # The stored overall health (beat refreshes it; the run page stores what it computes), so the page's
        # summary strip, the live updates, the list and the API say the same; "unknown" reads "no data yet".
        "health": run.health,
    }


def queue_position(run: Run) -> int | None:
    """1 = the next queued run to start; None unless `run` is queued."""
    if run.status != RunStatus.QUEUED:
        return None
    ahead = Run.objects.filter(status=RunStatus.QUEUED).filter(
        Q(priority__gt=run.priority)
        | Q(priority=run.priority, created_at__lt=run.created_at)
        | Q(priority=run.priority, created_at=run.created_at, pk__lt=run.pk)
    )
    return ahead.count() + 1


def cluster_overview() -> dict[str, Any]:
    """The cluster page: Ray's nodes with what each holds and which run placed it there (Ray's state API), and
    Crucible's queue; `error` says plainly when Ray did not answer."""
    from apps.runs.services.queue import capacity_from  # services import these selectors: read at call time

    error = ""
    try:
        nodes, actors, jobs = ray_jobs.nodes(), ray_jobs.actors(), ray_jobs.job_submissions()
    except ray_jobs.RayUnavailable as exc:
        nodes, actors, jobs, error = [], [], {}, str(exc)
    runs = {run.ray_job_id: run for run in Run.objects.filter(ray_job_id__in=set(jobs.values()))}
    rows = []
    for node in nodes:
        placed = [a for a in actors if a.node_id == node.node_id]
        used: dict[str, float] = {}
        for actor in placed:
            used = add(used, actor.resources)
        rows.append(
            {
                "node": node,
                "resources": readable(node.resources),
                "used": readable(used),
                "actors": [
                    {"actor": a, "resources": readable(a.resources), "run": runs.get(jobs.get(a.job_id, ""))}
                    for a in placed
                ],
            }
        )
    queued = list(Run.objects.filter(status=RunStatus.QUEUED).order_by("-priority", "created_at", "pk"))
    held = list(
        Run.objects.filter(admitted_at__isnull=False).exclude(status__in=TERMINAL_STATUSES).exclude(resources={})
    )
    capacity = capacity_from(nodes)  # from the nodes just read: no second query
    return {
        "address": settings.RAY_ADDRESS,
        "error": error,
        "nodes": rows,
        "queued": queued,
        "holding": held,
        "capacity": readable(capacity.total) if capacity else None,
        "capacity_source": capacity.source if capacity else "",
    }


def run_list() -> QuerySet[Run]:
    return Run.objects.select_related("created_by", "dataset_version__dataset", "reward_version__config")


def run_for_viewer(*, run_id: int, user: User) -> Run | None:
    if not user.can(Capability.READ):
        return None
    return Run.objects.filter(pk=run_id).first()


def run_events_after(
    *, run_id: int, after_batch: int, after_seq: int | None = None, limit: int
) -> tuple[Run, list[dict[str, Any]], tuple[int, int] | None]:
    """Events a reconnecting page missed, in commit order: those stored by batches after `after_batch` (then by
    seq within a batch). Metric points are left to the chart endpoint (it downsamples). Returns the run as of the
    read, one page of events, and the position to read the next page from (None when this page was the last).
    With `after_seq` the read starts inside batch `after_batch`, after that seq (how the next page is read)."""
    run = Run.objects.get(pk=run_id)
    start = Q(batch__gt=after_batch)
    if after_seq is not None:
        start |= Q(batch=after_batch, seq__gt=after_seq)
    rows = list(
        RunEvent.objects.filter(run_id=run_id)
        .filter(start)
        .exclude(kind="metric")
        .order_by("batch", "seq")
        .values_list("batch", "seq", "data")[: limit + 1]
    )
    more = len(rows) > limit
    rows = rows[:limit]
    events = [{"seq": seq, **data} for _, seq, data in rows]
    return run, events, ((rows[-1][0], rows[-1][1]) if more else None)


def metric_names(*, run_id: int) -> list[str]:
    with connection.cursor() as cursor:
        # Loose index scan: one probe per distinct name instead of reading every point of the run.
        cursor.execute(
            """
            WITH RECURSIVE names AS (
              (SELECT name FROM runs_metricpoint WHERE run_id = %s ORDER BY name LIMIT 1)
              UNION ALL
              SELECT (SELECT m.name FROM runs_metricpoint m WHERE m.run_id = %s AND m.name > names.name
                      ORDER BY m.name LIMIT 1)
              FROM names WHERE names.name IS NOT NULL
            )
            SELECT name FROM names WHERE name IS NOT NULL
            """,
            [run_id, run_id],
        )
        return [row[0] for row in cursor.fetchall()]


# The step range from two index probes; then buckets from roll-ups (a long series) or from the points.
STEP_RANGE_SQL = """
SELECT (SELECT step FROM runs_metricpoint WHERE run_id = %(run)s AND name = %(name)s
        ORDER BY step LIMIT 1),
       (SELECT step FROM runs_metricpoint WHERE run_id = %(run)s AND name = %(name)s
        ORDER BY step DESC LIMIT 1)
"""
_ROLLUP_BUCKETS_SQL = """
SELECT GREATEST(min(r.bucket) * %(r)s, %(lo)s), sum(r.sum) / sum(r.count), min(r.min),
       max(r.max), sum(r.count)
FROM runs_metricrollup r
WHERE r.run_id = %(run)s AND r.name = %(name)s
GROUP BY GREATEST(r.bucket * %(r)s - %(lo)s, 0) * %(n)s / %(span)s
ORDER BY 1
"""
_POINT_BUCKETS_SQL = """
SELECT min(m.step), avg(m.value), min(m.value), max(m.value), count(*)
FROM runs_metricpoint m
WHERE m.run_id = %(run)s AND m.name = %(name)s
-- Integer bucket arithmetic: about twice as fast as floor() over floats on 100k rows.
GROUP BY (m.step - %(lo)s) * %(n)s / %(span)s
ORDER BY 1
"""


def metric_series(*, run_id: int, name: str, max_points: int = 1000) -> dict[str, Any]:
    """A series downsampled in PostgreSQL to at most `max_points` buckets over the step range.

    Each bucket returns its min, mean and max, so spikes survive downsampling (an envelope, like M4); the bucket
    counts add up to the point count. The step range comes from two index probes. A long series (each output
    bucket spanning at least two roll-up buckets) is read from its roll-ups (`MetricRollup`, ROLLUP_STEPS steps
    each): a million-point series reads about 15,600 rows, and the output buckets' edges fall on roll-up edges.
    A shorter one is grouped from its points in one scan."""
    max_points = max(10, min(max_points, 5000))
    params: dict[str, int | str] = {"run": run_id, "name": name, "n": max_points, "r": ROLLUP_STEPS}
    with connection.cursor() as cursor:
        cursor.execute(STEP_RANGE_SQL, params)
        lo, hi = cursor.fetchone()
        rows: list[Any] = []
        if lo is not None:
            params.update(lo=lo, span=hi - lo + 1)
            if (hi - lo + 1) >= 2 * ROLLUP_STEPS * max_points:
                cursor.execute(_ROLLUP_BUCKETS_SQL, params)
            else:
                cursor.execute(_POINT_BUCKETS_SQL, params)
            rows = cursor.fetchall()
        count = int(sum(r[4] for r in rows))
        if len(rows) < count <= max_points:
            # Few points on sparse steps shared buckets: they fit, so return each one as it is.
            cursor.execute(
                "SELECT step, value, value, value FROM runs_metricpoint WHERE run_id = %s AND name = %s ORDER BY step",
                [run_id, name],
            )
            rows = cursor.fetchall()
    return {
        "name": name,
        "steps": [r[0] for r in rows],
        "mean": [r[1] for r in rows],
        "min": [r[2] for r in rows],
        "max": [r[3] for r in rows],
        "count": count,
    }


MAX_RECORD_SCAN_BYTES = 256 * 1024 * 1024


def find_record(uri: str, trajectory_id: str) -> dict[str, Any] | None:
    """The JSONL record with `id` == trajectory_id in the file at `uri`; None when absent or unreadable."""
    try:
        data = read_storage_uri(uri)
    except (FileNotFoundError, OSError):
        return None
    if len(data) > MAX_RECORD_SCAN_BYTES:
        return None
    needle = json.dumps(trajectory_id).encode()
    for line in data.splitlines():
        if needle in line:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and str(record.get("id")) == trajectory_id:
                return record
    return None


def step_records(run: Run, step: int) -> list[dict[str, Any]]:
    """The full records a training run stored for `step`, in the order written (by group, then sample); empty when
    none was stored or the file is unreadable or too large to scan."""
    uris = (
        TrajectorySummary.objects.filter(run=run, step=step)
        .exclude(storage_uri="")
        .values_list("storage_uri", flat=True)
        .distinct()
    )
    records: list[dict[str, Any]] = []
    for uri in uris:
        try:
            data = read_storage_uri(uri)
        except (FileNotFoundError, OSError):
            continue
        if len(data) > MAX_RECORD_SCAN_BYTES:
            continue
        for line in data.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("step", step) == step:
                records.append(record)
    return records


def event_accounting(run: Run) -> dict[str, Any]:
    """Did every event the worker numbered arrive exactly once? From the idempotency ledger: how many seqs are
    stored, the gaps below the highest one, and any seq two ranges both claim (a duplicate; the ledger's design
    makes it 0). A run whose worker sent its `end` event should have no gap up to that event's seq."""
    ranges = sorted(IngestedRange.objects.filter(run=run).values_list("lo", "hi"))
    stored = sum(hi - lo + 1 for lo, hi in ranges)
    gaps: list[tuple[int, int]] = []
    duplicates = 0
    expected = 1
    for lo, hi in ranges:
        if lo > expected:
            gaps.append((expected, lo - 1))
        elif lo < expected:
            duplicates += min(hi, expected - 1) - lo + 1
        expected = max(expected, hi + 1)
    return {
        "stored": stored,
        "last_seq": run.last_seq,
        "gaps": gaps,
        "missing": sum(hi - lo + 1 for lo, hi in gaps),
        "duplicates": duplicates,
        "late": run.late_events,
        "ended": run.reported_outcome or None,
    }
