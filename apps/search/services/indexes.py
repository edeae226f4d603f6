"""Writes for search indexes: launch a build (an INDEX run), register it when it succeeds."""

from __future__ import annotations

import json
import logging
from typing import Any

from django.core.files.storage import default_storage
from django.db import transaction
from django.utils import timezone
from pydantic import ValidationError as PydanticError
from rest_framework.exceptions import ValidationError

from apps.accounts.models import User
from apps.common.errors import pydantic_problems
from apps.datasets.models import DatasetKind, DatasetVersion
from apps.runs.models import Run, RunKind
from apps.runs.services import run_create
from apps.runs.storage import file_uri, storage_uri
from apps.search.models import CorpusIndex, IndexStatus
from workers.search.index import IndexConfig

log = logging.getLogger(__name__)


def index_config_check(config: Any) -> IndexConfig:
    """The typed config, or a 400 naming each bad field (`config.rrf_k`, ...)."""
    if not isinstance(config, dict):
        raise ValidationError({"config": ["must be a JSON object of index settings ({} for the defaults)"]})
    try:
        return IndexConfig.model_validate(config)
    except PydanticError as exc:
        raise ValidationError(pydantic_problems(exc, "config"))


def _check_corpus(corpus_version: DatasetVersion) -> None:
    if corpus_version.dataset.kind != DatasetKind.CORPUS:
        raise ValidationError(
            {
                "corpus_version": [
                    f"{corpus_version} is a {corpus_version.dataset.kind} dataset; "
                    "a search index is built from a dataset of kind 'corpus'"
                ]
            }
        )


def index_launch_or_reuse(
    *, corpus_version: DatasetVersion, config: dict[str, Any], user: User
) -> tuple[CorpusIndex, bool]:
    """(index, launched): the existing index of this corpus version and config unless its build failed, else a
    new INDEX run (dispatched on commit) building it."""
    parsed = index_config_check(config)
    _check_corpus(corpus_version)
    config_hash = parsed.content_hash()
    with transaction.atomic():
        existing = (
            CorpusIndex.objects.select_for_update()
            .select_related("run")
            .filter(corpus_version=corpus_version, config_hash=config_hash)
            .first()
        )
        if existing is not None and existing.status != IndexStatus.FAILED:
            return existing, False
        folder = f"search-indexes/{corpus_version.dataset.name}-v{corpus_version.number}/{config_hash[:16]}"

        def job(run: Run) -> dict[str, Any]:
            return {
                "corpus_uri": file_uri(corpus_version.file),
                "output_uri": storage_uri(f"{folder}-run{run.pk}"),
                "config": parsed.model_dump(mode="json"),
                "corpus_hash": corpus_version.content_hash,
            }

        run = run_create(
            kind=RunKind.INDEX,
            name=f"index {corpus_version} ({config_hash[:10]})",
            job=job,
            dataset_version=corpus_version,
            created_by=user,
            progress_total=corpus_version.row_count,
        )
        path, uri = f"{folder}-run{run.pk}", run.spec["job"]["output_uri"]
        if existing is None:
            index = CorpusIndex.objects.create(
                corpus_version=corpus_version,
                config=parsed.model_dump(mode="json"),
                config_hash=config_hash,
                storage_path=path,
                uri=uri,
                run=run,
                created_by=user,
            )
        else:
            index = existing
            index.run, index.storage_path, index.uri, index.stats = run, path, uri, {}
            index.created_by = user
            index.save(update_fields=["run", "storage_path", "uri", "stats", "created_by"])
    return index, True


def index_launch(*, corpus_version: DatasetVersion, config: dict[str, Any], user: User) -> CorpusIndex:
    return index_launch_or_reuse(corpus_version=corpus_version, config=config, user=user)[0]


def index_finalize(*, run_id: int) -> None:
    """The INDEX run succeeded: read the index's manifest from storage into `stats` and mark it ready.
    Idempotent (the INDEX kind's success hook); an OSError (storage unreachable, manifest missing) lets the task
    retry."""
    index = CorpusIndex.objects.filter(run_id=run_id).first()
    if index is None or index.ready_at is not None:
        return
    with default_storage.open(f"{index.storage_path}/manifest.json", "rb") as handle:
        manifest = json.loads(handle.read())
    with transaction.atomic():
        index = CorpusIndex.objects.select_for_update().select_related("run").get(pk=index.pk)
        if index.ready_at is not None or index.run_id != run_id:
            return
        index.stats = {"manifest": manifest, "summary": index.run.summary}
        index.ready_at = timezone.now()
        index.save(update_fields=["stats", "ready_at"])
