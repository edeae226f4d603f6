from __future__ import annotations

from django.conf import settings
from django.db import models


class Gate(models.Model):
    name = models.SlugField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    benchmark_versions = models.ManyToManyField("benchmarks.BenchmarkVersion", related_name="gates")
    rules = models.JSONField(default=list, help_text="Thresholds, regression tests, flag-rate ceilings, approval")
    requires_approval = models.BooleanField(default=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="gates")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class Verdict(models.TextChoices):
    PASS = "pass", "Pass"
    FAIL = "fail", "Fail"
    PENDING = "pending", "Pending"


class GateDecision(models.Model):
    """Immutable record of one gate evaluation: every rule's inputs, statistic and verdict."""

    gate = models.ForeignKey(Gate, on_delete=models.PROTECT, related_name="decisions")
    checkpoint = models.ForeignKey("runs.Checkpoint", on_delete=models.PROTECT, related_name="gate_decisions")
    verdict = models.CharField(max_length=16, choices=Verdict.choices)
    evidence = models.JSONField(default=dict)
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    approved_at = models.DateTimeField(null=True, blank=True)
    approval = models.CharField(max_length=16, blank=True, help_text="approved | rejected")
    created_at = models.DateTimeField(auto_now_add=True)


class Deployment(models.Model):
    gate = models.ForeignKey(Gate, on_delete=models.PROTECT, related_name="deployments")
    checkpoint = models.ForeignKey("runs.Checkpoint", on_delete=models.PROTECT, related_name="deployments")
    decision = models.ForeignKey(GateDecision, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    is_current = models.BooleanField(default=True)
    rolled_back_from = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["gate"], condition=models.Q(is_current=True), name="one_current_deployment_per_gate"
            )
        ]
