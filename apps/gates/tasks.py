"""Celery tasks of gates: thin, take IDs, call a service."""

from __future__ import annotations

from celery import shared_task

from apps.gates import services


@shared_task
def gate_checks_advance() -> int:
    """Beat: decide every waiting gate check whose evals have ended (or record the eval that failed)."""
    return services.gate_checks_advance_all()
