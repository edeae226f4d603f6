"""`manage.py runs_stopped_with_cluster --address URL`: what `make run` calls as it stops its Ray head."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from apps.runs.services.lifecycle import STACK_STOPPED, runs_stopped_with_cluster


class Command(BaseCommand):
    help = "End the runs still going on a Ray cluster that is being stopped, with that as their reason."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--address", required=True, help="the cluster's Jobs API address (RAY_ADDRESS)")
        parser.add_argument("--cause", default=STACK_STOPPED, help="the reason recorded on each run")

    def handle(self, *args: Any, **options: Any) -> None:
        ended = runs_stopped_with_cluster(ray_address=options["address"], cause=options["cause"])
        self.stdout.write(f"{len(ended)} run(s) ended: {', '.join(map(str, ended)) or 'none'}")
