"""Chart reads beyond the metric series (apps.runs.selectors.metric_series): when each step happened, for the
wall-time x-axis, and how per-trajectory values spread over steps, for the distribution strips."""

from __future__ import annotations

from typing import Any

from django.db import connection

from apps.runs.selectors import STEP_RANGE_SQL

_STEP_TIMES_SQL = """
SELECT DISTINCT p.step, extract(epoch FROM p.time)
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint, %(stride)s::bigint) AS e(step)
CROSS JOIN LATERAL (
    SELECT m.step, m.time FROM runs_metricpoint m
    WHERE m.run_id = %(run)s AND m.name = %(name)s AND m.step >= e.step
    ORDER BY m.step LIMIT 1
) p
ORDER BY 1
"""
"""One index probe per sampled step (at most max_points of them), so a million-point series costs what a short one
does."""


def step_times(*, run_id: int, name: str, max_points: int = 1000) -> dict[str, Any]:
    """When each step was reported (epoch seconds), from one series, downsampled to at most `max_points` steps: the
    charts' wall-time x-axis interpolates between them. Empty for a series without points."""
    params: dict[str, int | str] = {"run": run_id, "name": name, "n": max(10, min(max_points, 5000))}
    with connection.cursor() as cursor:
        cursor.execute(STEP_RANGE_SQL, params)
        lo, hi = cursor.fetchone()
        if lo is None:
            return {"steps": [], "epoch": []}
        params.update(lo=lo, hi=hi, stride=max(1, (hi - lo + 1) // int(params["n"])))
        cursor.execute(_STEP_TIMES_SQL, params)
        rows = cursor.fetchall()
    return {"steps": [int(r[0]) for r in rows], "epoch": [float(r[1]) for r in rows]}


DISTRIBUTION_FIELDS = {"reward": "reward", "completion_tokens": "completion_tokens", "num_turns": "num_turns"}
"""Per-trajectory values whose distribution over steps the run page draws (W&B's distribution chart)."""

_DISTRIBUTION_SQL = """
WITH span AS (
    SELECT min({col})::float8 AS lo, max({col})::float8 AS hi, min(step) AS s0, max(step) AS s1
    FROM runs_trajectorysummary WHERE run_id = %(run)s AND {col} IS NOT NULL
)
SELECT
    CASE WHEN span.s1 = span.s0 THEN 0
         ELSE least(%(cols)s - 1, floor((t.step - span.s0)::float8 * %(cols)s / (span.s1 - span.s0 + 1))::int) END,
    CASE WHEN span.hi = span.lo THEN 0
         ELSE least(%(bins)s - 1, floor((t.{col} - span.lo) * %(bins)s / (span.hi - span.lo))::int) END,
    count(*), min(t.step), max(t.step), span.lo, span.hi, span.s0, span.s1
FROM runs_trajectorysummary t, span
WHERE t.run_id = %(run)s AND t.{col} IS NOT NULL
GROUP BY 1, 2, span.lo, span.hi, span.s0, span.s1
"""


def trajectory_distribution(*, run_id: int, field: str, bins: int = 20, max_columns: int = 100) -> dict[str, Any]:
    """How a per-trajectory value (`DISTRIBUTION_FIELDS`) spreads at each step: counts in `bins` equal-width bins
    over the run's whole range (so columns compare), steps grouped into at most `max_columns` columns, in one
    grouped scan in PostgreSQL. `columns[i]` = [first step, last step] of column i; `counts[i][b]` its count in
    bin b, whose edges are `edges[b]`, `edges[b + 1]`."""
    column = DISTRIBUTION_FIELDS[field]  # a fixed name from the dict, never the request's text
    params = {"run": run_id, "bins": bins, "cols": max_columns}
    with connection.cursor() as cursor:
        cursor.execute(_DISTRIBUTION_SQL.format(col=column), params)
        rows = cursor.fetchall()
    if not rows:
        return {"field": field, "edges": [], "columns": [], "counts": []}
    lo, hi = float(rows[0][5]), float(rows[0][6])
    width = (hi - lo) / bins if hi > lo else 1.0
    edges = [lo + width * b for b in range(bins + 1)] if hi > lo else [lo - 0.5, lo + 0.5]
    used = sorted({r[0] for r in rows})
    index = {c: i for i, c in enumerate(used)}
    counts = [[0] * (bins if hi > lo else 1) for _ in used]
    spans: list[list[int]] = [[0, 0] for _ in used]
    for col, b, n, first, last, *_ in rows:
        i = index[col]
        counts[i][b] += int(n)
        spans[i] = [min(spans[i][0] or first, first), max(spans[i][1], last)]
    return {"field": field, "edges": edges, "columns": spans, "counts": counts}
