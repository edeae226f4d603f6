"""`manage.py import_repo_tasks FILE --dataset NAME`: import repository tasks here, without Ray.

The same checks as an import run (workers.jobs.repoimport): the file is parsed whole first (every problem listed,
nothing stored), then every task is checked in the sandbox on this machine, printing each verdict once, as it comes
(on stdout; not also through logging); the verified tasks become the next version of the dataset, or nothing is
stored when one is refused (unless --keep-valid)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from rest_framework.exceptions import ValidationError

from apps.accounts.models import User
from apps.coding.services import repo_tasks_register, snapshot_root, target_problems
from apps.common.errors import validation_messages
from apps.datasets.services import dataset_file_check_size
from workers.coding.bundle import BundleError, parse_upload
from workers.jobs.repoimport import import_tasks
from workers.specs import RepoImportSpec


class Command(BaseCommand):
    help = __doc__.splitlines()[0].split(": ", 1)[1]

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="JSONL of tasks with inline repositories, or a zip/tar.gz bundle")
        parser.add_argument("--dataset", required=True, help="repo_tasks dataset to add a version to (created)")
        parser.add_argument("--keep-valid", action="store_true", help="store the passing tasks when others fail")
        parser.add_argument("--notes", default="", help="notes of the new version")
        parser.add_argument("--workers", type=int, default=2, help="tasks verified at once")
        parser.add_argument("--owner", default="admin", help="username recorded as the creator")

    def handle(self, *args: Any, **options: Any) -> None:
        owner = User.objects.filter(username=options["owner"]).first()
        if owner is None:
            raise CommandError(f"no user {options['owner']!r}; pass --owner or run crucible_demo first")
        path = Path(options["file"])
        if not path.is_file():
            raise CommandError(f"{path}: no such file")
        data = path.read_bytes()
        try:
            dataset_file_check_size(len(data))
        except ValidationError as exc:
            raise CommandError("; ".join(validation_messages(exc))) from None
        if problems := target_problems(options["dataset"]):
            raise CommandError(f"--dataset: {'; '.join(problems)}")
        try:
            parse_upload(data)  # the whole file first: every problem listed before anything runs
        except BundleError as exc:
            raise CommandError(f"{path} cannot be imported:\n  " + "\n  ".join(exc.problems)) from None
        with tempfile.TemporaryDirectory(prefix="crucible-import-") as work:
            folder = Path(work)
            (folder / "upload").write_bytes(data)
            spec = RepoImportSpec(
                run_id=1,
                kind="repoimport",
                ingest_url="http://localhost/unused",
                upload_uri=f"file://{folder / 'upload'}",
                output_uri=f"file://{folder / 'tasks.jsonl'}",
                report_uri=f"file://{folder / 'report.json'}",
                snapshot_root=snapshot_root(),
                keep_valid=options["keep_valid"],
                workers=options["workers"],
            )
            report = import_tasks(spec, echo=self.stdout.write)  # every verdict, refusals with their reason, once
            rows = (folder / "tasks.jsonl").read_bytes()
        outcome = repo_tasks_register(
            target=options["dataset"],
            rows=rows,
            report=report,
            user=owner,
            notes=options["notes"] or f"{report['kept']} task(s) imported with manage.py import_repo_tasks",
            keep_valid=options["keep_valid"],
            origin=f"imported from {path.name}",
        )
        counts = {"kept": report["kept"], "unverified": report["unverified"], "refused": len(report["refused"])}
        self.stdout.write(json.dumps({**counts, **outcome}))
        if outcome.get("error") or not outcome.get("version"):
            raise CommandError(outcome["outcome"])
