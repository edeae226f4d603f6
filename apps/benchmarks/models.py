from __future__ import annotations

from django.conf import settings
from django.db import models


class Benchmark(models.Model):
    name = models.SlugField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    environment = models.CharField(max_length=64, help_text="Environment the tasks run in, e.g. coding, search")
    metric = models.CharField(max_length=64, help_text="Headline metric, e.g. pass@1, item_f1")
    score_field = models.CharField(
        max_length=64,
        default="reward",
        help_text="What scores one attempt: 'reward' or an episode metric of the environment (tests_passed, ...)",
    )
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
    env_params = models.JSONField(default=dict, blank=True, help_text="Environment parameters, pinned")
    tasks_file = models.FileField(upload_to="benchmarks/", blank=True, help_text="The tasks as JSONL, for eval jobs")
    task_count = models.PositiveIntegerField(default=0)
    notes = models.TextField(blank=True)
    excluded_training_data = models.ManyToManyField("datasets.DatasetVersion", blank=True, related_name="+")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["benchmark", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["benchmark", "number"], name="uniq_benchmark_version"),
            models.UniqueConstraint(fields=["benchmark", "content_hash"], name="uniq_benchmark_version_content"),
        ]

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


class Eval(models.Model):
    """One evaluation of a model (a base model or a training checkpoint) on a benchmark version: a run of kind
    `eval` on Ray; its per-task results are the run's TaskResult rows, its headline metrics land here."""

    run = models.OneToOneField("runs.Run", on_delete=models.CASCADE, related_name="eval")
    benchmark_version = models.ForeignKey(BenchmarkVersion, on_delete=models.PROTECT, related_name="evals")
    checkpoint = models.ForeignKey(
        "runs.Checkpoint", null=True, blank=True, on_delete=models.PROTECT, related_name="evals"
    )
    base_model = models.CharField(max_length=300, help_text="The model evaluated, or the checkpoint's base model")
    k = models.PositiveIntegerField(default=1, help_text="Attempts per task")
    config_hash = models.CharField(max_length=64, db_index=True, help_text="Same hash, same eval: reused")
    metrics = models.JSONField(default=dict, blank=True, help_text="pass@k, mean_score, ... once it succeeded")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"eval {self.pk} ({self.model_label} on {self.benchmark_version})"

    @property
    def model_label(self) -> str:
        if self.checkpoint_id:
            assert self.checkpoint is not None
            return f"run {self.checkpoint.run_id} step {self.checkpoint.step}"
        return self.base_model
