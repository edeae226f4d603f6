from __future__ import annotations

from django.conf import settings
from django.db import models


class Severity(models.TextChoices):
    LOW = "low", "Low"
    MEDIUM = "medium", "Medium"
    HIGH = "high", "High"


class Flag(models.Model):
    """A detector's suspicion about one trajectory (suspected reward hacking), with its evidence."""

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="flags")
    trajectory = models.ForeignKey(
        "runs.TrajectorySummary", null=True, blank=True, on_delete=models.SET_NULL, related_name="flags"
    )
    trajectory_ref = models.CharField(max_length=200)
    detector = models.CharField(max_length=64)
    detector_version = models.CharField(max_length=16)
    severity = models.CharField(max_length=8, choices=Severity.choices, default=Severity.MEDIUM)
    evidence = models.JSONField(default=dict)
    step = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "trajectory_ref", "detector"], name="uniq_flag_per_detector")
        ]


class Label(models.TextChoices):
    CONFIRMED = "confirmed", "Confirmed hack"
    FALSE_POSITIVE = "false_positive", "False positive"
    UNCLEAR = "unclear", "Unclear"


class Review(models.Model):
    flag = models.ForeignKey(Flag, on_delete=models.CASCADE, related_name="reviews")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="reviews")
    label = models.CharField(max_length=16, choices=Label.choices)
    note = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["flag", "reviewer"], name="one_review_per_reviewer")]


SEVERITY_PRIORITY = {Severity.LOW: 0, Severity.MEDIUM: 1, Severity.HIGH: 2}
"""Queue order: the most severe flags are claimed first."""


class ReviewQueue(models.Model):
    """Where flags wait for people: every flag matching the filters (run, detector, lowest severity; blank means
    any) becomes one item per trajectory. An item is done once `required_reviews` reviewers labelled it; a
    reviewer holds an item for `lock_timeout_s` seconds, after which another may take it over."""

    name = models.SlugField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    run = models.ForeignKey("runs.Run", null=True, blank=True, on_delete=models.CASCADE, related_name="review_queues")
    detector = models.CharField(max_length=64, blank=True)
    min_severity = models.CharField(max_length=8, choices=Severity.choices, blank=True)
    required_reviews = models.PositiveSmallIntegerField(default=1)
    lock_timeout_s = models.PositiveIntegerField(default=900)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    synced_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=models.Q(required_reviews__gte=1), name="queue_needs_a_review"),
            models.CheckConstraint(condition=models.Q(lock_timeout_s__gte=10), name="queue_lock_at_least_10s"),
        ]

    def __str__(self) -> str:
        return self.name


class ItemStatus(models.TextChoices):
    OPEN = "open", "Open"
    DONE = "done", "Done"


class QueueItem(models.Model):
    """One flagged trajectory in one queue (a trajectory is queued once per queue, by its most severe flag)."""

    queue = models.ForeignKey(ReviewQueue, on_delete=models.CASCADE, related_name="items")
    flag = models.ForeignKey(Flag, on_delete=models.CASCADE, related_name="queue_items")
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="+")
    trajectory_ref = models.CharField(max_length=200)
    priority = models.PositiveSmallIntegerField(default=0, help_text="Severity rank: higher is claimed first")
    status = models.CharField(max_length=8, choices=ItemStatus.choices, default=ItemStatus.OPEN)
    locked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    locked_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    done_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["queue", "run", "trajectory_ref"], name="uniq_trajectory_per_queue")
        ]
        indexes = [models.Index(fields=["queue", "status", "-priority", "id"], name="queue_item_next_idx")]

    def __str__(self) -> str:
        return f"{self.queue.name}#{self.pk}"


class DraftStatus(models.TextChoices):
    DRAFT = "draft", "Draft"
    ACCEPTED = "accepted", "Accepted"
    DISCARDED = "discarded", "Discarded"


class RewardDraft(models.Model):
    """A reward config change proposed from a confirmed hack, waiting for an operator: `proposed_spec` is the base
    version's spec with a penalty term for the flag's detector added or tightened. Accepting it creates the next
    version of the base version's config."""

    flag = models.ForeignKey(Flag, on_delete=models.CASCADE, related_name="reward_drafts")
    base_version = models.ForeignKey("rewards.RewardConfigVersion", on_delete=models.PROTECT, related_name="+")
    proposed_spec = models.JSONField()
    reason = models.TextField()
    status = models.CharField(max_length=16, choices=DraftStatus.choices, default=DraftStatus.DRAFT)
    result_version = models.ForeignKey(
        "rewards.RewardConfigVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]


class TaskExclusion(models.Model):
    """A task that must not be trained on again: training launches on a version of `dataset` holding `task_id` are
    refused unless the caller allows excluded tasks."""

    dataset = models.ForeignKey("datasets.Dataset", on_delete=models.CASCADE, related_name="task_exclusions")
    task_id = models.CharField(max_length=200)
    flag = models.ForeignKey(Flag, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    reason = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["dataset", "task_id"], name="uniq_task_exclusion")]


class ActionKind(models.TextChoices):
    REWARD_DRAFT = "reward_draft", "Drafted a reward config version"
    DRAFT_ACCEPT = "draft_accept", "Accepted a reward draft"
    DRAFT_DISCARD = "draft_discard", "Discarded a reward draft"
    BENCHMARK_PROMOTE = "benchmark_promote", "Promoted the task to a benchmark"
    TASK_EXCLUDE = "task_exclude", "Excluded the task from training data"


class ReviewAction(models.Model):
    """What a label led to: who did it, when, and the row it created (a draft, a reward or benchmark version, an
    exclusion)."""

    kind = models.CharField(max_length=24, choices=ActionKind.choices)
    flag = models.ForeignKey(Flag, on_delete=models.CASCADE, related_name="actions")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    draft = models.ForeignKey(RewardDraft, null=True, blank=True, on_delete=models.SET_NULL, related_name="actions")
    reward_version = models.ForeignKey(
        "rewards.RewardConfigVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    benchmark_version = models.ForeignKey(
        "benchmarks.BenchmarkVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    exclusion = models.ForeignKey(
        TaskExclusion, null=True, blank=True, on_delete=models.SET_NULL, related_name="actions"
    )
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
