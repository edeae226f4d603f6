"""htmx pages. Each view checks the role, calls one service or selector, and renders a page or a partial."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST
from rest_framework.exceptions import ValidationError

from apps.accounts.models import Capability
from apps.common.errors import validation_messages
from apps.common.pages import needs
from apps.datasets.models import Dataset, DatasetKind
from apps.datasets.services import (
    corpus_chunk_sample,
    dataset_create,
    dataset_file_check_size,
    dataset_version_create,
)
from apps.rewards.models import RewardConfig, RewardConfigVersion
from apps.rewards.services import reward_config_create, reward_spec_diff, reward_version_create
from apps.runs import kinds, selectors, services
from apps.runs.models import Run, RunStatus
from workers.rewards.schema import TERM_TYPES, context1_spec


def healthz(request: HttpRequest) -> JsonResponse:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"ok": True})


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


@needs(Capability.READ)
def runs_index(request: HttpRequest) -> HttpResponse:
    filters = selectors.RunListFilters.from_query(request.GET)
    page = selectors.run_list_page(filters=filters, page=request.GET.get("page"))
    for run in page:
        run.sparkline_points = _sparkline_points(run.sparkline)  # type: ignore[attr-defined]
        run.reward_last = run.sparkline[-1][1] if run.sparkline else None  # type: ignore[attr-defined]
    query = urlencode({k: v for k, v in asdict(filters).items() if v})
    template = "runs/_table.html" if request.headers.get("HX-Request") else "runs/index.html"
    context = {
        "page": page,
        "filters": filters,
        "query": query,
        "statuses": RunStatus.values,
        "kinds": [handler.kind for handler in kinds.handlers()],
        "sparkline_size": (SPARKLINE_WIDTH, SPARKLINE_HEIGHT),
    }
    return render(request, template, context)


@needs(Capability.READ)
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(selectors.run_list(), pk=run_id)
    histogram = run.events.filter(kind="histogram").order_by("-seq").values_list("data", flat=True).first()
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
        },
    )


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
    return JsonResponse({"last_seq": run.last_seq, "series": series})


@needs(Capability.LAUNCH)
@require_POST
def run_cancel_view(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(Run, pk=run_id)
    try:
        services.run_cancel(run=run, user=request.user)  # type: ignore[arg-type]
        messages.info(request, f"Cancel requested for run {run.pk}.")
    except ValidationError as exc:
        messages.error(request, "; ".join(validation_messages(exc)))
    return redirect("web:run", run_id=run.pk)


@needs(Capability.READ)
@require_http_methods(["GET", "POST"])
def datasets_index(request: HttpRequest) -> HttpResponse:
    errors: list[str] = []
    if request.method == "POST":
        if not request.user.can(Capability.LAUNCH):  # type: ignore[union-attr]
            raise PermissionDenied("your role cannot create datasets")
        try:
            dataset = dataset_create(
                name=request.POST.get("name", "").strip(),
                kind=request.POST.get("kind", ""),
                description=request.POST.get("description", ""),
                owner=request.user,
            )  # type: ignore[arg-type]
        except ValidationError as exc:
            errors = validation_messages(exc)
        else:
            return redirect("web:dataset", dataset_id=dataset.pk)
    datasets = Dataset.objects.select_related("owner").order_by("name")
    return render(
        request, "datasets/index.html", {"datasets": datasets, "kinds": DatasetKind.choices, "errors": errors}
    )


CORPUS_SAMPLE_CHUNKS = 20


@needs(Capability.READ)
@require_http_methods(["GET", "POST"])
def dataset_detail(request: HttpRequest, dataset_id: int) -> HttpResponse:
    dataset = get_object_or_404(Dataset, pk=dataset_id)
    is_corpus = dataset.kind == DatasetKind.CORPUS
    errors: list[str] = []
    if request.method == "POST":
        if not request.user.can(Capability.LAUNCH):  # type: ignore[union-attr]
            raise PermissionDenied("your role cannot upload dataset versions")
        upload = request.FILES.get("file")
        if upload is None:
            errors.append("file: choose a file to upload")
        else:
            try:
                dataset_file_check_size(upload.size or 0)
                version = dataset_version_create(
                    dataset=dataset,
                    data=upload.read(),
                    filename=upload.name or "data.jsonl",
                    created_by=request.user,  # type: ignore[arg-type]
                    notes=request.POST.get("notes", ""),
                    chunker=request.POST.get("chunker", "") if is_corpus else None,
                )
                if is_corpus:
                    report = version.validation_report
                    messages.info(request, f"Chunked {report['documents']} documents into {report['chunks']} chunks.")
                else:
                    messages.info(request, "Uploaded and validated.")
                return redirect("web:dataset", dataset_id=dataset.pk)
            except ValidationError as exc:
                errors = validation_messages(exc)
    versions = list(dataset.versions.select_related("created_by").order_by("-number"))
    shown = versions[0] if versions else None
    if is_corpus and request.GET.get("version"):
        shown = next((v for v in versions if str(v.number) == request.GET["version"]), shown)
    context = {
        "dataset": dataset,
        "versions": versions,
        "errors": errors,
        "is_corpus": is_corpus,
        "shown": shown,
        "chunks": corpus_chunk_sample(version=shown, limit=CORPUS_SAMPLE_CHUNKS) if is_corpus and shown else [],
        "chunker_text": request.POST.get("chunker", "") if request.method == "POST" else "",
    }
    return render(request, "datasets/detail.html", context)


@needs(Capability.READ)
@require_http_methods(["GET", "POST"])
def rewards_index(request: HttpRequest) -> HttpResponse:
    errors: list[str] = []
    spec_text = request.POST.get("spec") or json.dumps(context1_spec().model_dump(mode="json"), indent=2)
    if request.method == "POST":
        if not request.user.can(Capability.LAUNCH):  # type: ignore[union-attr]
            raise PermissionDenied("your role cannot create reward configs")
        try:
            spec = json.loads(spec_text)
        except ValueError as exc:
            errors.append(f"spec: not valid JSON ({exc})")
        else:
            try:
                config = reward_config_create(
                    name=request.POST.get("name", "").strip(),
                    spec=spec,
                    description=request.POST.get("description", ""),
                    owner=request.user,
                )  # type: ignore[arg-type]
            except ValidationError as exc:
                errors = validation_messages(exc)
            else:
                return redirect("web:reward", config_id=config.pk)
    configs = RewardConfig.objects.select_related("owner").prefetch_related("versions").order_by("name")
    return render(
        request,
        "rewards/index.html",
        {"configs": configs, "errors": errors, "spec_text": spec_text, "term_types": TERM_TYPES},
    )


@needs(Capability.READ)
@require_http_methods(["GET", "POST"])
def reward_detail(request: HttpRequest, config_id: int) -> HttpResponse:
    config = get_object_or_404(RewardConfig, pk=config_id)
    versions = list(config.versions.select_related("created_by").prefetch_related("runs").order_by("-number"))
    errors: list[str] = []
    spec_text = request.POST.get("spec") or (json.dumps(versions[0].spec, indent=2) if versions else "{}")
    if request.method == "POST":
        if not request.user.can(Capability.LAUNCH):  # type: ignore[union-attr]
            raise PermissionDenied("your role cannot edit reward configs")
        try:
            version = reward_version_create(
                config=config,
                spec=json.loads(spec_text),
                created_by=request.user,  # type: ignore[arg-type]
                notes=request.POST.get("notes", ""),
            )
        except ValueError as exc:
            errors.append(f"spec: not valid JSON ({exc})")
        except ValidationError as exc:
            errors = validation_messages(exc)
        else:
            messages.info(request, f"Saved as version {version.number}.")
            return redirect("web:reward", config_id=config.pk)
    return render(
        request,
        "rewards/detail.html",
        {"config": config, "versions": versions, "errors": errors, "spec_text": spec_text},
    )


@needs(Capability.READ)
def reward_diff(request: HttpRequest, old_id: int, new_id: int) -> HttpResponse:
    old = get_object_or_404(RewardConfigVersion.objects.select_related("config"), pk=old_id)
    new = get_object_or_404(RewardConfigVersion.objects.select_related("config"), pk=new_id)
    return render(
        request, "rewards/diff.html", {"old": old, "new": new, "changes": reward_spec_diff(old.spec, new.spec)}
    )
