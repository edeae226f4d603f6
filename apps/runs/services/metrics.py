"""Metric points and their roll-ups: written by ingest, and by the control plane for series it computes itself."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from apps.runs.models import ROLLUP_STEPS, MetricPoint, MetricRollup


def rollup_metrics(run_id: int, points: list[tuple[Any, ...]]) -> None:
    """Fold a batch's new metric points (run, step, name, value, time) into the run's roll-up buckets, in the
    ingest transaction: the ledger already made these points new, so each is counted exactly once."""
    if not points:
        return
    buckets: dict[tuple[str, int], list[float]] = {}
    for _, step, name, value, _ in points:
        agg = buckets.get((name, step // ROLLUP_STEPS))
        if agg is None:
            buckets[(name, step // ROLLUP_STEPS)] = [value, value, value, 1.0]
        else:
            agg[0], agg[1] = min(agg[0], value), max(agg[1], value)
            agg[2] += value
            agg[3] += 1
    rows = [(run_id, name, bucket, lo, hi, total, int(n)) for (name, bucket), (lo, hi, total, n) in buckets.items()]
    with connection.cursor() as cursor:
        cursor.executemany(
            """
            INSERT INTO runs_metricrollup (run_id, name, bucket, min, max, sum, count)
            VALUES (%s, %s, %s, %s, %s, %s, %s)
            ON CONFLICT (run_id, name, bucket) DO UPDATE SET
              min = LEAST(runs_metricrollup.min, EXCLUDED.min),
              max = GREATEST(runs_metricrollup.max, EXCLUDED.max),
              sum = runs_metricrollup.sum + EXCLUDED.sum,
              count = runs_metricrollup.count + EXCLUDED.count
            """,
            rows,
        )


def metric_series_replace(*, run_id: int, name: str, points: list[tuple[int, float]]) -> None:
    """Replace one series of a run outside ingest (values the control plane computes, e.g. eval results per
    checkpoint): its points and its roll-ups together, so long-range charts read the same data as short ones."""
    now = timezone.now()
    with transaction.atomic():
        MetricPoint.objects.filter(run_id=run_id, name=name).delete()
        MetricRollup.objects.filter(run_id=run_id, name=name).delete()
        rows = [(run_id, step, name, value, now) for step, value in points]
        copy_metric_points(rows)
        rollup_metrics(run_id, rows)


def metric_rollups_rebuild(*, run_ids: list[int] | None = None) -> None:
    """Recompute roll-ups from the stored points (for data loaded around ingest, e.g. by a bulk COPY)."""
    where, params = ("WHERE run_id = ANY(%s)", [run_ids]) if run_ids is not None else ("", [])
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM runs_metricrollup {where}", params)
        cursor.execute(
            "INSERT INTO runs_metricrollup (run_id, name, bucket, min, max, sum, count) "
            f"SELECT run_id, name, step / %s, min(value), max(value), sum(value), count(*) FROM runs_metricpoint "
            f"{where} GROUP BY run_id, name, step / %s",
            [ROLLUP_STEPS, *params, ROLLUP_STEPS],
        )


# COPY's text format: a backslash, tab, newline or carriage return inside a value is written escaped.
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def copy_metric_points(points: list[tuple[int, int, str, float, datetime]]) -> None:
    """COPY metric points (run, step, name, value, time) as one block of COPY text: about 5x less CPU than a
    write_row per point (a 1,000-point batch is the common case). Values are finite floats (ingest refuses the
    rest); each distinct name and time is formatted once."""
    if not points:
        return
    names: dict[str, str] = {}
    stamps: dict[datetime, str] = {}
    lines = []
    for run_id, step, name, value, time in points:
        text = names.get(name)
        if text is None:
            text = names[name] = name.translate(_COPY_ESCAPES)
        stamp = stamps.get(time)
        if stamp is None:
            stamp = stamps[time] = time.isoformat()
        lines.append(f"{run_id}\t{step}\t{text}\t{float(value)!r}\t{stamp}\n")
    table = MetricPoint._meta.db_table
    with connection.cursor() as cursor:
        with cursor.cursor.copy(f"COPY {table} (run_id, step, name, value, time) FROM STDIN") as copy:
            copy.write("".join(lines))


def copy_rows(table: str, columns: list[str], rows: list[tuple[Any, ...]]) -> None:
    """COPY, not INSERT: a 1,000-row batch goes in ~10x faster (callers hold the lock that keeps it exactly-once)."""
    if not rows:
        return
    with connection.cursor() as cursor:
        with cursor.cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
