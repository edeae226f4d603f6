"""`manage.py import_corpus NAME (--jsonl PATH | --zip PATH | --folder PATH | --builtin python-docs)`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from rest_framework.exceptions import ValidationError

from apps.accounts.models import User
from apps.datasets.models import Dataset, DatasetKind, DatasetVersion
from apps.datasets.services import (
    corpus_version_create,
    dataset_create,
    dataset_file_check_size,
    dataset_version_create,
)
from workers.search.corpus import CorpusError, DocumentSource, chunker_config_from
from workers.search.corpus_files import parse_documents_folder
from workers.search.stdlib_corpus import stdlib_documents

BUILTIN_CORPORA = ("python-docs",)


class Command(BaseCommand):
    help = (
        "Import documents into a corpus dataset (created if missing) as its next version: a JSONL of documents, "
        "a zip or folder of .md/.rst/.txt/.html/.py files, or the built-in Python documentation corpus."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("name", help="corpus dataset name (letters, digits, '-' or '_')")
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument(
            "--jsonl", type=Path, help='documents, one {"doc_id", "text", "title"?, "metadata"?} a line'
        )
        source.add_argument(
            "--zip", type=Path, help="a zip of a folder of .md/.markdown/.rst/.txt/.html/.htm/.py files"
        )
        source.add_argument(
            "--folder", type=Path, help="a folder of .md/.markdown/.rst/.txt/.html/.htm/.py files (recursive)"
        )
        source.add_argument(
            "--builtin", choices=BUILTIN_CORPORA, help="python-docs: pydoc topics and stdlib docstrings"
        )
        parser.add_argument("--chunker", default="", help="chunker options as JSON, e.g. '{\"max_words\": 150}'")
        parser.add_argument("--user", help="owner and uploader (default: the first superuser)")
        parser.add_argument("--description", default="", help="description, used when the dataset is created")
        parser.add_argument("--notes", default="", help="notes on this version")

    def handle(self, *args: Any, **options: Any) -> None:
        user = self._user(options["user"])
        try:
            chunker_config_from(options["chunker"])  # before reading anything: a typo should fail at once
            # One transaction: a failed import does not leave a new, empty dataset behind.
            with transaction.atomic():
                dataset = self._dataset(options["name"], user, options["description"])
                version = self._import(dataset, user, options)
        except ValidationError as exc:
            raise CommandError("\n".join(_messages(exc.detail)))
        except CorpusError as exc:
            raise CommandError("\n".join(exc.errors))
        except OSError as exc:
            raise CommandError(f"cannot read {exc.filename}: {exc.strerror}")
        report = version.validation_report
        self.stdout.write(
            self.style.SUCCESS(
                f"{version}: {report['documents']} documents, {report['chunks']} chunks "
                f"({report['empty_documents']} blank documents, {report['skipped_files']} skipped files; "
                f"mean {report['mean_words_per_chunk']} words per chunk, max {report['max_words_per_chunk']}; "
                f"merged {report.get('shared_chunks', 0)} chunks shared by 2+ documents)"
            )
        )

    def _user(self, username: str | None) -> User:
        if username:
            user = User.objects.filter(username=username, is_active=True).first()
            if user is None:
                raise CommandError(f"--user {username}: no active user by that name")
            return user
        user = User.objects.filter(is_superuser=True, is_active=True).order_by("pk").first()
        if user is None:
            raise CommandError("no superuser to own the corpus; pass --user USERNAME")
        return user

    def _dataset(self, name: str, user: User, description: str) -> Dataset:
        dataset = Dataset.objects.filter(name=name).first()
        if dataset is None:
            return dataset_create(name=name, kind=DatasetKind.CORPUS, owner=user, description=description)
        if dataset.kind != DatasetKind.CORPUS:
            raise CommandError(f"{name} holds {dataset.kind}, not a corpus; pick another name")
        return dataset

    def _import(self, dataset: Dataset, user: User, options: dict[str, Any]) -> DatasetVersion:
        chunker, notes = options["chunker"], options["notes"]
        upload: Path | None = options["jsonl"] or options["zip"]
        if upload is not None:
            dataset_file_check_size(upload.stat().st_size)
            return dataset_version_create(
                dataset=dataset,
                data=upload.read_bytes(),
                filename=upload.name,
                created_by=user,
                notes=notes,
                chunker=chunker,
            )
        if options["folder"] is not None:
            folder: Path = options["folder"]
            source = parse_documents_folder(
                folder, max_bytes=settings.DATASET_MAX_BYTES, max_document_bytes=settings.DOCUMENT_MAX_BYTES
            )
            filename = folder.resolve().name
        else:
            source = DocumentSource(documents=stdlib_documents(), source=f"builtin:{options['builtin']}")
            filename = options["builtin"]
        return corpus_version_create(
            dataset=dataset, source=source, created_by=user, chunker=chunker, filename=filename, notes=notes
        )


def _messages(detail: Any, field: str = "") -> list[str]:
    """`field: message` lines of a ValidationError's detail (nested for chunker options)."""
    if isinstance(detail, dict):
        return [line for key, value in detail.items() for line in _messages(value, f"{field}.{key}" if field else key)]
    if isinstance(detail, list):
        return [line for item in detail for line in _messages(item, field)]
    return [f"{field}: {detail}" if field else str(detail)]
