from __future__ import annotations

from django.conf import settings
from django.db import models


class Gate(models.Model):
    """Rules a checkpoint must pass on pinned benchmark versions before it becomes this gate's deployment."""

    name = models.SlugField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    benchmark_versions = models.ManyToManyField("benchmarks.BenchmarkVersion", related_name="gates")
    rules = models.JSONField(default=list, help_text="Thresholds, regression tests, flag-rate ceilings, approval")
    requires_approval = models.BooleanField(
        default=True, help_text="Adds an approval rule when the rules hold none: a human decides last"
    )
    eval_k = models.PositiveIntegerField(default=1, help_text="Attempts per task in the gate's evals")
    max_new_tokens = models.PositiveIntegerField(default=384, help_text="Generation limit in the gate's evals")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="gates")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class CheckStatus(models.TextChoices):
    WAITING = "waiting", "Waiting for evals"
    DECIDED = "decided", "Decided"
    ERROR = "error", "Error"


class GateCheck(models.Model):
    """One request to gate a checkpoint: the evals it started or reused, then the decision once they finish.

    This is the handle CI polls; the decision itself is a separate, immutable GateDecision."""

    gate = models.ForeignKey(Gate, on_delete=models.PROTECT, related_name="checks")
    checkpoint = models.ForeignKey("runs.Checkpoint", on_delete=models.PROTECT, related_name="gate_checks")
    benchmark_versions = models.ManyToManyField("benchmarks.BenchmarkVersion", related_name="+")
    candidate_evals = models.ManyToManyField("benchmarks.Eval", related_name="+")
    baseline_evals = models.ManyToManyField("benchmarks.Eval", related_name="+", blank=True)
    baseline_deployment = models.ForeignKey(
        "Deployment", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    status = models.CharField(max_length=16, choices=CheckStatus.choices, default=CheckStatus.WAITING, db_index=True)
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]


class Verdict(models.TextChoices):
    PASS = "pass", "Pass"
    FAIL = "fail", "Fail"
    PENDING = "pending", "Pending approval"


class Approval(models.TextChoices):
    NONE = "", "Not decided"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"


class GateDecision(models.Model):
    """Immutable record of one gate evaluation: every rule's inputs, statistic and verdict (`evidence`).

    `verdict` is the automated verdict at evaluation time ("pending" when only a human's approval is missing).
    The approval fields are set once, by a user with the approve permission; the outcome is `final_verdict`."""

    gate = models.ForeignKey(Gate, on_delete=models.PROTECT, related_name="decisions")
    checkpoint = models.ForeignKey("runs.Checkpoint", on_delete=models.PROTECT, related_name="gate_decisions")
    gate_check = models.OneToOneField(
        GateCheck, null=True, blank=True, on_delete=models.PROTECT, related_name="decision"
    )
    verdict = models.CharField(max_length=16, choices=Verdict.choices)
    evidence = models.JSONField(default=dict)
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    approved_at = models.DateTimeField(null=True, blank=True)
    approval = models.CharField(max_length=16, blank=True, choices=Approval.choices)
    approval_note = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"decision {self.pk} ({self.gate.name}: {self.final_verdict})"

    @property
    def final_verdict(self) -> str:
        """pass | fail | pending: the automated verdict with the human's approval applied."""
        if self.verdict == Verdict.FAIL or self.approval == Approval.REJECTED:
            return Verdict.FAIL
        if self.verdict == Verdict.PENDING:
            return Verdict.PASS if self.approval == Approval.APPROVED else Verdict.PENDING
        return Verdict.PASS

    @property
    def stages(self) -> list[dict[str, str]]:
        """The decision's one verdict as steps: the automatic checks (every rule but the approval), then the
        approval. Each step has a state: checks pass | fail; approval not needed | waiting | approved | rejected |
        skipped (the checks failed). Pages, the API, webhooks and the CLI show these, never the stored
        `verdict` field beside the final one (issue 39: a page said "pass", "pending" and "approved" at once)."""
        checks = "fail" if self.verdict == Verdict.FAIL else "pass"
        if self.approval:
            approval, by = self.approval, self.approved_by.username if self.approved_by else ""
        else:
            approval = {"fail": "skipped", "pending": "waiting"}.get(str(self.verdict), "not needed")
            by = ""
        return [
            {"stage": "checks", "label": "automatic checks", "state": checks},
            {"stage": "approval", "label": "approval", "state": approval, "by": by},
        ]


class Deployment(models.Model):
    """A checkpoint serving behind a gate. Exactly one is current per gate; a rollback is a new row that
    points at the one it replaced (`rolled_back_from`), so history is never rewritten."""

    gate = models.ForeignKey(Gate, on_delete=models.PROTECT, related_name="deployments")
    checkpoint = models.ForeignKey("runs.Checkpoint", on_delete=models.PROTECT, related_name="deployments")
    decision = models.ForeignKey(GateDecision, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    is_current = models.BooleanField(default=True)
    rolled_back_from = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    note = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["gate"], condition=models.Q(is_current=True), name="one_current_deployment_per_gate"
            )
        ]

    def __str__(self) -> str:
        return f"deployment {self.pk} of {self.checkpoint} behind {self.gate.name}"
