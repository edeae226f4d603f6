"""The trajectory browser (`/runs/<id>/trajectories/`) and the run comparison (`/runs/compare/`)."""

from __future__ import annotations

from typing import Any

from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from apps.accounts.models import Capability
from apps.common.pages import needs
from apps.review.models import Flag
from apps.rewards.services import reward_spec_diff
from apps.runs import selectors
from apps.runs.models import Run, TrajectorySummary

PAGE = 100
ORDERS = {"reward": "-reward", "-reward": "reward", "step": "step", "-step": "-step", "recent": "-id"}


def _number(raw: str | None, name: str, errors: list[str], cast: type = float) -> Any:
    if raw in (None, ""):
        return None
    try:
        return cast(raw)
    except ValueError:
        errors.append(f"{name}: {raw!r} is not a number")
        return None


def trajectory_filter(run: Run, params: Any, errors: list[str]) -> QuerySet[TrajectorySummary]:
    """The run's trajectory summaries matching task (substring), reward range, step and flag filters."""
    qs = TrajectorySummary.objects.filter(run=run)
    if task := (params.get("task") or "").strip():
        qs = qs.filter(task_id__icontains=task)
    low = _number(params.get("min_reward"), "min_reward", errors)
    high = _number(params.get("max_reward"), "max_reward", errors)
    step = _number(params.get("step"), "step", errors, int)
    if low is not None:
        qs = qs.filter(reward__gte=low)
    if high is not None:
        qs = qs.filter(reward__lte=high)
    if step is not None:
        qs = qs.filter(step=step)
    flag = (params.get("flag") or "").strip()
    if flag:
        flags = Flag.objects.filter(run=run, trajectory_ref=OuterRef("trajectory_id"))
        if flag == "none":
            qs = qs.filter(~Exists(flags))
        else:
            qs = qs.filter(Exists(flags if flag == "any" else flags.filter(detector=flag)))
    return qs


@needs(Capability.READ)
def trajectory_browser(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(Run, pk=run_id)
    errors: list[str] = []
    qs = trajectory_filter(run, request.GET, errors)
    order = request.GET.get("order", "recent")
    qs = qs.order_by(ORDERS.get(order, "-id"), "-id")
    page = _number(request.GET.get("page"), "page", errors, int) or 1
    page = max(1, page)
    # No COUNT over a million rows: fetch one row more than a page to know whether there is a next one.
    rows = list(qs[(page - 1) * PAGE : page * PAGE + 1])
    more = len(rows) > PAGE
    rows = rows[:PAGE]
    flags_by_ref: dict[str, list[Flag]] = {}
    for flag in Flag.objects.filter(run=run, trajectory_ref__in=[r.trajectory_id for r in rows]).only(
        "trajectory_ref", "detector", "severity"
    ):
        flags_by_ref.setdefault(flag.trajectory_ref, []).append(flag)
    detectors = sorted(Flag.objects.filter(run=run).values_list("detector", flat=True).distinct())
    query = request.GET.copy()
    query.pop("page", None)
    return render(
        request,
        "runs/trajectories.html",
        {
            "run": run,
            "rows": [(row, flags_by_ref.get(row.trajectory_id, [])) for row in rows],
            "errors": errors,
            "page": page,
            "more": more,
            "detectors": detectors,
            "params": request.GET,
            "query": query.urlencode(),
            "order": order,
        },
    )


def _spec_of(run: Run) -> dict[str, Any]:
    return dict(run.spec.get("config") or run.spec)


@needs(Capability.READ)
def run_compare(request: HttpRequest) -> HttpResponse:
    """Two or more runs: their metric curves overlaid (server-downsampled), their config diff and reward diff."""
    ids = [int(v) for v in request.GET.getlist("run") if v.isdigit()][:6]
    runs = list(Run.objects.filter(pk__in=ids).select_related("reward_version__config", "created_by"))
    runs.sort(key=lambda r: ids.index(r.pk))
    errors = [] if len(runs) >= 2 else ["pick at least two runs (?run=1&run=2)"]
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
    series = {
        name: [
            {"run": r.pk, **selectors.metric_series(run_id=r.pk, name=name, max_points=500)}
            for r in runs
            if name in names_of[r.pk]
        ]
        for name in names[:24]
    }
    return render(
        request,
        "runs/compare.html",
        {
            "runs": runs,
            "base": base,
            "diffs": diffs,
            "errors": errors,
            "series": series,
            "recent": Run.objects.order_by("-created_at").only("pk", "name", "kind")[:50],
            "selected": ids,
        },
    )
