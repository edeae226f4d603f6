from __future__ import annotations

from django.conf import settings
from django.db import models


class DatasetKind(models.TextChoices):
    TASKS = "tasks", "Tasks"
    CORPUS = "corpus", "Corpus"
    TRAJECTORIES = "trajectories", "Trajectories"
    SESSIONS = "sessions", "Sessions"
    REPO_TASKS = "repo_tasks", "Repository tasks"


class Dataset(models.Model):
    name = models.SlugField(max_length=100, unique=True)
    kind = models.CharField(max_length=16, choices=DatasetKind.choices)
    description = models.TextField(blank=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="datasets")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class DatasetVersion(models.Model):
    """An immutable upload: the file in storage, its row count, content hash and validation report."""

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    file = models.FileField(upload_to="datasets/%Y/%m/")
    row_count = models.PositiveIntegerField()
    size_bytes = models.PositiveBigIntegerField()
    content_hash = models.CharField(max_length=64, db_index=True)
    validation_report = models.JSONField(default=dict)
    notes = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["dataset", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["dataset", "number"], name="uniq_dataset_version_number"),
            models.UniqueConstraint(fields=["dataset", "content_hash"], name="uniq_dataset_version_content"),
        ]

    def __str__(self) -> str:
        return f"{self.dataset.name}@v{self.number}"
