"""The real-time RL loop of a gate, and its cycles (collect → train → evaluate → gate → deploy).

A `Loop` is configured per gate: the serving run whose sessions feed it, the session reward version, how many
sessions a cycle needs, the training settings and whether a human approves. Celery beat advances every active loop
(`apps.realtime.tasks.realtime_loops_tick`); each `Cycle` walks the phases in order and records when each began and
ended (`timeline`), so the cycle page draws the timeline and the median cycle time is a query.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Loop(models.Model):
    gate = models.OneToOneField("gates.Gate", on_delete=models.PROTECT, related_name="realtime_loop")
    serve_run = models.ForeignKey(
        "runs.Run", on_delete=models.PROTECT, related_name="+", help_text="The serving run whose sessions feed it"
    )
    reward_version = models.ForeignKey(
        "rewards.RewardConfigVersion", on_delete=models.PROTECT, related_name="+", help_text="Session reward"
    )
    min_sessions = models.PositiveIntegerField(default=8, help_text="A cycle never trains on fewer sessions")
    target_sessions = models.PositiveIntegerField(default=64, help_text="Collect as soon as this many are ready")
    max_wait_seconds = models.PositiveIntegerField(
        default=5 * 3600, help_text="Collect what is ready (at least min_sessions) once a cycle has waited this long"
    )
    settle_seconds = models.PositiveIntegerField(
        default=30, help_text="A session is collected once its last turn is this old (time for its feedback)"
    )
    training = models.JSONField(default=dict, help_text="Session trainer settings (SessionTrainSpec config etc.)")
    requires_approval = models.BooleanField(default=False, help_text="A human approves each deployment")
    paused = models.BooleanField(default=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"loop of {self.gate}"


class CyclePhase(models.TextChoices):
    COLLECT = "collect", "Collect"
    TRAIN = "train", "Train"
    EVALUATE = "evaluate", "Evaluate and gate"
    DEPLOY = "deploy", "Deploy"
    DONE = "done", "Done"


class CycleStatus(models.TextChoices):
    RUNNING = "running", "Running"
    DEPLOYED = "deployed", "Deployed"
    BLOCKED = "blocked", "Blocked by the gate"
    FAILED = "failed", "Failed"


class Cycle(models.Model):
    loop = models.ForeignKey(Loop, on_delete=models.CASCADE, related_name="cycles")
    number = models.PositiveIntegerField()
    phase = models.CharField(max_length=16, choices=CyclePhase.choices, default=CyclePhase.COLLECT)
    status = models.CharField(max_length=16, choices=CycleStatus.choices, default=CycleStatus.RUNNING, db_index=True)
    reason = models.TextField(blank=True, help_text="Why it failed or was blocked; what it waits for")
    timeline = models.JSONField(default=list, help_text="[{phase, started_at, ended_at}] in order")
    base_deployment = models.ForeignKey(
        "gates.Deployment", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    sessions = models.PositiveIntegerField(default=0)
    turns = models.PositiveIntegerField(default=0)
    tokens = models.BigIntegerField(default=0)
    on_policy_share = models.FloatField(null=True, blank=True)
    feedback_share = models.FloatField(null=True, blank=True, help_text="Share of sessions with any feedback")
    reward_mean = models.FloatField(null=True, blank=True)
    dataset_version = models.ForeignKey(
        "datasets.DatasetVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    train_run = models.ForeignKey("runs.Run", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    checkpoint = models.ForeignKey("runs.Checkpoint", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    gate_check = models.ForeignKey("gates.GateCheck", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    deployment = models.ForeignKey(
        "gates.Deployment", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    eval_deltas = models.JSONField(default=dict, help_text="{benchmark: {candidate, baseline, delta}}")
    started_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-loop_id", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["loop", "number"], name="uniq_cycle_number"),
            models.UniqueConstraint(
                fields=["loop"], condition=models.Q(status="running"), name="one_running_cycle_per_loop"
            ),
        ]

    def __str__(self) -> str:
        return f"cycle {self.number} of {self.loop}"

    @property
    def seconds(self) -> float | None:
        if self.ended_at is None:
            return None
        return (self.ended_at - self.started_at).total_seconds()
