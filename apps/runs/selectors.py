from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.paginator import Page, Paginator
from django.db import connection
from django.db.models import Case, Q, QuerySet, Value, When
from django.db.models.fields.json import KeyTextTransform, KeyTransform

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


RUNS_PER_PAGE = 50
SPARKLINE_METRIC = "reward_mean"
SPARKLINE_POINTS = 50


@dataclass(frozen=True)
class RunListFilters:
    """The runs list's filters, sort and extra columns as the page's query string gives them; blank means "any"."""

    status: str = ""
    kind: str = ""
    health: str = ""
    learning: str = ""
    tag: str = ""
    owner: str = ""
    q: str = ""
    dataset: str = ""
    reward: str = ""
    sort: str = ""
    cols: str = ""

    @classmethod
    def from_query(cls, query: Any) -> RunListFilters:
        return cls(**{f: str(query.get(f, "")).strip()[:200] for f in cls.__dataclass_fields__})

    def columns(self) -> list[tuple[str, str]]:
        """The extra columns: `config.<key>` (the run's config, a dotted path inside it) or `summary.<key>`, at most
        8; anything else is left out (`column_problems` says why)."""
        picked = []
        for raw in self.cols.split(","):
            source, _, path = raw.strip().partition(".")
            if source in ("config", "summary") and COLUMN_PATH.fullmatch(path):
                picked.append((source, path))
        return picked[:8]

    def column_problems(self) -> list[str]:
        bad = [c.strip() for c in self.cols.split(",") if c.strip()]
        bad = [c for c in bad if (c.partition(".")[0], c.partition(".")[2]) not in self.columns()]
        return [
            f"column {c!r} left out: write config.<key> or summary.<key> (letters, digits, _, @, - and .)" for c in bad
        ]


COLUMN_PATH = re.compile(r"[A-Za-z_][\w@-]{0,60}(\.[A-Za-z_][\w@-]{0,60}){0,3}")
"""A key path: up to 4 keys of letters, digits, `_`, `@` and `-` (pass@1). Keys reach SQL as parameters."""
HEALTH_RANK = Case(
    When(health="bad", then=Value(0)),
    When(health="warn", then=Value(1)),
    When(health="ok", then=Value(2)),
    default=Value(3),
)
"""The list's health sort: worst first, unknown last."""
RUN_SORTS: dict[str, tuple[Any, ...]] = {
    "": ("-created_at", "-id"),
    "created": ("created_at", "id"),
    "name": ("name", "id"),
    "-name": ("-name", "-id"),
    "status": ("status", "-id"),
    "kind": ("kind", "-id"),
    "health": (HEALTH_RANK.asc(), "-id"),
    "progress": ("-progress_done", "-id"),
}
"""The list's sort keys (`?sort=`), besides `config.<key>` and `summary.<key>` (`-` in front: descending)."""


def _column_expr(source: str, path: str, *, text: bool = True) -> Any:
    """`spec -> 'config' -> ... ->> 'last'` (or `summary -> ... ->> 'last'`): one key's text, NULL where absent;
    with text=False its jsonb value, which sorts numbers as numbers (1e-05 < 0.001), not as text."""
    keys = (["config"] if source == "config" else []) + path.split(".")
    inner: Any = "spec" if source == "config" else "summary"
    for key in keys[:-1]:
        inner = KeyTransform(key, inner)
    return KeyTextTransform(keys[-1], inner) if text else KeyTransform(keys[-1], inner)


LEARNING_REWARD = ("improving", "flat", "worsening")
LEARNING_EVAL = ("better", "no_difference", "worse")
LEARNING_FILTERS = (*LEARNING_REWARD, *LEARNING_EVAL)
"""What the runs list's `learning=` filter takes: the reward trend's verdict or the held-out eval's."""


def learning_filter(value: str) -> dict[str, Any]:
    """The containment a `learning=` filter value asks of `Run.learning` (served by its GIN index run_learning_idx)."""
    if value in LEARNING_REWARD:
        return {"learning__contains": {"reward": {"verdict": value}}}
    if value in LEARNING_EVAL:
        return {"learning__contains": {"eval": {"verdict": value}}}
    raise ValueError(f"learning must be one of {', '.join(LEARNING_FILTERS)} (got {value!r})")


def run_list_page(*, filters: RunListFilters, page: Any, per_page: int = RUNS_PER_PAGE) -> Page:
    """One page of the runs list, newest first (or by `filters.sort`), with each run's reward sparkline as
    `run.sparkline` ([(step, value), ...]) and the chosen columns as `run.columns` (text, "" where absent). Three
    queries whatever the page size: the count, the page, the sparklines."""
    columns = filters.columns()
    runs = (
        Run.objects.select_related("created_by", "dataset_version__dataset", "reward_version__config")
        # The list never shows these whole, and on long runs they are the widest columns of the row.
        .defer("spec", "log_tail", "summary", "failure_reason")
        .annotate(**{f"col_{i}": _column_expr(source, path) for i, (source, path) in enumerate(columns)})
    )
    descending = filters.sort.startswith("-")
    key = filters.sort.lstrip("-")
    source, _, path = key.partition(".")
    if source in ("config", "summary") and COLUMN_PATH.fullmatch(path):
        expr = _column_expr(source, path, text=False)
        runs = runs.order_by(expr.desc(nulls_last=True) if descending else expr.asc(nulls_last=True), "-id")
    else:
        runs = runs.order_by(*RUN_SORTS.get(filters.sort, RUN_SORTS[""]))
    if filters.status:
        runs = runs.filter(status=filters.status)
    if filters.kind:
        runs = runs.filter(kind=filters.kind)
    if filters.health:
        runs = runs.filter(health=filters.health)
    if filters.learning:
        if filters.learning in LEARNING_FILTERS:  # an unknown value filters nothing, as an unknown status matches none
            runs = runs.filter(**learning_filter(filters.learning))
        else:
            runs = runs.none()
    if filters.tag:
        runs = runs.filter(tags__contains=[filters.tag])  # jsonb @> ['tag'], served by the GIN index on tags
    if filters.owner:
        runs = runs.filter(created_by__username=filters.owner)
    if filters.q:
        runs = runs.filter(name__icontains=filters.q)  # ILIKE '%q%', served by the trigram index on name
    if filters.dataset:
        runs = runs.filter(dataset_version__dataset__name__icontains=filters.dataset)
    if filters.reward:
        runs = runs.filter(reward_version__config__name__icontains=filters.reward)
    result = Paginator(runs, per_page).get_page(page)
    sparklines = run_sparklines(run_ids=[r.pk for r in result])
    for run in result:
        run.sparkline = sparklines.get(run.pk, [])  # type: ignore[attr-defined]  # for the page, not a model field
        run.columns = [getattr(run, f"col_{i}") or "" for i in range(len(columns))]  # type: ignore[attr-defined]
    return result


def run_sparklines(
    *, run_ids: list[int], name: str = SPARKLINE_METRIC, points: int = SPARKLINE_POINTS
) -> dict[int, list[tuple[int, float]]]:
    """Each run's `name` series sampled at `points` equal step buckets, in ONE query for all the runs.

    Per bucket it takes the first point at or after the bucket's start: one probe of the covering index
    (run, name, step) include value, so the cost is runs x points index probes whatever the runs' lengths (a
    bucket mean would read every point: 200k for one long run). Sampling can miss a one-step spike; a sparkline
    shows the trend, and the run page's charts keep the min/max envelope. Returns run id -> [(step, value), ...]
    in step order; runs without the metric are absent."""
    if not run_ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH bounds AS (
              SELECT page.run_id,
                     (SELECT step FROM runs_metricpoint WHERE run_id = page.run_id AND name = %(name)s
                      ORDER BY step LIMIT 1) AS lo,
                     (SELECT step FROM runs_metricpoint WHERE run_id = page.run_id AND name = %(name)s
                      ORDER BY step DESC LIMIT 1) AS hi
              FROM unnest(%(ids)s::bigint[]) AS page(run_id)
            )
            SELECT DISTINCT b.run_id, p.step, p.value
            FROM bounds b
            CROSS JOIN LATERAL generate_series(0, %(n)s - 1) AS k(i)
            CROSS JOIN LATERAL (
              SELECT m.step, m.value FROM runs_metricpoint m
              WHERE m.run_id = b.run_id AND m.name = %(name)s AND m.step >= b.lo + (b.hi - b.lo + 1) * k.i / %(n)s
              ORDER BY m.step LIMIT 1
            ) p
            WHERE b.lo IS NOT NULL
            ORDER BY 1, 2
            """,
            {"ids": list(run_ids), "name": name, "n": points},
        )
        series: dict[int, list[tuple[int, float]]] = {}
        for run_id, step, value in cursor.fetchall():
            series.setdefault(run_id, []).append((step, value))
    return series


def user_launched_a_run(user: User) -> bool:
    """Whether `user` has created any run (the runs list shows newcomers where to start)."""
    return Run.objects.filter(created_by=user).exists()


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
