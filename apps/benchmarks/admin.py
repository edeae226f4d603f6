from django.contrib import admin

from apps.benchmarks.models import Benchmark, BenchmarkTask, BenchmarkVersion


@admin.register(Benchmark)
class BenchmarkAdmin(admin.ModelAdmin):
    list_display = ("name", "environment", "metric", "owner", "created_at")


@admin.register(BenchmarkVersion)
class BenchmarkVersionAdmin(admin.ModelAdmin):
    list_display = ("__str__", "content_hash", "created_by", "created_at")


@admin.register(BenchmarkTask)
class BenchmarkTaskAdmin(admin.ModelAdmin):
    list_display = ("task_id", "version", "provenance", "difficulty")
    list_filter = ("provenance",)
    search_fields = ("task_id",)
