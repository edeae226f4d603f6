from django.contrib import admin
from django.http import HttpRequest

from apps.rewards.models import RewardConfig, RewardConfigVersion


@admin.register(RewardConfig)
class RewardConfigAdmin(admin.ModelAdmin):
    list_display = ("name", "owner", "created_at")
    search_fields = ("name",)


@admin.register(RewardConfigVersion)
class RewardConfigVersionAdmin(admin.ModelAdmin):
    list_display = ("__str__", "content_hash", "created_by", "created_at")
    readonly_fields = ("spec", "content_hash", "number", "config", "parent", "created_by", "created_at")

    def has_change_permission(self, request: HttpRequest, obj: RewardConfigVersion | None = None) -> bool:
        # A version is immutable: a change makes a new version through the API or the page.
        return False
