from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.indexes import GinIndex
from django.db import models


class RunKind(models.TextChoices):
    """The kinds that ship with Crucible, as constants for their owning apps. The field takes any kind an app
    registers (apps.runs.kinds): a new kind needs no change here and no migration."""

    RESCORE = "rescore", "Offline re-scoring"
    TRAIN = "train", "Training"
    EVAL = "eval", "Evaluation"
    INDEX = "index", "Index build"
    DATAGEN = "datagen", "Data generation"
    SFT = "sft", "SFT warm-up"


class RunStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    STOPPED = "stopped", "Stopped"


TERMINAL_STATUSES = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.STOPPED})


class Run(models.Model):
    """One Ray job of any kind, with one lifecycle: pending [-> queued -> pending] -> running -> succeeded | failed |
    stopped. A run whose kind declares resources waits *queued* until the cluster (and its owner's quota) can hold
    it (apps.runs.services.queue); it is submitted to Ray only then."""

    kind = models.CharField(max_length=16, help_text="A registered run kind (apps.runs.kinds)")
    name = models.CharField(max_length=200, blank=True)
    spec = models.JSONField(help_text="Validated by the worker's typed schema for this kind")
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.PENDING, db_index=True)
    dataset_version = models.ForeignKey(
        "datasets.DatasetVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="runs"
    )
    reward_version = models.ForeignKey(
        "rewards.RewardConfigVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="runs"
    )
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children")
    tags = models.JSONField(default=list, blank=True)
    priority = models.SmallIntegerField(default=0, help_text="Queue order: higher first, then first come")
    resources = models.JSONField(
        default=dict, blank=True, help_text="What the run asks the cluster for (its kind's resource plan); {}: none"
    )
    queued_reason = models.TextField(blank=True, help_text="What a queued run waits for")
    admitted_at = models.DateTimeField(
        null=True, blank=True, help_text="When the queue let it onto the cluster: from then on its resources count"
    )
    ray_job_id = models.CharField(max_length=100, blank=True)
    ray_address = models.CharField(max_length=300, blank=True)
    ingest_nonce = models.CharField(max_length=64, blank=True, help_text="Seed of the per-run ingest token (HMAC)")
    ray_checked_at = models.DateTimeField(null=True, blank=True, help_text="Last time the Ray cluster answered")
    progress_done = models.PositiveBigIntegerField(default=0)
    progress_total = models.PositiveBigIntegerField(default=0)
    last_seq = models.BigIntegerField(default=0, help_text="Highest event sequence number ingested")
    progress_seq = models.BigIntegerField(default=0, help_text="Seq of the progress event shown (never goes back)")
    log_seq = models.BigIntegerField(default=0, help_text="Highest seq of a log event in log_tail")
    ingest_batches = models.BigIntegerField(
        default=0, help_text="Batches committed so far: a reconnecting page resumes after the last one it saw"
    )
    failure_reason = models.TextField(blank=True)
    reported_outcome = models.CharField(
        max_length=16, blank=True, help_text="The worker's own `end` event: succeeded or failed (blank: none yet)"
    )
    reported_error = models.TextField(blank=True, help_text="The error the worker's `end` event carried")
    late_events = models.BigIntegerField(
        default=0, help_text="Events stored after the run had ended (a replayed spool, a driver that outlived it)"
    )
    log_tail = models.TextField(blank=True)
    summary = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="runs")
    created_at = models.DateTimeField(auto_now_add=True)
    submitted_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    last_event_at = models.DateTimeField(null=True, blank=True, help_text="When the job's latest batch arrived")
    stalled_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Set by the stall watchdog when a running job stayed silent past its limit; cleared when it talks",
    )
    stall_report = models.TextField(blank=True, help_text="Why the run was marked stalled, and its stack dumps")
    health = models.CharField(
        max_length=8,
        default="unknown",
        db_index=True,
        help_text="The health panel's overall status (ok, warn, bad, unknown), refreshed by beat (apps/runs/health.py)",
    )
    health_problems = models.JSONField(default=list, blank=True, help_text="Titles of the signals at warn or bad")
    health_at = models.DateTimeField(null=True, blank=True, help_text="When `health` was last computed")
    learning = models.JSONField(
        default=dict,
        blank=True,
        help_text="Did it learn? The reward trend and signal share (stored with `health`) and the last evaluated "
        "checkpoint against the run's base (stored when an eval finishes): docs/did-it-learn.md",
    )
    phase = models.CharField(
        max_length=40,
        blank=True,
        default="",
        help_text="What the job said it is doing (generation, training, weight_sync, evaluation): the stall "
        "watchdog applies that phase's limit",
    )

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["kind", "status"]),
            # The runs list: newest first, alone or after one equality filter, reads the page off an index.
            models.Index(fields=["-created_at", "-id"], name="run_recent_idx"),
            models.Index(fields=["status", "-created_at", "-id"], name="run_status_recent_idx"),
            models.Index(fields=["kind", "-created_at", "-id"], name="run_kind_recent_idx"),
            models.Index(fields=["created_by", "-created_at", "-id"], name="run_owner_recent_idx"),
            GinIndex(fields=["tags"], opclasses=["jsonb_path_ops"], name="run_tags_idx"),
            # The list's `learning=` filter (learning @> {"eval": {"verdict": "better"}}).
            GinIndex(fields=["learning"], opclasses=["jsonb_path_ops"], name="run_learning_idx"),
            # The name search (icontains: UPPER(name) LIKE '%Q%') uses run_name_trgm_idx, a trigram index on
            # UPPER(name) created by raw SQL in migration 0007: OpClass() in Meta needs django.contrib.postgres
            # in INSTALLED_APPS.
        ]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.kind})"

    @property
    def submission_id(self) -> str:
        # The nonce keeps ids unique on a shared cluster after a database reset reuses primary keys.
        return f"crucible-run-{self.pk}-{self.ingest_nonce[:8]}" if self.ingest_nonce else f"crucible-run-{self.pk}"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def progress_fraction(self) -> float:
        return self.progress_done / self.progress_total if self.progress_total else 0.0


class IngestedRange(models.Model):
    """The idempotency ledger: the seq numbers each ingest batch stored, as closed ranges (a batch of 1,000
    consecutive events is one row). A seq inside any range of its run was stored and is never stored again."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="ingested_ranges")
    lo = models.BigIntegerField()
    hi = models.BigIntegerField()
    batch = models.BigIntegerField()

    class Meta:
        indexes = [models.Index(fields=["run", "hi"], name="ingested_range_hi_idx")]


class RunEvent(models.Model):
    """Every non-metric event (logs, progress, trajectories, artifacts...), for replay to a reconnecting page and
    the events API. Metric values live in MetricPoint only; IngestedRange keeps every kind exactly-once."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    seq = models.BigIntegerField()
    batch = models.BigIntegerField(default=0, help_text="The run's ingest batch (commit order) that stored it")
    kind = models.CharField(max_length=16)
    data = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="uniq_run_event_seq")]
        indexes = [models.Index(fields=["run", "batch"], name="run_event_batch_idx")]


class MetricPoint(models.Model):
    # The hottest table (a row per logged value). No database-level foreign key and no index of its own on run_id:
    # PostgreSQL would check the key row by row at commit and keep a second index, 40% of a 1,000-point batch's
    # COPY (bench/ingest_vs_mlflow.py). Ingest writes points only under the run's row lock, the series index below
    # leads with run_id, and deleting a run still cascades here (Django collects the points).
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="metric_points", db_constraint=False, db_index=False
    )
    step = models.BigIntegerField()
    name = models.CharField(max_length=100)
    value = models.FloatField()
    time = models.DateTimeField()

    class Meta:
        # Covering index: chart reads (downsampling in SQL) become index-only scans.
        indexes = [models.Index(fields=["run", "name", "step"], include=["value"], name="metric_series_idx")]


ROLLUP_STEPS = 64
"""Steps per roll-up bucket: a million-step series reads ~15,600 roll-up rows instead of a million points."""


class MetricRollup(models.Model):
    """Per-series aggregates of `ROLLUP_STEPS` consecutive steps (bucket = step // ROLLUP_STEPS), kept by ingest in
    the same transaction as the points. Long series are downsampled from these: min and max stay exact envelopes,
    the mean is sum / count."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metric_rollups")
    name = models.CharField(max_length=100)
    bucket = models.BigIntegerField()
    min = models.FloatField()
    max = models.FloatField()
    sum = models.FloatField()
    count = models.BigIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "name", "bucket"], name="uniq_metric_rollup_bucket"),
        ]


class TrajectorySummary(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="trajectories")
    trajectory_id = models.CharField(max_length=200)
    task_id = models.CharField(max_length=200, blank=True)
    step = models.BigIntegerField(default=0)
    reward = models.FloatField(null=True)
    terms = models.JSONField(default=dict)
    num_turns = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0, help_text="Tokens the policy sampled (0: not reported)")
    error = models.TextField(blank=True)
    storage_uri = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "trajectory_id"], name="uniq_trajectory_per_run")]
        indexes = [models.Index(fields=["run", "reward"])]


class TaskResult(models.Model):
    """One task's result in an evaluation run: `passed` of `samples` attempts; `score` in [0, 1]."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="task_results")
    task_id = models.CharField(max_length=200)
    samples = models.PositiveIntegerField()
    passed = models.PositiveIntegerField()
    score = models.FloatField()
    outcomes = models.JSONField(default=dict, blank=True, help_text="How attempts ended: ok, failed, timeout, ...")
    trajectory_ids = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "task_id"]
        constraints = [models.UniqueConstraint(fields=["run", "task_id"], name="uniq_task_result_per_run")]

    def __str__(self) -> str:
        return f"{self.run_id}:{self.task_id}"


class Artifact(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="artifacts")
    name = models.CharField(max_length=200)
    uri = models.CharField(max_length=500)
    size_bytes = models.PositiveBigIntegerField(default=0)
    meta = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "name"], name="uniq_artifact_name_per_run")]


class Checkpoint(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints")
    step = models.BigIntegerField()
    uri = models.CharField(max_length=500)
    metrics = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "step"]
        constraints = [models.UniqueConstraint(fields=["run", "step"], name="uniq_checkpoint_step")]

    def __str__(self) -> str:
        return f"{self.run_id}@{self.step}"


class PanelLayout(models.Model):
    """How one user arranges a run page's charts, kept per scope (`apps.runs.layouts.scope_of`: the run's
    environment, which decides the metrics its runs report): pinned panels in order, hidden ones, the sections
    they opened, smoothing, log scales and the x-axis. Validated by `apps.runs.layouts.clean_layout`."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="panel_layouts")
    scope = models.CharField(max_length=100)
    layout = models.JSONField(default=dict)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "scope"], name="uniq_panel_layout_per_scope")]
