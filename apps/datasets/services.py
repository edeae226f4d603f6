from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from itertools import islice
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.db import IntegrityError, transaction
from django.db.models import Max
from rest_framework.exceptions import ValidationError

from apps.accounts.models import User
from apps.common.validators import SLUG
from apps.datasets.models import Dataset, DatasetKind, DatasetVersion
from apps.datasets.rows import object_rows, repo_task_rows, session_rows, trajectory_rows
from workers.search.corpus import (
    ChunkerConfig,
    ChunkerOptionError,
    CorpusError,
    DocumentSource,
    build_corpus,
    chunker_config_from,
)
from workers.search.corpus_files import is_zip, other_archive, parse_documents_zip
from workers.search.corpus_jsonl import (
    canonical_report,
    looks_like_canonical_chunks,
    parse_documents_jsonl,
    validate_canonical,
)
from workers.search.types import Chunk, dump_chunks_jsonl, iter_chunks_jsonl

ChunkerOption = ChunkerConfig | Mapping[str, Any] | str | None
CORPUS_SCHEMA = "corpus/v1"
TASKS_FILE_NAME = "tasks.jsonl"


def validate_dataset_file(*, kind: str, data: bytes) -> tuple[int, dict[str, object]]:
    """Check a file against its kind's schema (apps.datasets.rows). Returns (row_count, report) or raises a 400
    listing bad lines."""
    if kind == DatasetKind.CORPUS:
        _, row_count, report = corpus_chunks_from_upload(data=data)
        return row_count, report
    if kind == DatasetKind.TRAJECTORIES:
        return trajectory_rows(data)
    if kind == DatasetKind.REPO_TASKS:
        return repo_task_rows(data)
    if kind == DatasetKind.SESSIONS:
        return session_rows(data)
    return object_rows(data, kind=kind)  # other kinds get their schemas in later issues


def repo_tasks_version_create(
    *, dataset: Dataset, data: bytes, created_by: User, notes: str = "", report: Mapping[str, Any] | None = None
) -> DatasetVersion:
    """The next version of a repo_tasks dataset from rows an import or generation run verified in the sandbox
    (apps.coding); `report` (the run's) is kept in the version's validation report."""
    if dataset.kind != DatasetKind.REPO_TASKS:
        raise ValidationError({"dataset": [f"{dataset.name} holds {dataset.kind}, not repository tasks"]})
    dataset_file_check_size(len(data))
    row_count, checked = repo_task_rows(data)
    return _version_store(
        dataset=dataset,
        data=data,
        row_count=row_count,
        report={**(report or {}), **checked},
        filename=TASKS_FILE_NAME,
        created_by=created_by,
        notes=notes,
    )


@transaction.atomic
def dataset_create(*, name: str, kind: str, owner: User, description: str = "") -> Dataset:
    if not SLUG.fullmatch(name or ""):
        raise ValidationError({"name": ["use 1-100 letters, digits, '-' or '_' (e.g. search-trajectories)"]})
    if kind not in DatasetKind.values:
        raise ValidationError({"kind": [f"unknown kind {kind!r}; choose one of {DatasetKind.values}"]})
    if Dataset.objects.filter(name=name).exists():
        raise ValidationError({"name": [f"a dataset named {name!r} exists; pick another name or add a version"]})
    return Dataset.objects.create(name=name, kind=kind, description=description, owner=owner)


def dataset_file_check_size(size: int) -> None:
    """Call before reading an upload into memory; dataset_version_create checks again as a backstop."""
    if size > settings.DATASET_MAX_BYTES:
        raise ValidationError(
            {
                "file": [
                    f"{size} bytes is over the {settings.DATASET_MAX_BYTES}-byte limit "
                    "(CRUCIBLE_DATASET_MAX_BYTES); split the file into versions"
                ]
            }
        )


def _chunker(option: ChunkerOption) -> ChunkerConfig:
    if isinstance(option, ChunkerConfig):  # as chunker_config_from does; its signature leaves it out
        return option
    try:
        return chunker_config_from(option)
    except ChunkerOptionError as exc:
        raise ValidationError({"chunker": exc.fields.get("", []) or {k: v for k, v in exc.fields.items() if k}})


def _corpus_report(chunks: list[Chunk], report: dict[str, Any]) -> dict[str, Any]:
    if not chunks:
        blank = report["empty_documents"]
        raise ValidationError(
            {
                "file": [
                    f"the corpus holds no text ({blank} blank document(s), {report['skipped_files']} skipped "
                    f"file(s), {report.get('rejected_files', 0)} rejected); upload documents with non-empty 'text' "
                    "(JSONL) or .txt/.md/.rst/.html/.py files (zip)"
                ],
                **({"rejected_files": report["rejected_file_reasons"]} if report.get("rejected_files") else {}),
            }
        )
    return {"schema": CORPUS_SCHEMA, "rows": len(chunks), "errors": 0, **report}


def corpus_chunks_from_source(
    *, source: DocumentSource, chunker: ChunkerOption = None
) -> tuple[bytes, int, dict[str, Any]]:
    """Chunk parsed documents: (canonical chunk JSONL, chunk count, report); a corpus with no text is a 400."""
    chunks, report = build_corpus(
        source.documents,
        _chunker(chunker),
        skipped_files=source.skipped_files,
        rejected_files=source.rejected_files,
        source=source.source,
    )
    return dump_chunks_jsonl(chunks), len(chunks), _corpus_report(chunks, report)


def corpus_chunks_from_upload(*, data: bytes, chunker: ChunkerOption = None) -> tuple[bytes, int, dict[str, Any]]:
    """An uploaded corpus, as (canonical chunk JSONL, chunk count, report), or a 400 naming the bad line or file.

    The upload is a zip of .md/.rst/.txt/.html/.py files (told by its magic bytes), a JSONL of documents, or canonical
    chunk JSONL (a stored version exported and uploaded again), which is checked and kept as it is.
    """
    config = _chunker(chunker)
    try:
        if is_zip(data):
            source = parse_documents_zip(
                data, max_bytes=settings.DATASET_MAX_BYTES, max_document_bytes=settings.DOCUMENT_MAX_BYTES
            )
        elif kind := other_archive(data):
            raise CorpusError(
                [
                    f"file: a {kind} archive; a corpus upload is a .zip of documents, a JSONL of documents or chunk "
                    "JSONL: re-pack it as a zip"
                ]
            )
        elif looks_like_canonical_chunks(data):
            if chunker not in (None, "") and config != ChunkerConfig():
                raise ValidationError(
                    {"chunker": ["this file is already chunked (it has chunk_id); leave chunker out"]}
                )
            chunks = validate_canonical(data)
            return dump_chunks_jsonl(chunks), len(chunks), _corpus_report(chunks, canonical_report(chunks))
        else:
            source = parse_documents_jsonl(data, max_document_bytes=settings.DOCUMENT_MAX_BYTES)
    except CorpusError as exc:
        raise ValidationError({"file": exc.errors})
    return corpus_chunks_from_source(source=source, chunker=config)


def dataset_version_create(
    *,
    dataset: Dataset,
    data: bytes,
    filename: str,
    created_by: User,
    notes: str = "",
    chunker: ChunkerOption = None,
    report: Mapping[str, Any] | None = None,
) -> DatasetVersion:
    """Validate the whole file first, so a bad line leaves nothing behind; then store it as the next version.
    `report` (e.g. what produced the file) is kept beside the validation's in the version's report.

    A corpus upload (documents JSONL or a zip, see `corpus_chunks_from_upload`) is chunked with `chunker` and
    stored as canonical chunk JSONL; its hash is that of the chunks, so the same documents chunked the same way
    are refused as a duplicate.
    """
    dataset_file_check_size(len(data))
    if dataset.kind == DatasetKind.REPO_TASKS:
        raise ValidationError(
            {
                "file": [
                    "repository tasks are checked in the sandbox before they are stored: import them with POST "
                    "/api/v1/repo-tasks/import/ (or the Coding page, or manage.py import_repo_tasks), or generate "
                    "them with POST /api/v1/repo-tasks/generate/"
                ]
            }
        )
    if dataset.kind == DatasetKind.CORPUS:
        upload_bytes = len(data)
        data, row_count, checked = corpus_chunks_from_upload(data=data, chunker=chunker)
        checked["upload_bytes"] = upload_bytes
    elif chunker not in (None, ""):
        raise ValidationError({"chunker": [f"only corpus datasets are chunked; {dataset.name} holds {dataset.kind}"]})
    else:
        row_count, checked = validate_dataset_file(kind=dataset.kind, data=data)
    return _version_store(
        dataset=dataset,
        data=data,
        row_count=row_count,
        report={**(report or {}), **checked},
        filename=filename,
        created_by=created_by,
        notes=notes,
    )


def corpus_version_create(
    *,
    dataset: Dataset,
    source: DocumentSource,
    created_by: User,
    chunker: ChunkerOption = None,
    filename: str = "corpus",
    notes: str = "",
    reuse_identical: bool = False,
) -> DatasetVersion:
    """Chunk already-parsed documents (a folder, the built-in corpus) into the corpus dataset's next version.
    `reuse_identical`: when the same documents chunked the same way are already a version, return that version
    (otherwise that is a 400)."""
    if dataset.kind != DatasetKind.CORPUS:
        raise ValidationError(
            {"dataset": [f"{dataset.name} holds {dataset.kind}, not a corpus; pick a corpus dataset"]}
        )
    data, row_count, report = corpus_chunks_from_source(source=source, chunker=chunker)
    if reuse_identical:
        existing = DatasetVersion.objects.filter(dataset=dataset, content_hash=hashlib.sha256(data).hexdigest()).first()
        if existing is not None:
            return existing
    return _version_store(
        dataset=dataset,
        data=data,
        row_count=row_count,
        report=report,
        filename=filename,
        created_by=created_by,
        notes=notes,
    )


def _corpus_file_name(filename: str) -> str:
    stem = filename.rsplit("/", 1)[-1].split(".", 1)[0] or "corpus"
    return f"{stem}.chunks.jsonl"


def _version_store(
    *,
    dataset: Dataset,
    data: bytes,
    row_count: int,
    report: dict[str, Any],
    filename: str,
    created_by: User,
    notes: str,
) -> DatasetVersion:
    if dataset.kind == DatasetKind.CORPUS:
        if len(data) > settings.DATASET_MAX_BYTES:
            raise ValidationError(
                {
                    "file": [
                        f"chunked, the corpus is {len(data)} bytes, over the {settings.DATASET_MAX_BYTES}-byte limit "
                        "(CRUCIBLE_DATASET_MAX_BYTES); split the documents into several corpora"
                    ]
                }
            )
        filename = _corpus_file_name(filename)
    content_hash = hashlib.sha256(data).hexdigest()
    with transaction.atomic():
        Dataset.objects.select_for_update().get(pk=dataset.pk)
        existing = DatasetVersion.objects.filter(dataset=dataset, content_hash=content_hash).first()
        if existing is not None:
            if dataset.kind == DatasetKind.CORPUS:
                message = (
                    f"the same documents chunked with the same settings are already {existing}; reuse that version "
                    "or change the documents or the chunker"
                )
            else:
                message = f"identical content is already {existing}; reuse that version instead of uploading again"
            raise ValidationError({"file": [message]})
        number = (DatasetVersion.objects.filter(dataset=dataset).aggregate(n=Max("number"))["n"] or 0) + 1
        version = DatasetVersion(
            dataset=dataset,
            number=number,
            row_count=row_count,
            size_bytes=len(data),
            content_hash=content_hash,
            validation_report=report,
            notes=notes,
            created_by=created_by,
        )
        safe_name = filename.rsplit("/", 1)[-1] or "data.jsonl"
        version.file.save(f"{dataset.name}-v{number}-{safe_name}", ContentFile(data), save=False)
        try:
            version.save()
        except IntegrityError:
            version.file.delete(save=False)
            raise
    return version


def corpus_chunk_sample(*, version: DatasetVersion, limit: int = 20) -> list[Chunk]:
    """The first `limit` chunks of a corpus version, read line by line (the file may be large)."""
    if version.dataset.kind != DatasetKind.CORPUS or version.validation_report.get("schema") != CORPUS_SCHEMA:
        return []  # a version stored before corpora were chunked holds no chunk records
    try:
        with version.file.open("rb") as handle:
            head = b"".join(islice((line for line in handle if line.strip()), limit))
    except OSError:
        return []  # the page still shows the report when the file is unreachable
    return list(iter_chunks_jsonl(head))


def _read_rows(version: DatasetVersion) -> list[dict[str, Any]]:
    with version.file.open("rb") as handle:
        return [json.loads(line) for line in handle.read().splitlines() if line.strip()]


def _split_key(seed: int, row: Mapping[str, Any]) -> str:
    return hashlib.sha256(f"{seed}:{row.get('id')}".encode()).hexdigest()


def dataset_version_split(
    *,
    version: DatasetVersion,
    test_fraction: float,
    seed: int,
    created_by: User,
    train_dataset: str = "",
    test_dataset: str = "",
    by_time: bool = False,
) -> tuple[DatasetVersion, DatasetVersion]:
    """Split a tasks or repo_tasks version into a train and a held-out test version (each the next version of its
    own dataset, `<name>-train` and `<name>-test` unless named; created if missing). Deterministic in `seed`; rows
    are split within each `family` (repository tasks) so both parts hold every family. Rows are copied as they are:
    a repository task was verified in the sandbox when its version was stored. With `by_time`, the newest
    `test_fraction` of the rows by `source.created_at` (a mined commit's time) are the test part, so nothing is
    trained on a change newer than one it is evaluated on; rows without a time sort first."""
    if version.dataset.kind not in (DatasetKind.TASKS, DatasetKind.REPO_TASKS):
        raise ValidationError({"version": [f"{version} holds {version.dataset.kind}; only task datasets are split"]})
    if not 0 < test_fraction < 1:
        raise ValidationError({"test_fraction": ["give a fraction between 0 and 1 (exclusive), e.g. 0.2"]})
    rows = _read_rows(version)
    if len(rows) < 2:
        raise ValidationError({"version": [f"{version} holds {len(rows)} row(s); a split needs at least 2"]})
    strata: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        strata.setdefault(str(row.get("family") or ""), []).append(row)
    test_ids: set[str] = set()
    if by_time:
        by_date = sorted(rows, key=lambda row: str((row.get("source") or {}).get("created_at") or ""))
        newest = min(len(rows) - 1, max(1, round(len(rows) * test_fraction)))
        test_ids.update(str(row.get("id")) for row in by_date[len(rows) - newest :])
    for members in strata.values() if not by_time else ():
        members.sort(key=lambda row: _split_key(seed, row))
        test_ids.update(str(row.get("id")) for row in members[: round(len(members) * test_fraction)])
    ordered = sorted(rows, key=lambda row: _split_key(seed, row))
    if not test_ids:
        test_ids.add(str(ordered[0].get("id")))
    if len(test_ids) == len(rows):
        test_ids.discard(str(ordered[-1].get("id")))
    names = {
        "train": train_dataset or f"{version.dataset.name}-train",
        "test": test_dataset or f"{version.dataset.name}-test",
    }
    problems: dict[str, list[str]] = {}
    for part, name in names.items():
        field = f"{part}_dataset"
        if not SLUG.fullmatch(name) or len(name) > 100:
            problems[field] = ["use 1-100 letters, digits, '-' or '_'"]
        elif (existing := Dataset.objects.filter(name=name).first()) is not None:
            if existing.kind != version.dataset.kind:
                problems[field] = [f"{name!r} is a {existing.kind} dataset; name a {version.dataset.kind} dataset"]
            elif existing.pk == version.dataset_id:
                problems[field] = ["name a dataset other than the one being split"]
    if names["train"] == names["test"]:
        problems["test_dataset"] = ["the train and test parts need different datasets"]
    if problems:
        raise ValidationError(problems)
    made: dict[str, DatasetVersion] = {}
    with transaction.atomic():
        for part, name in names.items():
            chosen = [row for row in rows if (str(row.get("id")) in test_ids) == (part == "test")]
            data = "".join(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n" for row in chosen).encode()
            dataset = Dataset.objects.filter(name=name).first() or dataset_create(
                name=name, kind=version.dataset.kind, owner=created_by, description=f"The {part} part of {version}"
            )
            notes = f"{part} part of {version}: {len(chosen)} of {len(rows)} rows"
            notes += f" (test fraction {test_fraction}, seed {seed})"
            split = {"split_of": version.pk, "part": part, "seed": seed, "test_fraction": test_fraction}
            same = DatasetVersion.objects.filter(dataset=dataset, content_hash=hashlib.sha256(data).hexdigest()).first()
            if same is not None:
                made[part] = same
            elif dataset.kind == DatasetKind.REPO_TASKS:
                made[part] = repo_tasks_version_create(
                    dataset=dataset, data=data, created_by=created_by, notes=notes, report={"split": split}
                )
            else:
                made[part] = dataset_version_create(
                    dataset=dataset, data=data, filename=f"{part}.jsonl", created_by=created_by, notes=notes
                )
                made[part].validation_report = {**made[part].validation_report, "split": split}
                made[part].save(update_fields=["validation_report"])
    return made["train"], made["test"]
