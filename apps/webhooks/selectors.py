"""Reads for webhooks: the delivery log and what the beat sweep re-queues."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import QuerySet

from apps.webhooks.models import DeliveryStatus, WebhookDelivery, WebhookEndpoint

# A pending delivery this far past due has lost its queued task (broker restart, a worker that died mid-send):
# Celery's own retries are punctual to well within this, so the sweep rarely duplicates one (and a duplicate
# is harmless: webhook_deliver finds the row claimed or not yet due).
SWEEP_GRACE = timedelta(seconds=60)
SWEEP_LIMIT = 1000


def webhook_endpoint_list() -> QuerySet[WebhookEndpoint]:
    return WebhookEndpoint.objects.select_related("created_by").order_by("name")


def webhook_delivery_list(*, endpoint_id: int | None = None, status: str | None = None) -> QuerySet[WebhookDelivery]:
    deliveries = WebhookDelivery.objects.select_related("endpoint").order_by("-created_at", "-pk")
    if endpoint_id is not None:
        deliveries = deliveries.filter(endpoint_id=endpoint_id)
    if status is not None:
        deliveries = deliveries.filter(status=status)
    return deliveries


def webhook_delivery_with_log() -> QuerySet[WebhookDelivery]:
    return webhook_delivery_list().prefetch_related("attempt_log")


def webhook_deliveries_overdue(*, now: datetime, grace: timedelta = SWEEP_GRACE, limit: int = SWEEP_LIMIT) -> list[int]:
    """Pending deliveries whose next attempt is more than `grace` overdue, oldest first."""
    return list(
        WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING, next_attempt_at__lt=now - grace)
        .order_by("next_attempt_at")
        .values_list("pk", flat=True)[:limit]
    )
