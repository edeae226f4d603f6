"""`manage.py import_beir ZIP --corpus NAME --tasks NAME [--splits test]`: a BEIR dataset's zip as published
(corpus.jsonl, queries.jsonl, qrels/<split>.tsv) as a corpus version and a tasks version of its judged queries,
the same import as `POST /api/v1/beir-imports/` (apps.search.services.imports). Score it with
`manage.py retrieval_eval CORPUS_VERSION --tasks-version TASKS_VERSION`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from rest_framework.exceptions import ValidationError

from apps.accounts.models import User
from apps.common.errors import validation_messages
from apps.search.services.imports import beir_import


class Command(BaseCommand):
    help = __doc__.splitlines()[0].split(": ", 1)[1]

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("zip", type=Path, help="the BEIR dataset's zip")
        parser.add_argument("--corpus", required=True, help="corpus dataset for the documents (created)")
        parser.add_argument("--tasks", required=True, help="tasks dataset for the judged queries (created)")
        parser.add_argument("--splits", default="", help="comma-separated qrels splits (default: every one)")
        parser.add_argument("--chunker", default="", help='chunker options as JSON, e.g. {"max_words": 150}')
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
            result = beir_import(
                data=path.read_bytes(),
                filename=path.name,
                corpus_dataset=options["corpus"],
                tasks_dataset=options["tasks"],
                user=owner,
                splits=[s for s in options["splits"].split(",") if s.strip()],
                chunker=options["chunker"] or None,
                notes=options["notes"],
            )
        except ValidationError as exc:
            raise CommandError("\n".join(validation_messages(exc))) from None
        corpus, tasks = result.corpus_version, result.tasks_version
        self.stdout.write(
            f"corpus {corpus} (id {corpus.pk}, {corpus.row_count} chunks{', reused' if result.corpus_reused else ''}); "
            f"tasks {tasks} (id {tasks.pk}, {tasks.row_count} queries)"
        )
        self.stdout.write(json.dumps(result.report["splits"]))
        self.stdout.write(f"score it: manage.py retrieval_eval {corpus.pk} --tasks-version {tasks.pk}")
