"""Writes and reads for search indexes: launch a build (an INDEX run), register it when it succeeds, find the
ready index of a corpus version for the harness."""

from __future__ import annotations

import json
import logging
import secrets
from typing import Any

from django.core.files.storage import default_storage
from django.db import transaction
from django.utils import timezone
from pydantic import ValidationError as PydanticError
from rest_framework.exceptions import ValidationError

from apps.accounts.models import User
from apps.datasets.models import DatasetKind, DatasetVersion
from apps.runs.models import Run, RunKind
from apps.runs.storage import storage_uri
from apps.search.models import CorpusIndex, IndexStatus
from workers.search.index import IndexConfig

log = logging.getLogger(__name__)

LAUNCH_HINT = 'POST /api/v1/search-indexes/ {"corpus_version": <id>, "config": {}} or the Search indexes page'


def index_config_check(config: Any) -> IndexConfig:
    """The typed config, or a 400 naming each bad field (`config.rrf_k`, ...)."""
    if not isinstance(config, dict):
        raise ValidationError({"config": ["must be a JSON object of index settings ({} for the defaults)"]})
    try:
        return IndexConfig.model_validate(config)
    except PydanticError as exc:
        fields: dict[str, list[str]] = {}
        for err in exc.errors()[:20]:
            path = ".".join(str(p) for p in ("config", *err["loc"]))
            fields.setdefault(path, []).append(err["msg"])
        raise ValidationError(fields)


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
        run = Run.objects.create(
            kind=RunKind.INDEX,
            name=f"index {corpus_version} ({config_hash[:10]})"[:200],
            spec={},
            dataset_version=corpus_version,
            ingest_nonce=secrets.token_hex(16),
            created_by=user,
            progress_total=corpus_version.row_count,
        )
        path = f"search-indexes/{corpus_version.dataset.name}-v{corpus_version.number}/{config_hash[:16]}-run{run.pk}"
        uri = storage_uri(path)
        # The job's whole input (apps.runs.services.worker_spec adds run id, ingest URL and storage options).
        run.spec = {
            "job": {
                "corpus_uri": storage_uri(corpus_version.file.name),
                "output_uri": uri,
                "config": parsed.model_dump(mode="json"),
                "corpus_hash": corpus_version.content_hash,
            }
        }
        run.save(update_fields=["spec"])
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
        _dispatch_on_commit(run)
    return index, True


def index_launch(*, corpus_version: DatasetVersion, config: dict[str, Any], user: User) -> CorpusIndex:
    return index_launch_or_reuse(corpus_version=corpus_version, config=config, user=user)[0]


def _dispatch_on_commit(run: Run) -> None:
    from apps.runs.tasks import dispatch_run

    transaction.on_commit(lambda: dispatch_run.delay(run.pk))


def index_finalize(*, run_id: int) -> None:
    """The INDEX run succeeded: read the index's manifest from storage into `stats` and mark it ready.
    Idempotent (runs.SUCCESS_HOOKS); an OSError (storage unreachable, manifest missing) lets the task retry."""
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


def index_for(corpus_version: DatasetVersion, config: dict[str, Any] | None = None) -> CorpusIndex | None:
    """The ready index of `corpus_version`: with `config`, exactly that config's; without, the default config's
    if it is ready, else the most recently finished one."""
    ready = CorpusIndex.objects.filter(corpus_version=corpus_version, ready_at__isnull=False)
    if config is not None:
        return ready.filter(config_hash=index_config_check(config).content_hash()).first()
    default = ready.filter(config_hash=IndexConfig().content_hash()).first()
    return default or ready.order_by("-ready_at").first()


def ready_index_uri(corpus_version: DatasetVersion) -> str:
    """The URI the harness loads (workers.search.index.load_index); a 400 telling how to build one if none is
    ready."""
    index = index_for(corpus_version)
    if index is None:
        building = CorpusIndex.objects.filter(corpus_version=corpus_version, ready_at__isnull=True).first()
        state = f" (index {building.pk} is {building.status})" if building is not None else ""
        raise ValidationError(
            {
                "corpus_version": [
                    f"{corpus_version} has no ready search index{state}; build an index first: {LAUNCH_HINT}"
                ]
            }
        )
    return index.uri
