from django.contrib import admin

from apps.runs.models import Artifact, Checkpoint, MetricPoint, Run, TrajectorySummary


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("id", "kind", "name", "status", "created_by", "created_at", "finished_at")
    list_filter = ("kind", "status")
    search_fields = ("name", "ray_job_id")
    readonly_fields = ("last_seq", "ray_job_id", "log_tail", "failure_reason")


@admin.register(Checkpoint)
class CheckpointAdmin(admin.ModelAdmin):
    list_display = ("run", "step", "uri", "created_at")


@admin.register(TrajectorySummary)
class TrajectorySummaryAdmin(admin.ModelAdmin):
    list_display = ("trajectory_id", "run", "task_id", "reward", "num_turns")
    list_filter = ("run__kind",)
    search_fields = ("trajectory_id", "task_id")


@admin.register(Artifact)
class ArtifactAdmin(admin.ModelAdmin):
    list_display = ("name", "run", "uri", "size_bytes")


@admin.register(MetricPoint)
class MetricPointAdmin(admin.ModelAdmin):
    list_display = ("run", "name", "step", "value", "time")
    list_filter = ("name",)
