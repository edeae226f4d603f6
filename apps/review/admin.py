from django.contrib import admin

from apps.review.models import Flag, QueueItem, Review, ReviewAction, ReviewQueue, RewardDraft, TaskExclusion


@admin.register(Flag)
class FlagAdmin(admin.ModelAdmin):
    list_display = ("id", "run", "trajectory_ref", "detector", "detector_version", "severity", "created_at")
    list_filter = ("detector", "severity")
    search_fields = ("trajectory_ref",)


@admin.register(Review)
class ReviewAdmin(admin.ModelAdmin):
    list_display = ("flag", "reviewer", "label", "created_at")
    list_filter = ("label",)


@admin.register(ReviewQueue)
class ReviewQueueAdmin(admin.ModelAdmin):
    list_display = ("name", "run", "detector", "min_severity", "required_reviews", "lock_timeout_s", "synced_at")


@admin.register(QueueItem)
class QueueItemAdmin(admin.ModelAdmin):
    list_display = ("id", "queue", "run", "trajectory_ref", "status", "locked_by", "locked_until")
    list_filter = ("queue", "status")
    raw_id_fields = ("flag", "run")


@admin.register(RewardDraft)
class RewardDraftAdmin(admin.ModelAdmin):
    list_display = ("id", "flag", "base_version", "status", "created_by", "created_at")
    list_filter = ("status",)


@admin.register(TaskExclusion)
class TaskExclusionAdmin(admin.ModelAdmin):
    list_display = ("dataset", "task_id", "created_by", "created_at")
    search_fields = ("task_id",)


@admin.register(ReviewAction)
class ReviewActionAdmin(admin.ModelAdmin):
    list_display = ("kind", "flag", "actor", "created_at")
    list_filter = ("kind",)
