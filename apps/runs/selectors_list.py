"""The runs list's reads: its filters, sort and extra columns (`RunListFilters`, from the page's query string), one
page of runs with their reward sparklines (`run_list_page`, `run_sparklines`), the `learning=` filter the list and
the API share, and whether a user has launched a run yet. The run page's reads are in `apps.runs.selectors`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.core.paginator import Page, Paginator
from django.db import connection
from django.db.models import Case, Value, When
from django.db.models.fields.json import KeyTextTransform, KeyTransform

from apps.accounts.models import User
from apps.runs.models import Run

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
