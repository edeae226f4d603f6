from __future__ import annotations

from django.conf import settings
from django.db import models


class Benchmark(models.Model):
    name = models.SlugField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    environment = models.CharField(max_length=64, help_text="Environment the tasks run in, e.g. coding, search")
    metric = models.CharField(max_length=64, help_text="Headline metric, e.g. pass@1, item_f1")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="benchmarks")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class BenchmarkVersion(models.Model):
    """An immutable, content-hashed suite; lists the dataset versions its tasks must never be trained on."""

    benchmark = models.ForeignKey(Benchmark, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    content_hash = models.CharField(max_length=64)
    notes = models.TextField(blank=True)
    excluded_training_data = models.ManyToManyField("datasets.DatasetVersion", blank=True, related_name="+")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["benchmark", "-number"]
        constraints = [models.UniqueConstraint(fields=["benchmark", "number"], name="uniq_benchmark_version")]

    def __str__(self) -> str:
        return f"{self.benchmark.name}@v{self.number}"


class TaskProvenance(models.TextChoices):
    HAND_WRITTEN = "hand_written", "Hand-written"
    IMPORTED = "imported", "Imported"
    SESSION = "session", "Promoted from a production session"
    REVIEW = "review", "Promoted from a review"


class BenchmarkTask(models.Model):
    version = models.ForeignKey(BenchmarkVersion, on_delete=models.CASCADE, related_name="tasks")
    task_id = models.CharField(max_length=200)
    payload = models.JSONField()
    tags = models.JSONField(default=list, blank=True)
    difficulty = models.CharField(max_length=32, blank=True)
    provenance = models.CharField(max_length=16, choices=TaskProvenance.choices, default=TaskProvenance.HAND_WRITTEN)
    source_ref = models.CharField(max_length=300, blank=True, help_text="Session, trajectory or file it came from")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["version", "task_id"], name="uniq_task_per_benchmark_version")]

    def __str__(self) -> str:
        return self.task_id
