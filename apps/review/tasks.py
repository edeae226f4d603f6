"""Celery tasks of review: thin, call a service."""

from __future__ import annotations

from celery import shared_task

from apps.review import services


@shared_task
def review_queues_sync() -> int:
    """Beat: queue the flags ingested since the last sync, in every queue."""
    return services.queue_sync_all()
