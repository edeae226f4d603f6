from __future__ import annotations

from typing import Any

from django.contrib import admin

from apps.webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    """The secret is not editable and never shown here; create endpoints through the API to receive it once."""

    list_display = ("name", "url", "events", "active", "created_by", "created_at")
    list_filter = ("active",)
    search_fields = ("name", "url")
    fields = ("name", "url", "events", "active", "created_by", "created_at")
    readonly_fields = ("created_by", "created_at")

    def save_model(self, request: Any, obj: WebhookEndpoint, form: Any, change: bool) -> None:
        if not change:
            obj.created_by = request.user
        super().save_model(request, obj, form, change)


class ReadOnlyAdmin(admin.ModelAdmin):
    """The delivery log is a record: it is read here, written only by the delivery service."""

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False


class WebhookAttemptInline(admin.TabularInline):
    model = WebhookAttempt
    fields = ("number", "requested_at", "duration_ms", "status_code", "error", "response_excerpt")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "endpoint",
        "event",
        "event_id",
        "status",
        "attempts",
        "next_attempt_at",
        "refused_reason",
        "created_at",
    )
    list_filter = ("status", "event", "endpoint")
    search_fields = ("event_id",)
    inlines = [WebhookAttemptInline]


@admin.register(WebhookAttempt)
class WebhookAttemptAdmin(ReadOnlyAdmin):
    list_display = ("delivery", "number", "requested_at", "duration_ms", "status_code", "error")
    list_filter = ("status_code",)
