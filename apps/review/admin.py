from django.contrib import admin

from apps.review.models import Flag, Review


@admin.register(Flag)
class FlagAdmin(admin.ModelAdmin):
    list_display = ("id", "run", "trajectory_ref", "detector", "detector_version", "severity", "created_at")
    list_filter = ("detector", "severity")
    search_fields = ("trajectory_ref",)


@admin.register(Review)
class ReviewAdmin(admin.ModelAdmin):
    list_display = ("flag", "reviewer", "label", "created_at")
    list_filter = ("label",)
