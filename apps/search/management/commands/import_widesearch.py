"""`manage.py import_widesearch ZIP --tasks NAME [--judge-columns refuse|exact_match|drop]`: WideSearch tasks as
published (the queries as one JSONL, a gold CSV per task) as a tasks version of wide tasks, each scored by its own
evaluation spec; the same import as `POST /api/v1/widesearch-imports/` (apps.search.services.imports)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from rest_framework.exceptions import ValidationError

from apps.accounts.models import User
from apps.common.errors import validation_messages
from apps.search.services.imports import widesearch_import
from workers.swarm.widesearch import JUDGE_COLUMNS


class Command(BaseCommand):
    help = __doc__.splitlines()[0].split(": ", 1)[1]

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("zip", type=Path, help="a zip of the queries (.jsonl) and the gold tables (<id>.csv)")
        parser.add_argument("--tasks", required=True, help="tasks dataset for the wide tasks (created)")
        parser.add_argument("--judge-columns", choices=JUDGE_COLUMNS, default="refuse", help="llm_judge columns")
        parser.add_argument("--notes", default="")
        parser.add_argument("--owner", default="admin", help="username recorded as the creator")

    def handle(self, *args: Any, **options: Any) -> None:
        owner = User.objects.filter(username=options["owner"]).first()
        if owner is None:
            raise CommandError(f"no user {options['owner']!r}; pass --owner or run crucible_demo first")
        path: Path = options["zip"]
        if not path.is_file():
            raise CommandError(f"{path}: no such file")
        try:
            version = widesearch_import(
                data=path.read_bytes(),
                filename=path.name,
                tasks_dataset=options["tasks"],
                user=owner,
                judge_columns=options["judge_columns"],
                notes=options["notes"],
            )
        except ValidationError as exc:
            raise CommandError("\n".join(validation_messages(exc))) from None
        report = version.validation_report
        self.stdout.write(f"tasks {version} (id {version.pk}): {version.row_count} wide tasks")
        self.stdout.write(json.dumps({k: report.get(k) for k in ("tasks", "gold_rows", "departures", "judge_columns")}))
