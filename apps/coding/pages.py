"""Coding pages (under /coding/, namespace "coding"): repository-task import and generation runs, a form for each,
and one run's report (kept and refused or dropped tasks by reason, the suite's statistics beside CursorBench's);
progress streams on the run's own page."""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path
from django.views.decorators.http import require_http_methods
from rest_framework.exceptions import ValidationError

from apps.accounts.decorators import needs
from apps.accounts.models import Capability
from apps.accounts.permissions import request_user
from apps.coding.services import CODEGEN, REPOIMPORT, REPOMINE, codegen_launch, job_report, repo_import_launch
from apps.common.errors import validation_messages
from apps.common.forms import number_fields, posted_numbers, posted_values
from apps.datasets.models import DatasetKind, DatasetVersion
from apps.runs import selectors
from workers.coding.candidates import CodegenParams
from workers.coding.libraries import vendored_sources
from workers.coding.task import is_unverified

SAMPLE_TASKS = 10


@needs(Capability.READ)
def index(request: HttpRequest) -> HttpResponse:
    runs = selectors.run_list().filter(kind__in=[REPOIMPORT, CODEGEN, REPOMINE])[:100]
    suites = (
        DatasetVersion.objects.filter(dataset__kind=DatasetKind.REPO_TASKS)
        .select_related("dataset")
        .order_by("dataset__name", "-number")[:50]
    )
    return render(request, "coding/index.html", {"runs": runs, "suites": suites})


@needs(Capability.LAUNCH)
@require_http_methods(["GET", "POST"])
def import_new(request: HttpRequest) -> HttpResponse:
    errors: list[str] = []
    values: dict[str, str] = {}
    if request.method == "POST":
        values = posted_values(request)
        upload = request.FILES.get("file")
        if upload is None:
            errors.append("file: choose a JSONL file or a zip/tar.gz bundle of tasks")
        else:
            try:
                run = repo_import_launch(
                    target_dataset=request.POST.get("target_dataset", "").strip(),
                    data=upload.read(),
                    filename=upload.name or "upload",
                    notes=request.POST.get("notes", ""),
                    keep_valid=request.POST.get("keep_valid") == "on",
                    user=request_user(request),
                )
            except ValidationError as exc:
                errors = validation_messages(exc)
            else:
                return redirect("coding:run", run_id=run.pk)
    return render(request, "coding/import_new.html", {"errors": errors, "values": values})


GENERATE_NUMBERS = ("max_tasks", "max_candidates", "seed", "mutations_per_function", "test_timeout_seconds", "workers")


def _generate_params(post: Any) -> dict[str, Any]:
    """Form values as parameters: blank fields take the defaults; a value that is not a number is passed on as
    typed, so the typed check names the field."""
    params: dict[str, Any] = {}
    if sources := post.getlist("sources"):
        params["sources"] = sources
    if families := post.getlist("families"):
        params["families"] = families
    if operators := post.getlist("operators"):
        params["operators"] = operators
    if post.get("single_site") == "on":
        params["single_site"] = True
    if style := post.get("instruction_style", "").strip():
        params["instruction_style"] = style
    return {**params, **posted_numbers(post, GENERATE_NUMBERS)}


@needs(Capability.LAUNCH)
@require_http_methods(["GET", "POST"])
def generate_new(request: HttpRequest) -> HttpResponse:
    errors: list[str] = []
    values: dict[str, Any] = {}
    if request.method == "POST":
        values = posted_values(request)
        values["sources"] = request.POST.getlist("sources")
        values["families"] = request.POST.getlist("families")
        values["operators"] = request.POST.getlist("operators")
        benchmark: dict[str, Any] | None = None
        if name := request.POST.get("benchmark_name", "").strip():
            raw = request.POST.get("test_fraction", "").strip() or "0.25"
            try:
                benchmark = {"name": name, "test_fraction": float(raw)}
            except ValueError:
                benchmark = {"name": name, "test_fraction": raw}  # the check names it
        try:
            run = codegen_launch(
                target_dataset=request.POST.get("target_dataset", "").strip(),
                params=_generate_params(request.POST),
                benchmark=benchmark,
                user=request_user(request),
            )
        except ValidationError as exc:
            errors = validation_messages(exc)
        else:
            return redirect("coding:run", run_id=run.pk)
    defaults = CodegenParams()
    fields = number_fields(CodegenParams, GENERATE_NUMBERS, values)
    chosen_sources = values.get("sources") or defaults.sources
    chosen_families = values.get("families") or defaults.families
    chosen_operators = values.get("operators") or defaults.operators
    described = CodegenParams.model_fields
    return render(
        request,
        "coding/generate_new.html",
        {
            "errors": errors,
            "values": values,
            "fields": fields,
            "sources": [(source, source.name in chosen_sources) for source in vendored_sources().values()],
            "families": [(family, family in chosen_families) for family in ("repair", "implement")],
            "operators": [(operator, operator in chosen_operators) for operator in defaults.operators],
            "single_site": values.get("single_site") == "on" if values else defaults.single_site,
            "single_site_help": described["single_site"].description or "",
            "instruction_styles": ("varied", "pinpoint"),
            "instruction_style": values.get("instruction_style") or defaults.instruction_style,
            "instruction_style_help": described["instruction_style"].description or "",
        },
    )


def _sample_rows(version: DatasetVersion) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with version.file.open("rb") as handle:
        for line in handle:
            if line.strip():
                row = json.loads(line)
                rows.append({**row, "unverified": is_unverified(row)})  # also a patchless row stored before the flag
            if len(rows) >= SAMPLE_TASKS:
                break
    return rows


@needs(Capability.READ)
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(selectors.run_list().filter(kind__in=[REPOIMPORT, CODEGEN, REPOMINE]), pk=run_id)
    report = job_report(run)
    outcome = (run.summary or {}).get("repo_tasks") or {}
    version = None
    if outcome.get("version"):
        version = DatasetVersion.objects.select_related("dataset").filter(pk=outcome["version"]).first()
    dropped: list[tuple[str, int]] = []
    if report is not None:
        reasons = report.get("dropped") or (report.get("mining") or {}).get("dropped") or {}
        dropped = sorted(((k, v) for k, v in reasons.items() if v), key=lambda item: -item[1])
    return render(
        request,
        "coding/run.html",
        {
            "run": run,
            "report": report,
            "outcome": outcome,
            "version": version,
            "samples": _sample_rows(version) if version is not None else [],
            "dropped": dropped,
            "statistics": (report or {}).get("statistics"),
        },
    )


urlpatterns = [
    path("coding/", index, name="index"),
    path("coding/import/", import_new, name="import"),
    path("coding/generate/", generate_new, name="generate"),
    path("coding/runs/<int:run_id>/", run_detail, name="run"),
]


app_name = "coding"
