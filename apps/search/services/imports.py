"""Imports of published datasets in the field's formats:

- a BEIR zip becomes a corpus version (its documents, chunked) and a tasks version (one row per judged query, with
  its graded document relevance; `workers.search.beir`) that `manage.py retrieval_eval` scores at the document
  level; both or neither are stored;
- a WideSearch zip (queries JSONL and gold CSVs) becomes a tasks version of wide tasks scored by each task's own
  evaluation spec (`workers.swarm.widesearch`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from rest_framework.exceptions import ValidationError

from apps.accounts.models import User
from apps.datasets.models import Dataset, DatasetKind, DatasetVersion
from apps.datasets.services import (
    ChunkerOption,
    corpus_version_create,
    dataset_create,
    dataset_file_check_size,
    dataset_version_create,
    validate_dataset_file,
)
from workers.search.beir import BeirError, read_beir_zip
from workers.swarm.widesearch import JudgeColumns, WideSearchError, read_widesearch_zip


@dataclass(frozen=True)
class BeirImport:
    corpus_version: DatasetVersion
    tasks_version: DatasetVersion
    corpus_reused: bool
    report: dict[str, Any]


def _dataset(name: str, kind: str, field: str, owner: User) -> Dataset:
    existing = Dataset.objects.filter(name=name).first()
    if existing is None:
        try:
            return dataset_create(name=name, kind=kind, owner=owner)
        except ValidationError as exc:
            detail = exc.detail if isinstance(exc.detail, dict) else {"name": exc.detail}
            raise ValidationError({field: detail.get("name", detail)}) from None
    if existing.kind != kind:
        raise ValidationError(
            {field: [f"dataset {name!r} holds {existing.kind}, not {kind}; name a {kind} dataset or a new name"]}
        )
    return existing


def beir_import(
    *,
    data: bytes,
    filename: str,
    corpus_dataset: str,
    tasks_dataset: str,
    user: User,
    splits: Sequence[str] = (),
    chunker: ChunkerOption = None,
    notes: str = "",
) -> BeirImport:
    """Read a published BEIR zip (`workers.search.beir`) into the corpus dataset `corpus_dataset` and the tasks
    dataset `tasks_dataset` (each created when missing). The whole archive is checked before anything is stored:
    a problem is a 400 naming the file, line and field. The same documents chunked the same way reuse the corpus's
    existing version; the same task rows again are a 400 (nothing stored)."""
    dataset_file_check_size(len(data))
    if corpus_dataset == tasks_dataset:
        raise ValidationError({"tasks_dataset": ["name a dataset other than corpus_dataset for the queries"]})
    try:
        beir = read_beir_zip(
            data,
            splits=splits,
            max_bytes=settings.DATASET_MAX_BYTES,
            max_document_bytes=settings.DOCUMENT_MAX_BYTES,
        )
    except BeirError as exc:
        by_field: dict[str, list[str]] = {}
        for error in exc.errors:
            by_field.setdefault("splits" if error.startswith("split:") else "file", []).append(error)
        raise ValidationError(by_field) from None
    rows = b"".join(json.dumps(row, ensure_ascii=False).encode() + b"\n" for row in beir.tasks)
    validate_dataset_file(kind=DatasetKind.TASKS, data=rows)  # the tasks kind's own row checks, before any write
    stem = filename.rsplit("/", 1)[-1].rsplit(".", 1)[0] or "beir"
    with transaction.atomic():
        corpus = _dataset(corpus_dataset, DatasetKind.CORPUS, "corpus_dataset", user)
        tasks = _dataset(tasks_dataset, DatasetKind.TASKS, "tasks_dataset", user)
        before = corpus.versions.count()
        corpus_version = corpus_version_create(
            dataset=corpus,
            source=beir.documents,
            created_by=user,
            chunker=chunker,
            filename=stem,
            notes=notes or f"BEIR import of {filename}",
            reuse_identical=True,
        )
        reused = corpus.versions.count() == before
        report = {**beir.report, "corpus_version": corpus_version.pk, "archive": filename}
        tasks_version = dataset_version_create(
            dataset=tasks,
            data=rows,
            filename=f"{stem}-queries.jsonl",
            created_by=user,
            notes=notes or f"BEIR queries and qrels of {filename} over {corpus_version}",
            report=report,
        )
    return BeirImport(corpus_version, tasks_version, reused, report)


def widesearch_import(
    *,
    data: bytes,
    filename: str,
    tasks_dataset: str,
    user: User,
    judge_columns: JudgeColumns = "refuse",
    notes: str = "",
) -> DatasetVersion:
    """Read a WideSearch zip (`workers.swarm.widesearch`) into the next version of the tasks dataset `tasks_dataset`
    (created when missing). The whole zip is checked first: a problem is a 400 naming the file, line and field,
    and nothing is stored; the same tasks again are a 400."""
    dataset_file_check_size(len(data))
    try:
        imported = read_widesearch_zip(data, judge_columns=judge_columns, max_bytes=settings.DATASET_MAX_BYTES)
    except WideSearchError as exc:
        by_field: dict[str, list[str]] = {}
        for error in exc.errors:
            by_field.setdefault("judge_columns" if error.startswith("judge_columns:") else "file", []).append(error)
        raise ValidationError(by_field) from None
    rows = b"".join(json.dumps(row, ensure_ascii=False).encode() + b"\n" for row in imported.tasks)
    stem = filename.rsplit("/", 1)[-1].rsplit(".", 1)[0] or "widesearch"
    with transaction.atomic():
        tasks = _dataset(tasks_dataset, DatasetKind.TASKS, "tasks_dataset", user)
        return dataset_version_create(
            dataset=tasks,
            data=rows,
            filename=f"{stem}-wide.jsonl",
            created_by=user,
            notes=notes or f"WideSearch import of {filename}",
            report={**imported.report, "archive": filename},
        )
