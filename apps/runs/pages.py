"""Run pages (namespace "runs"): the runs list (the home page), a run with its live charts, checkpoints and
cancel. The comparison of runs is in `apps.runs.pages_compare`, the trajectory pages in `apps.runs.pages_trajectory`.

The trajectory page shows, for a search trajectory (workers.search.environment), each tool call and its arguments, the
passages returned (chunk id, score, which retrievers found them), pruned chunks struck through, the token usage
across turns, the final output items against the gold chunks, the reward broken down by term, and the detector
flags. Live runs keep the full record of every trajectory (a share of each step's groups plus every flagged one when
`trajectory_sample_rate` is below 1);
re-scoring runs point at the uploaded dataset file, so every re-scored trajectory opens.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path
from django.utils import timezone
from django.views.decorators.http import require_POST
from rest_framework.exceptions import ValidationError

from apps.accounts.decorators import needs
from apps.accounts.models import Capability
from apps.accounts.permissions import request_user
from apps.common.errors import validation_messages
from apps.rewards.services import reward_spec_diff
from apps.runs import chart_reads, kinds, selectors, selectors_list, services
from apps.runs.health import HEALTH_STATUSES, run_health
from apps.runs.layouts import layout_for, layout_save, scope_of
from apps.runs.learning import run_learning
from apps.runs.models import Run, RunStatus
from apps.runs.pages_compare import run_compare
from apps.runs.pages_trajectory import group_detail, trajectory_detail, trajectory_tokens

SPARKLINE_WIDTH, SPARKLINE_HEIGHT = 120, 24


def _sparkline_points(series: list[tuple[int, float]]) -> str:
    """SVG polyline points for a sparkline: steps scaled to the width, values to the height (top = highest).

    A sparkline is a 50-point glyph in a table cell, not a chart (no axes, zoom or updates), so it is drawn on
    the server as one <polyline>: nothing to re-initialise when htmx swaps the table every 5 s."""
    if len(series) < 2:
        return ""
    steps = [s for s, _ in series]
    values = [v for _, v in series]
    x0, dx = steps[0], (steps[-1] - steps[0]) or 1
    lo, dv = min(values), (max(values) - min(values)) or 1.0
    w, h = SPARKLINE_WIDTH - 2, SPARKLINE_HEIGHT - 2  # 1px margin so the stroke is not clipped
    return " ".join(f"{1 + (s - x0) * w / dx:.1f},{1 + h - (v - lo) * h / dv:.1f}" for s, v in series)


COLUMN_SUGGESTIONS = [
    *(f"config.{k}" for k in ("algorithm", "base_model", "environment", "learning_rate", "steps", "group_size")),
    *(f"config.{k}" for k in ("prompts_per_step", "seed", "mode", "lora.rank", "substeps", "learner.strategy")),
    *(f"summary.{k}" for k in ("pass@1", "start_step", "sft_loss")),
]
"""What the runs list's column box suggests (any config.<key> or summary.<key> works)."""


@needs(Capability.READ)
def runs_index(request: HttpRequest) -> HttpResponse:
    filters = selectors_list.RunListFilters.from_query(request.GET)
    page = selectors_list.run_list_page(filters=filters, page=request.GET.get("page"))
    for run in page:
        run.sparkline_points = _sparkline_points(run.sparkline)
        run.reward_last = run.sparkline[-1][1] if run.sparkline else None
        run.queue_position = selectors.queue_position(run)
    query = urlencode({k: v for k, v in asdict(filters).items() if v})
    unsorted = urlencode({k: v for k, v in asdict(filters).items() if v and k != "sort"})
    template = "runs/_table.html" if request.headers.get("HX-Request") else "runs/index.html"
    columns = [f"{source}.{path}" for source, path in filters.columns()]
    context = {
        "page": page,
        "filters": filters,
        "query": query,
        "unsorted": unsorted,
        # For a new installation (a handful of runs) and for anyone who has not launched a run yet; never on a
        # filtered list.
        "start_here": not query
        and (page.paginator.count < 5 or not selectors_list.user_launched_a_run(request_user(request))),
        "columns": columns,
        "column_problems": filters.column_problems(),
        "sortable": [
            ("name", "Name"),
            ("kind", "Kind"),
            ("status", "Status"),
            ("health", "Health"),
            ("progress", "Progress"),
        ],
        "column_suggestions": COLUMN_SUGGESTIONS,
        "statuses": RunStatus.values,
        "health_statuses": HEALTH_STATUSES,
        "learning_choices": [
            ("Reward", selectors_list.LEARNING_REWARD),
            ("Held-out eval", selectors_list.LEARNING_EVAL),
        ],
        "kinds": [handler.kind for handler in kinds.handlers()],
        "sparkline_size": (SPARKLINE_WIDTH, SPARKLINE_HEIGHT),
    }
    return render(request, template, context)


@needs(Capability.READ)
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(selectors.run_list(), pk=run_id)
    histogram = run.events.filter(kind="histogram").order_by("-seq").values_list("data", flat=True).first()
    health = run_health(run)
    if run.health != health["status"]:
        # One truth: what the page computed is what the list, the API and the live updates read from now on.
        Run.objects.filter(pk=run.pk).update(
            health=health["status"], health_problems=health["problems"], health_at=timezone.now()
        )
        run.health = health["status"]
    return render(
        request,
        "runs/detail.html",
        {
            "run": run,
            "state": selectors.run_state(run),
            "logs": run.log_tail.splitlines()[-200:],
            "artifacts": run.artifacts.order_by("name"),
            **_checkpoints_context(run),
            "spec_json": json.dumps(run.spec, indent=2, sort_keys=True),
            "parent_diff": _parent_diff(run),
            "histogram": histogram,
            "top_trajectories": run.trajectories.order_by("-reward")[:10],
            # RFT export is offered only where there is something to export (a run stopped at step 0 has nothing).
            "stored_trajectories": run.trajectories.exclude(storage_uri="").exists(),
            "panel_layout": layout_for(request_user(request), run),
            "panel_scope": scope_of(run),
            "health": health,
            # Training runs (and any run reporting a reward) head with "did it learn?" (docs/did-it-learn.md).
            "learning": run_learning(run, health["trend"]) if run.kind == "train" or health["trend"]["steps"] else None,
        },
    )


@needs(Capability.READ)
@require_POST
def run_layout_view(request: HttpRequest, run_id: int) -> JsonResponse:
    """Save the user's panel layout for this run's scope (apps.runs.layouts): a JSON body; 400 naming the field."""
    run = get_object_or_404(Run, pk=run_id)
    try:
        data = json.loads(request.body or b"null")
    except ValueError:
        return JsonResponse({"fields": {"layout": ["not valid JSON"]}}, status=400)
    try:
        layout = layout_save(request_user(request), run, data)
    except ValidationError as exc:
        return JsonResponse({"fields": exc.detail}, status=400)
    return JsonResponse({"scope": scope_of(run), "layout": layout})


def _parent_diff(run: Run) -> list[dict[str, Any]] | None:
    """Config and reward-config changes against the parent run (None without a parent): what a resumed or
    forked run changed."""
    if run.parent is None:
        return None
    rows = reward_spec_diff(run.parent.spec.get("config") or {}, run.spec.get("config") or {})
    if run.parent.reward_version_id != run.reward_version_id:
        old = run.parent.reward_version.spec if run.parent.reward_version else {}
        new = run.reward_version.spec if run.reward_version else {}
        rows += [{**row, "path": f"reward.{row['path']}"} for row in reward_spec_diff(old, new)]
    return rows


def _checkpoints_context(run: Run) -> dict[str, Any]:
    checkpoints = list(
        run.checkpoints.prefetch_related("evals__run", "evals__benchmark_version__benchmark").order_by("-step")[:20]
    )
    evals_running = any(not e.run.is_terminal for c in checkpoints for e in c.evals.all())
    # Auto-eval results arrive after the training run's own events: poll while any can still come.
    polling = evals_running or (bool(run.spec.get("auto_eval")) and not run.is_terminal)
    return {"checkpoints": checkpoints, "polling": polling}


@needs(Capability.READ)
def run_checkpoints(request: HttpRequest, run_id: int) -> HttpResponse:
    """The checkpoints section with their evals (polled by the run page while auto-evals run)."""
    run = get_object_or_404(Run, pk=run_id)
    return render(request, "runs/_checkpoints.html", {"run": run, **_checkpoints_context(run)})


@needs(Capability.READ)
def run_chart(request: HttpRequest, run_id: int) -> JsonResponse:
    run = get_object_or_404(Run, pk=run_id)
    names = selectors.metric_names(run_id=run.pk)
    series = [selectors.metric_series(run_id=run.pk, name=n, max_points=1000) for n in names]
    # The steps' wall times (from the longest series), for the charts' wall-time x-axis.
    longest = max(series, key=lambda s: s["count"])["name"] if series else None
    times = chart_reads.step_times(run_id=run.pk, name=longest) if longest else {"steps": [], "epoch": []}
    return JsonResponse({"last_seq": run.last_seq, "series": series, "times": times})


@needs(Capability.READ)
def run_distribution(request: HttpRequest, run_id: int) -> JsonResponse:
    """`?field=reward|completion_tokens|num_turns`: that value's distribution over the run's steps."""
    run = get_object_or_404(Run, pk=run_id)
    field = request.GET.get("field", "reward")
    if field not in chart_reads.DISTRIBUTION_FIELDS:
        choices = ", ".join(sorted(chart_reads.DISTRIBUTION_FIELDS))
        return JsonResponse(
            {"detail": f"field {field!r} is not one of {choices}", "fields": {"field": [choices]}}, status=400
        )
    return JsonResponse(chart_reads.trajectory_distribution(run_id=run.pk, field=field))


@needs(Capability.LAUNCH)
@require_POST
def run_cancel_view(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(Run, pk=run_id)
    try:
        services.run_cancel(run=run, user=request_user(request))
        messages.info(request, f"Cancel requested for run {run.pk}.")
    except ValidationError as exc:
        messages.error(request, "; ".join(validation_messages(exc)))
    return redirect("runs:detail", run_id=run.pk)


app_name = "runs"


@needs(Capability.READ)
def cluster_page(request: HttpRequest) -> HttpResponse:
    return render(request, "runs/cluster.html", selectors.cluster_overview())


urlpatterns = [
    path("", runs_index, name="list"),
    path("cluster/", cluster_page, name="cluster"),
    path("runs/compare/", run_compare, name="compare"),
    path("runs/<int:run_id>/", run_detail, name="detail"),
    path("runs/<int:run_id>/cancel/", run_cancel_view, name="cancel"),
    path("runs/<int:run_id>/layout/", run_layout_view, name="layout"),
    path("runs/<int:run_id>/chart.json", run_chart, name="chart"),
    path("runs/<int:run_id>/distribution.json", run_distribution, name="distribution"),
    path("runs/<int:run_id>/checkpoints/", run_checkpoints, name="checkpoints"),
    path("runs/<int:run_id>/trajectories/<str:trajectory_id>/", trajectory_detail, name="trajectory"),
    path("runs/<int:run_id>/trajectories/<str:trajectory_id>/tokens/", trajectory_tokens, name="trajectory_tokens"),
    path("runs/<int:run_id>/steps/<int:step>/groups/<int:group>/", group_detail, name="group"),
]
