"""Benchmark and eval pages (under /benchmarks/, URL namespace "benchmarks")."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import path
from rest_framework.exceptions import ValidationError

from apps.accounts.decorators import needs
from apps.accounts.models import Capability
from apps.benchmarks import selectors
from apps.benchmarks.models import Benchmark, BenchmarkVersion, Eval
from apps.common.errors import validation_messages
from apps.runs.models import TaskResult
from workers.coding.stats import suite_statistics
from workers.coding.task import is_unverified
from workers.envs.registry import ENVIRONMENTS

app_name = "benchmarks"


@needs(Capability.READ)
def benchmark_list(request: HttpRequest) -> HttpResponse:
    benchmarks = Benchmark.objects.select_related("owner").prefetch_related("versions").order_by("name")
    evals = Eval.objects.select_related("run", "benchmark_version__benchmark", "checkpoint").order_by("-created_at")
    return render(request, "benchmarks/index.html", {"benchmarks": benchmarks, "evals": evals[:50]})


@needs(Capability.READ)
def version_detail(request: HttpRequest, version_id: int) -> HttpResponse:
    version = get_object_or_404(BenchmarkVersion.objects.select_related("benchmark", "created_by"), pk=version_id)
    tasks = version.tasks.order_by("task_id")
    evals = version.evals.select_related("run", "checkpoint", "benchmark_version__benchmark").order_by("-created_at")[
        :50
    ]
    statistics = None
    shown = list(tasks[:200])
    environment = ENVIRONMENTS.get(version.benchmark.environment)
    if environment is not None and environment.dataset_kind == "repo_tasks":  # repository tasks: the suite's shape
        statistics = suite_statistics(version.tasks.values_list("payload", flat=True))
        for task in shown:
            task.unverified = is_unverified(task.payload)  # type: ignore[attr-defined]  # marked in the task list
    return render(
        request,
        "benchmarks/version.html",
        {
            "version": version,
            "statistics": statistics,
            "tasks": shown,
            "evals": evals,
            "excluded": version.excluded_training_data.select_related("dataset"),
            "gates": version.gates.all(),
        },
    )


def _eval_context(evaluation: Eval) -> dict[str, object]:
    results = TaskResult.objects.filter(run_id=evaluation.run_id).order_by("task_id")
    return {"eval": evaluation, "run": evaluation.run, "results": results, "failed": results.filter(passed=0).count()}


@needs(Capability.READ)
def eval_detail(request: HttpRequest, eval_id: int) -> HttpResponse:
    evaluation = get_object_or_404(
        Eval.objects.select_related("run", "benchmark_version__benchmark", "checkpoint"), pk=eval_id
    )
    others = Eval.objects.filter(benchmark_version__benchmark=evaluation.benchmark_version.benchmark).exclude(
        pk=evaluation.pk
    )
    others = others.select_related("checkpoint", "benchmark_version__benchmark").order_by("-created_at")[:30]
    context = {**_eval_context(evaluation), "others": others}
    return render(request, "benchmarks/eval.html", context)


@needs(Capability.READ)
def eval_results_partial(request: HttpRequest, eval_id: int) -> HttpResponse:
    """The per-task table; the page polls it while the eval runs (the run's progress itself is on the websocket)."""
    evaluation = get_object_or_404(Eval.objects.select_related("run"), pk=eval_id)
    return render(request, "benchmarks/_eval_results.html", _eval_context(evaluation))


@needs(Capability.READ)
def eval_compare(request: HttpRequest) -> HttpResponse:
    errors: list[str] = []
    comparison = None
    before_id, after_id = request.GET.get("before", ""), request.GET.get("after", "")
    slice_by = request.GET.getlist("slice_by") or ["difficulty"]
    if before_id and after_id:
        before = Eval.objects.filter(pk=before_id).first() if before_id.isdigit() else None
        after = Eval.objects.filter(pk=after_id).first() if after_id.isdigit() else None
        if before is None or after is None:
            errors.append("before/after: pick two existing evals")
        else:
            try:
                comparison = selectors.eval_compare(before=before, after=after, slice_by=slice_by)
            except ValidationError as exc:
                errors = validation_messages(exc)
    evals = Eval.objects.select_related("benchmark_version__benchmark", "checkpoint", "run").order_by("-created_at")
    return render(
        request,
        "benchmarks/compare.html",
        {
            "evals": evals.filter(run__status="succeeded")[:100],
            "comparison": comparison,
            "errors": errors,
            "before_id": before_id,
            "after_id": after_id,
            "slice_by": slice_by,
        },
    )


urlpatterns = [
    path("benchmarks/", benchmark_list, name="list"),
    path("benchmarks/versions/<int:version_id>/", version_detail, name="version"),
    path("benchmarks/evals/<int:eval_id>/", eval_detail, name="eval"),
    path("benchmarks/evals/<int:eval_id>/results/", eval_results_partial, name="eval-results"),
    path("benchmarks/evals/compare/", eval_compare, name="compare"),
]
