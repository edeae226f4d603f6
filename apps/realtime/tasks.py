"""Celery tasks of real-time RL: thin, they call services (docs/architecture.md, "Celery is the glue")."""

from __future__ import annotations

from celery import shared_task

from apps.realtime.services.cycles import loops_tick


@shared_task(name="apps.realtime.tasks.realtime_loops_tick", ignore_result=True)
def realtime_loops_tick() -> int:
    """Advance every active loop's running cycle by whatever its phase has finished (beat, every few seconds)."""
    return loops_tick()
