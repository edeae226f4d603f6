"""Served sessions, their turns and their feedback.

A `Session` is one client conversation with a serving run (`kind=serve`), named by the client's session id
(`X-Session-Id`); the serving job records every completion as a `SessionTurn` through the batched ingest path
(`session_turn` events, apps.realtime.hooks), and the client posts typed `Feedback` about it
(`POST /api/v1/sessions/{session_id}/feedback/`). The session row keeps what the browser, the A/B statistics and the
cycle's collect phase read without touching the turns: who called, which arm and deployment served it, the policy
versions of its first and last turn, its token counts, its feedback counts by signal, and its last scoring.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from workers.session_records import EVENT_ID_MAX, SESSION_ID_MAX, SIGNALS

__all__ = ["Feedback", "Session", "SessionTurn"]

SIGNAL_CHOICES = [(signal, signal.replace("_", " ")) for signal in SIGNALS]
"""workers.session_records.Signal as model choices."""


class Session(models.Model):
    serve_run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="sessions")
    client_session_id = models.CharField(max_length=SESSION_ID_MAX, help_text="The client's session id")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="Who called (the API token's owner); empty for a simulator's sessions",
    )
    token = models.ForeignKey("accounts.ApiToken", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    task_type = models.CharField(max_length=100, blank=True, help_text="Client-declared kind of work")
    arm = models.CharField(max_length=16, blank=True, help_text="A/B arm of its first turn ('' with one deployment)")
    deployment = models.ForeignKey(
        "gates.Deployment",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The deployment that served its first turn (empty: a fixed checkpoint or the base model)",
    )
    first_policy_version = models.PositiveIntegerField(default=0, help_text="Checkpoint id of its first turn")
    last_policy_version = models.PositiveIntegerField(default=0, help_text="Checkpoint id of its last turn")
    num_turns = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    feedback_counts = models.JSONField(default=dict, blank=True, help_text="{signal: count} of its feedback")
    started_at = models.DateTimeField(help_text="When its first turn finished")
    last_turn_at = models.DateTimeField(help_text="When its last turn finished (the feedback window starts here)")
    cycle = models.ForeignKey(
        "realtime.Cycle",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="collected_sessions",
        help_text="The cycle whose collect phase froze it",
    )
    reward = models.FloatField(null=True, blank=True, help_text="Its reward under `reward_version`")
    reward_terms = models.JSONField(default=dict, blank=True)
    reward_version = models.ForeignKey(
        "rewards.RewardConfigVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-last_turn_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["serve_run", "client_session_id"], name="uniq_session_per_serve_run")
        ]
        indexes = [
            models.Index(fields=["-last_turn_at", "-id"], name="session_recent_idx"),
            models.Index(fields=["serve_run", "-last_turn_at"], name="session_run_recent_idx"),
            models.Index(fields=["client_session_id"], name="session_client_id_idx"),
            models.Index(fields=["serve_run", "cycle", "last_turn_at"], name="session_uncollected_idx"),
            models.Index(fields=["deployment", "-last_turn_at"], name="session_deployment_idx"),
        ]

    def __str__(self) -> str:
        return f"session {self.client_session_id} of run {self.serve_run_id}"

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def has_feedback(self) -> bool:
        return bool(self.feedback_counts)


class SessionTurn(models.Model):
    """One completion (workers.session_records.TurnRecord), stored once per (serve run, request id)."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="turns")
    serve_run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="+")
    turn_index = models.PositiveIntegerField()
    request_id = models.CharField(max_length=100, help_text="The completion's id (chatcmpl-...)")
    messages = models.JSONField(default=list, help_text="The request's messages, as the client sent them")
    tools = models.JSONField(default=list, blank=True)
    response = models.JSONField(default=dict, help_text="The assistant message returned: role, content, tool_calls")
    prompt_token_ids = models.JSONField(default=list)
    completion_token_ids = models.JSONField(default=list)
    logprobs = models.JSONField(default=list, help_text="Log-probability of each completion token when sampled")
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    policy_version = models.PositiveIntegerField(help_text="Checkpoint id of the weights that sampled it; 0: base")
    deployment = models.ForeignKey(
        "gates.Deployment", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    arm = models.CharField(max_length=16, blank=True)
    latency_ms = models.FloatField()
    finish_reason = models.CharField(max_length=16)
    created_at = models.DateTimeField(help_text="When the completion finished")

    class Meta:
        ordering = ["session", "turn_index", "created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["serve_run", "request_id"], name="uniq_turn_request_per_serve_run")
        ]
        indexes = [
            models.Index(fields=["session", "turn_index"], name="turn_session_idx"),
            models.Index(fields=["serve_run", "arm"], include=["latency_ms"], name="turn_run_arm_idx"),
        ]

    def __str__(self) -> str:
        return f"turn {self.turn_index} of {self.session}"


class Feedback(models.Model):
    """One typed signal about a session (workers.session_records.FeedbackIn), once per (session, event id)."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="feedback")
    event_id = models.CharField(max_length=EVENT_ID_MAX, help_text="The client's id for this event")
    signal = models.CharField(max_length=32, choices=SIGNAL_CHOICES)
    value = models.FloatField(null=True, blank=True)
    turn_index = models.PositiveIntegerField(null=True, blank=True, help_text="The turn it is about; empty: all")
    text = models.TextField(blank=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    run = models.ForeignKey(
        "runs.Run",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The simulate run that posted it (with its own run token)",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["session", "created_at", "id"]
        constraints = [models.UniqueConstraint(fields=["session", "event_id"], name="uniq_feedback_event_per_session")]

    def __str__(self) -> str:
        return f"{self.signal} on {self.session}"
