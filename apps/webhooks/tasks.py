"""Celery tasks for webhooks: thin, take IDs, call a service (docs/architecture.md, "Celery is the glue")."""

from __future__ import annotations

from celery import Task, shared_task
from django.utils import timezone

from apps.webhooks import selectors, services


# max_retries=None: the delivery row counts attempts (CRUCIBLE_WEBHOOK_MAX_ATTEMPTS), not Celery, because
# redelivery and the beat sweep start new task chains that a per-message counter would not see.
# soft_time_limit: httpx's timeout bounds each phase of the request; this is the backstop that frees the worker.
@shared_task(bind=True, acks_late=True, max_retries=None, soft_time_limit=300)
def deliver_webhook(self: Task, delivery_id: int) -> str | None:
    result = services.webhook_deliver(delivery_id=delivery_id)
    if result.retry_in is not None:
        raise self.retry(countdown=result.retry_in)
    return result.status


@shared_task
def webhook_retry_due() -> int:
    """Beat: queue pending deliveries whose next attempt is overdue (a retry the broker lost, a worker that died)."""
    overdue = selectors.webhook_deliveries_overdue(now=timezone.now())
    for delivery_id in overdue:
        deliver_webhook.delay(delivery_id)
    return len(overdue)
