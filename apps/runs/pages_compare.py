"""The comparison of runs (`/runs/compare/`): a picker that finds runs by name, tag and kind and says which have
curves, then the chosen runs' metric curves overlaid (server-downsampled), which metrics each run has, and their
config and reward diffs. Everything the page shows is in its query string (`run`, `q`, `tag`, `kind`, `metric`,
`group`), so a comparison is a link."""

from __future__ import annotations

from typing import Any

from django.db.models import Exists, OuterRef
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from apps.accounts.decorators import needs
from apps.accounts.models import Capability
from apps.rewards.services import reward_spec_diff
from apps.runs import kinds, selectors, selectors_list
from apps.runs.layouts import DEFAULT_PINNED
from apps.runs.models import MetricPoint, Run

MAX_RUNS = 6
MAX_CHARTS = 24
CANDIDATES = 25
NO_CURVES = {
    "eval": "no curves: an eval reports a result per task (open its run for the scores)",
    "index": "no curves: an index build reports its progress only",
    "datagen": "no curves: data generation reports its progress only",
}


def _spec_of(run: Run) -> dict[str, Any]:
    return dict(run.spec.get("config") or run.spec)


def _ids(request: HttpRequest) -> list[int]:
    ids: list[int] = []
    for value in request.GET.getlist("run"):
        if value.isdigit() and int(value) not in ids:
            ids.append(int(value))
    return ids[:MAX_RUNS]


def _with_curves(runs: list[Run]) -> list[Run]:
    """Each run with `has_curves` (one probe of the series index per run) and, without curves, why."""
    has = dict(
        Run.objects.filter(pk__in=[r.pk for r in runs])
        .annotate(has=Exists(MetricPoint.objects.filter(run_id=OuterRef("pk"))))
        .values_list("pk", "has")
    )
    for run in runs:
        run.has_curves = has.get(run.pk, False)  # type: ignore[attr-defined]  # for the page only
        run.no_curves = (  # type: ignore[attr-defined]
            "" if run.has_curves else NO_CURVES.get(run.kind, "no curves yet: it has logged no metric")  # type: ignore[attr-defined]
        )
    return runs


def candidates(*, q: str, tag: str, kind: str, chosen: list[Run]) -> list[Run]:
    """The picker's rows: the chosen runs first (in their order), then up to CANDIDATES others matching the search,
    newest first, on the runs list's own filters and indexes; every row with `has_curves` (one query for all)."""
    filters = selectors_list.RunListFilters(q=q, tag=tag, kind=kind)
    picked = {r.pk for r in chosen}
    found = [
        r for r in selectors_list.run_list_page(filters=filters, page=1, per_page=CANDIDATES) if r.pk not in picked
    ]
    return _with_curves([*chosen, *found])


def _charted(names: list[str], asked: list[str]) -> list[str]:
    """The metrics drawn: the ones asked for (`metric=`), else the run page's pinned defaults first, then the rest
    by name, at most MAX_CHARTS (the page lists every metric and lets people tick others)."""
    if asked:
        return [n for n in asked if n in names][:MAX_CHARTS]
    first = [n for n in DEFAULT_PINNED if n in names]
    return (first + [n for n in names if n not in first])[:MAX_CHARTS]


@needs(Capability.READ)
def run_compare(request: HttpRequest) -> HttpResponse:
    ids = _ids(request)
    q, tag, kind = (request.GET.get(k, "").strip()[:200] for k in ("q", "tag", "kind"))
    runs = list(Run.objects.filter(pk__in=ids).select_related("reward_version__config", "created_by"))
    runs.sort(key=lambda r: ids.index(r.pk))
    errors = [] if len(runs) >= 2 else ["pick at least two runs: tick them below (or ?run=1&run=2)"]
    missing = [pk for pk in ids if pk not in {r.pk for r in runs}]
    if missing:
        errors.append(f"run {', '.join(map(str, missing))}: no such run")
    base = runs[0] if runs else None
    diffs = []
    for other in runs[1:]:
        assert base is not None
        reward_changes = (
            reward_spec_diff(base.reward_version.spec, other.reward_version.spec)
            if base.reward_version and other.reward_version
            else []
        )
        diffs.append(
            {
                "run": other,
                "config": reward_spec_diff(_spec_of(base), _spec_of(other)),
                "reward": reward_changes,
                "same_reward": base.reward_version_id == other.reward_version_id,
            }
        )
    names_of = {r.pk: set(selectors.metric_names(run_id=r.pk)) for r in runs}
    names = sorted(set().union(*names_of.values())) if names_of else []
    charted = _charted(names, request.GET.getlist("metric"))
    series = {
        name: [
            {"run": r.pk, **selectors.metric_series(run_id=r.pk, name=name, max_points=500)}
            for r in runs
            if name in names_of[r.pk]
        ]
        for name in charted
    }
    matrix = [{"name": n, "charted": n in charted, "has": [n in names_of[r.pk] for r in runs]} for n in names]
    group_by = request.GET.get("group", "").strip()[:120]
    groups: dict[int, str] = {}
    if group_by:
        source, _, key_path = group_by.partition(".")
        if source not in ("config", "summary") or not key_path:
            errors.append(f"group by {group_by!r}: write config.<key> or summary.<key>")
            group_by = ""
        for run in runs:
            value: Any = _spec_of(run) if source == "config" else (run.summary or {})
            for key in key_path.split("."):
                value = value.get(key) if isinstance(value, dict) else None
            run.group_value = groups[run.pk] = "(none)" if value is None else str(value)  # type: ignore[attr-defined]
    return render(
        request,
        "runs/compare.html",
        {
            "group_by": group_by,
            "groups": groups,
            "runs": runs,
            "base": base,
            "diffs": diffs,
            "errors": errors,
            "series": series,
            "matrix": matrix,
            "charted": len(charted),
            "max_charts": MAX_CHARTS,
            "candidates": candidates(q=q, tag=tag, kind=kind, chosen=runs),
            "selected": ids,
            "q": q,
            "tag": tag,
            "kind": kind,
            "kinds": [handler.kind for handler in kinds.handlers()],
            "max_runs": MAX_RUNS,
        },
    )
