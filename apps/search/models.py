from __future__ import annotations

from django.conf import settings
from django.db import models

from apps.runs.models import RunStatus


class IndexStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    BUILDING = "building", "Building"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"


class CorpusIndex(models.Model):
    """A search index of one corpus version under one IndexConfig (workers.search.index), built by an INDEX run.

    One row per (corpus version, config hash): building the same thing twice reuses the row, and a failed build
    is replaced on the same row by a new run. Ready once the run succeeded and its manifest was read (`ready_at`);
    before that the status follows the run."""

    corpus_version = models.ForeignKey(
        "datasets.DatasetVersion", on_delete=models.PROTECT, related_name="search_indexes"
    )
    config = models.JSONField(help_text="workers.search.index.IndexConfig with every default filled in")
    config_hash = models.CharField(max_length=64, help_text="sha256 of the canonical config JSON")
    storage_path = models.CharField(max_length=500, help_text="The index directory's name in the project's storage")
    uri = models.CharField(max_length=500, help_text="The same directory as a worker opens it (fsspec URL)")
    run = models.ForeignKey("runs.Run", on_delete=models.PROTECT, related_name="search_indexes")
    stats = models.JSONField(default=dict, blank=True, help_text="The index manifest and the build's summary")
    ready_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["corpus_version", "config_hash"], name="uniq_index_per_corpus_config")
        ]

    def __str__(self) -> str:
        return f"index {self.pk} of {self.corpus_version_id} ({self.config_hash[:10]})"

    @property
    def status(self) -> str:
        if self.ready_at is not None:
            return IndexStatus.READY
        run_status = self.run.status
        if run_status == RunStatus.PENDING:
            return IndexStatus.PENDING
        if run_status in (RunStatus.FAILED, RunStatus.STOPPED):
            return IndexStatus.FAILED
        return IndexStatus.BUILDING  # running, or succeeded and being registered
