"""Search pages (under /search/, namespace "search"): corpus indexes with a form to build one, and synthetic-task
generation (the launch form, the list of datagen runs, one run's verification report; progress streams on the
run's own page)."""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path
from django.views.decorators.http import require_http_methods
from rest_framework.exceptions import ValidationError

from apps.accounts.decorators import needs
from apps.accounts.models import Capability
from apps.accounts.permissions import request_user
from apps.common.errors import validation_messages
from apps.common.forms import number_fields, posted_numbers, posted_values
from apps.datasets.models import DatasetKind, DatasetVersion
from apps.runs import selectors
from apps.runs.models import RunKind
from apps.search.models import CorpusIndex
from apps.search.selectors import datagen_report
from apps.search.services.datagen import datagen_launch
from apps.search.services.indexes import index_launch_or_reuse
from workers.search.index import IndexConfig
from workers.search.synth_params import DROP_REASONS, SynthParams


@needs(Capability.READ)
@require_http_methods(["GET", "POST"])
def indexes(request: HttpRequest) -> HttpResponse:
    corpora = DatasetVersion.objects.filter(dataset__kind=DatasetKind.CORPUS).select_related("dataset")
    errors: list[str] = []
    config_text = request.POST.get("config") or json.dumps(IndexConfig().model_dump(mode="json"), indent=2)
    if request.method == "POST":
        if not request_user(request).can(Capability.LAUNCH):
            raise PermissionDenied("your role cannot build indexes (needs 'launch')")
        try:
            corpus_version = corpora.get(pk=int(request.POST.get("corpus_version", "0")))
        except (ValueError, DatasetVersion.DoesNotExist):
            errors.append("corpus_version: pick a version of a corpus dataset")
        else:
            try:
                config = json.loads(config_text)
            except ValueError as exc:
                errors.append(f"config: not valid JSON ({exc})")
            else:
                try:
                    index, _ = index_launch_or_reuse(
                        corpus_version=corpus_version,
                        config=config,
                        user=request_user(request),
                    )
                except ValidationError as exc:
                    errors = validation_messages(exc)
                else:
                    return redirect("runs:detail", run_id=index.run_id)
    rows = list(CorpusIndex.objects.select_related("corpus_version__dataset", "run", "created_by")[:200])
    for row in rows:
        row.build_speed = _chunks_per_second(row.stats or {})  # type: ignore[attr-defined]
    return render(
        request,
        "search/index_list.html",
        {
            "indexes": rows,
            "corpora": corpora,
            "errors": errors,
            "config_text": config_text,
            "config_fields": [(name, f.description) for name, f in IndexConfig.model_fields.items()],
        },
    )


def _chunks_per_second(stats: dict[str, Any]) -> float | None:
    """Chunks indexed per second of the build (BM25 and embeddings), from the manifest; None before it is ready."""
    manifest = stats.get("manifest") or {}
    seconds = sum(float(v) for v in (manifest.get("build_seconds") or {}).values())
    chunks = manifest.get("chunks")
    return round(chunks / seconds, 1) if chunks and seconds > 0 else None


# The form's numeric fields, in order, with their help text from the typed parameters.
NUMBER_FIELDS = (
    "num_tasks",
    "max_hops",
    "distractors",
    "min_distractors",
    "seed",
    "max_candidates",
    "wide_min_rows",
    "wide_max_rows",
)
TEXT_FIELDS = ("shape", "wide_style", "wide_columns")
SAMPLE_TASKS = 5


def _params_from_post(post: Any) -> dict[str, Any]:
    """Form values as parameters: blank fields take the defaults; a value that is not a whole number is passed on
    as typed, so the typed check names the field."""
    params: dict[str, Any] = {"generator": post.get("generator", "template") or "template"}
    if params["generator"] == "llm" and post.get("model", "").strip():
        params["model"] = post["model"].strip()
    params.update(posted_numbers(post, NUMBER_FIELDS))
    for name in TEXT_FIELDS:
        raw = post.get(name, "").strip()
        if raw:
            params[name] = raw
    return params


@needs(Capability.LAUNCH)
@require_http_methods(["GET", "POST"])
def datagen_new(request: HttpRequest) -> HttpResponse:
    corpora = (
        DatasetVersion.objects.filter(dataset__kind=DatasetKind.CORPUS)
        .select_related("dataset")
        .order_by("dataset__name", "-number")
    )
    errors: list[str] = []
    values: dict[str, str] = {}
    if request.method == "POST":
        values = posted_values(request)
        raw = request.POST.get("corpus_version", "")
        corpus_version = corpora.filter(pk=int(raw)).first() if raw.isdigit() else None
        if corpus_version is None:
            errors.append("corpus_version: pick a version of a corpus dataset")
        else:
            try:
                run = datagen_launch(
                    corpus_version=corpus_version,
                    target_dataset=request.POST.get("target_dataset", "").strip(),
                    params=_params_from_post(request.POST),
                    user=request_user(request),
                )
            except ValidationError as exc:
                errors = validation_messages(exc)
            else:
                return redirect("runs:detail", run_id=run.pk)
    defaults = SynthParams()
    fields = number_fields(SynthParams, NUMBER_FIELDS, values)
    return render(
        request,
        "search/datagen_new.html",
        {
            "corpora": corpora,
            "fields": fields,
            "values": values,
            "errors": errors,
            "default_model": defaults.model,
            "default_columns": ", ".join(defaults.wide_columns),
        },
    )


@needs(Capability.READ)
def datagen_list(request: HttpRequest) -> HttpResponse:
    runs = selectors.run_list().filter(kind=RunKind.DATAGEN)[:100]
    return render(request, "search/datagen_list.html", {"runs": runs})


@needs(Capability.READ)
def datagen_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(selectors.run_list().filter(kind=RunKind.DATAGEN), pk=run_id)
    report = datagen_report(run)
    outcome = (run.summary or {}).get("datagen") or {}
    version = None
    samples: list[dict[str, Any]] = []
    if outcome.get("tasks_version"):
        version = DatasetVersion.objects.select_related("dataset").filter(pk=outcome["tasks_version"]).first()
    if version is not None:
        with version.file.open("rb") as handle:
            for line in handle:
                if line.strip():
                    samples.append(json.loads(line))
                if len(samples) >= SAMPLE_TASKS:
                    break
    dropped = []
    if report is not None:
        reasons = DROP_REASONS if report.get("per_hop") else tuple(report.get("dropped", {}))
        dropped = [(reason, report["dropped"].get(reason, 0)) for reason in reasons]
    return render(
        request,
        "search/datagen_detail.html",
        {
            "run": run,
            "report": report,
            "outcome": outcome,
            "version": version,
            "samples": samples,
            "dropped": dropped,
            "params": run.spec.get("params", {}),
        },
    )


urlpatterns = [
    path("search/indexes/", indexes, name="indexes"),
    path("search/datagen/", datagen_list, name="datagen-list"),
    path("search/datagen/new/", datagen_new, name="datagen-new"),
    path("search/datagen/<int:run_id>/", datagen_detail, name="datagen-detail"),
]


app_name = "search"
