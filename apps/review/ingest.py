"""The `flag` event store (apps.runs.services.ingest): review owns flags, so review alone writes them.

A flag is stored once per (run, trajectory, detector) (a repeat is ignored), linked to the run's trajectory summary
with that id when there is one; a flag that came before its trajectory's summary is linked when the summary
arrives. New flags join the review queues that match them right after the commit (beat re-syncs every minute as a
backstop, so a lost task only delays them)."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import OuterRef, Subquery

from apps.review import tasks
from apps.review.models import Flag
from apps.runs.models import TrajectorySummary
from apps.runs.services import IngestContext


def store_flag_events(context: IngestContext, flags: list[Any]) -> None:
    run = context.run
    if flags:
        refs = {event.trajectory_id for event in flags}
        summaries = dict(
            TrajectorySummary.objects.filter(run=run, trajectory_id__in=refs).values_list("trajectory_id", "pk")
        )
        transaction.on_commit(tasks.review_queues_sync.delay, robust=True)
        Flag.objects.bulk_create(
            [
                Flag(
                    run=run,
                    trajectory_id=summaries.get(event.trajectory_id),
                    trajectory_ref=event.trajectory_id,
                    detector=event.detector,
                    detector_version=event.detector_version,
                    severity=event.severity,
                    evidence=event.evidence,
                    step=event.step,
                )
                for event in flags
            ],
            ignore_conflicts=True,
            batch_size=2000,
        )
    if context.new_trajectory_ids:
        Flag.objects.filter(run=run, trajectory__isnull=True, trajectory_ref__in=context.new_trajectory_ids).update(
            trajectory=Subquery(
                TrajectorySummary.objects.filter(run=run, trajectory_id=OuterRef("trajectory_ref")).values("pk")[:1]
            )
        )
