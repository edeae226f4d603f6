from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from apps.benchmarks.models import Benchmark, BenchmarkTask, BenchmarkVersion, Eval


class ReadOnlyAdmin(admin.ModelAdmin):
    """Immutable records: listed and inspected here, created only through the services (which hash them)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Benchmark)
class BenchmarkAdmin(admin.ModelAdmin):
    list_display = ("name", "environment", "metric", "score_field", "owner", "created_at")
    # What scores a version's attempts is part of what its evals mean: it is set once, at creation.
    readonly_fields = ("name", "environment", "metric", "score_field")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(BenchmarkVersion)
class BenchmarkVersionAdmin(ReadOnlyAdmin):
    list_display = ("__str__", "task_count", "content_hash", "created_by", "created_at")


@admin.register(BenchmarkTask)
class BenchmarkTaskAdmin(ReadOnlyAdmin):
    list_display = ("task_id", "version", "provenance", "difficulty")
    list_filter = ("provenance", "difficulty")
    search_fields = ("task_id",)


@admin.register(Eval)
class EvalAdmin(ReadOnlyAdmin):
    list_display = ("__str__", "k", "config_hash", "created_by", "created_at")
    list_select_related = ("run", "benchmark_version__benchmark", "checkpoint")
