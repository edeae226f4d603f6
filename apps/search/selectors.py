"""Reads for search: the ready index of a corpus version (what the harness loads), and a datagen run's report."""

from __future__ import annotations

import json
from typing import Any

from django.core.files.storage import default_storage
from rest_framework.exceptions import ValidationError

from apps.datasets.models import DatasetVersion
from apps.runs.models import Run
from apps.search.models import CorpusIndex
from workers.search.index import IndexConfig

LAUNCH_HINT = 'POST /api/v1/search-indexes/ {"corpus_version": <id>, "config": {}} or the Search indexes page'


def index_for(corpus_version: DatasetVersion, config: dict[str, Any] | None = None) -> CorpusIndex | None:
    """The ready index of `corpus_version`: with `config`, exactly that config's; without, the default config's
    if it is ready, else the most recently finished one."""
    ready = CorpusIndex.objects.filter(corpus_version=corpus_version, ready_at__isnull=False)
    if config is not None:
        return ready.filter(config_hash=IndexConfig.model_validate(config).content_hash()).first()
    default = ready.filter(config_hash=IndexConfig().content_hash()).first()
    return default or ready.order_by("-ready_at").first()


def ready_index_uri(corpus_version: DatasetVersion) -> str:
    """The URI the harness loads (workers.search.index_store.load_index); a 400 telling how to build one if none is
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


TASKS_FILE = "tasks.jsonl"
REPORT_FILE = "report.json"


def datagen_outputs(run: Run) -> dict[str, str]:
    """Where a datagen run's job writes its task rows and report (storage names). The nonce keeps a reset database's
    reused run ids from finding an older run's files."""
    folder = f"runs/{run.pk}/datagen-{run.ingest_nonce[:8]}"
    return {"tasks": f"{folder}/{TASKS_FILE}", "report": f"{folder}/{REPORT_FILE}"}


def datagen_report(run: Run) -> dict[str, Any] | None:
    """The job's verification report from storage, or None while the job has not written it."""
    name = datagen_outputs(run)["report"]
    if not default_storage.exists(name):
        return None
    with default_storage.open(name, "rb") as handle:
        report: dict[str, Any] = json.loads(handle.read())
    return report
