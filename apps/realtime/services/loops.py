"""A gate's real-time RL loop: its configuration (what it collects, how it trains, who approves) and pausing.

The cycle itself, collect → train → evaluate and gate → deploy, is `apps.realtime.services.cycles`; what the pages
and the API read about loops and cycles is in `apps.realtime.selectors`.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError as PydanticError
from rest_framework.exceptions import ValidationError

from apps.accounts.models import Capability, User
from apps.accounts.permissions import require_capability
from apps.common.errors import pydantic_problems
from apps.gates.models import Gate
from apps.realtime.models import Loop
from apps.realtime.services.serving import SERVE, has_session_feedback_term
from apps.rewards.models import RewardConfigVersion
from apps.runs.models import Run
from workers.rl.config import TrainConfig

BASELINES = ("batch_mean", "task_type_mean", "none")
DEFAULT_TRAINING: dict[str, Any] = {
    "baseline": "batch_mean",
    "max_samples": 4096,
    # Turns per optimizer step: prompts_per_step x group_size (sessions have no groups; the product is the batch).
    "config": {"algorithm": "composer", "learning_rate": 1e-5, "prompts_per_step": 8, "group_size": 2},
}


# --- configuration ------------------------------------------------------------------------------------------------
def training_settings(raw: object) -> dict[str, Any]:
    """The loop's training settings merged over `DEFAULT_TRAINING`, checked the way the session trainer will
    check them (400 naming `training.<field>`)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ValidationError({"training": ["send an object: {baseline, max_samples, config: {...}}"]})
    unknown = sorted(set(raw) - set(DEFAULT_TRAINING))
    if unknown:
        raise ValidationError({f"training.{unknown[0]}": [f"unknown setting; use {', '.join(DEFAULT_TRAINING)}"]})
    merged = {**DEFAULT_TRAINING, **raw}
    merged["config"] = {**DEFAULT_TRAINING["config"], **(raw.get("config") or {})}
    if merged["baseline"] not in BASELINES:
        raise ValidationError({"training.baseline": [f"use one of {', '.join(BASELINES)}"]})
    max_samples = merged["max_samples"]
    if isinstance(max_samples, bool) or not isinstance(max_samples, int) or not 1 <= max_samples <= 1_000_000:
        raise ValidationError({"training.max_samples": ["an integer from 1 to 1,000,000"]})
    try:
        TrainConfig.model_validate({"base_model": "placeholder", **merged["config"]})
    except PydanticError as exc:
        raise ValidationError(pydantic_problems(exc, "training.config")) from None
    return merged


def loop_create(
    *,
    gate: Gate,
    serve_run: Run,
    reward_version: RewardConfigVersion,
    user: User,
    min_sessions: int = 8,
    target_sessions: int = 64,
    max_wait_seconds: int = 5 * 3600,
    settle_seconds: int = 30,
    training: dict[str, Any] | None = None,
    requires_approval: bool | None = None,
) -> Loop:
    """Configure the real-time loop of `gate`: it deploys, so it needs the admin permission (as gates do)."""
    require_capability(user, Capability.ADMIN, "configuring a real-time loop")
    problems: dict[str, list[str]] = {}
    if Loop.objects.filter(gate=gate).exists():
        problems["gate"] = [f"gate {gate.name!r} already has a loop; change that one (pause, resume) instead"]
    if serve_run.kind != SERVE:
        problems["serve_run"] = [f"run {serve_run.pk} is a {serve_run.kind} run; name a serve run"]
    elif serve_run.spec.get("gate") != gate.pk:
        problems["serve_run"] = [f"serve run {serve_run.pk} serves another gate's deployment, not {gate.name!r}'s"]
    elif serve_run.is_terminal:
        problems["serve_run"] = [f"serve run {serve_run.pk} has ended ({serve_run.status}); launch a new one"]
    if not has_session_feedback_term(reward_version.spec):
        problems["reward_version"] = [
            f"{reward_version} holds no session_feedback term: a loop's reward is distilled from users' feedback"
        ]
    if min_sessions < 1:
        problems["min_sessions"] = ["at least 1: a cycle never trains on nothing"]
    if target_sessions < min_sessions:
        problems["target_sessions"] = [f"at least min_sessions ({min_sessions})"]
    if requires_approval is None:
        requires_approval = gate.requires_approval
    elif not requires_approval and gate.requires_approval:
        problems["requires_approval"] = [
            f"gate {gate.name!r} requires a human's approval of every deployment; change the gate first"
        ]
    settings = training_settings(training)
    if problems:
        raise ValidationError(problems)
    return Loop.objects.create(
        gate=gate,
        serve_run=serve_run,
        reward_version=reward_version,
        min_sessions=min_sessions,
        target_sessions=target_sessions,
        max_wait_seconds=max_wait_seconds,
        settle_seconds=settle_seconds,
        training=settings,
        requires_approval=requires_approval,
        owner=user,
    )


def loop_set_paused(*, loop: Loop, user: User, paused: bool) -> Loop:
    """Pause or resume; a running cycle stays where it is and goes on from there on resume."""
    require_capability(user, Capability.ADMIN, "pausing or resuming a real-time loop")
    Loop.objects.filter(pk=loop.pk).update(paused=paused)
    loop.refresh_from_db()
    return loop
