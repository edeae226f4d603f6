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
