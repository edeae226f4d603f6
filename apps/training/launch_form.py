"""What the training launch form offers: rewards that fit each environment, checkpoints to start from, and the
run-time estimate's rates."""

from __future__ import annotations

from typing import Any

from apps.rewards.models import RewardConfigVersion
from apps.runs.models import Checkpoint, Run, RunKind
from workers.envs.base import check_reward_compatible
from workers.envs.registry import environment_choices, get_environment
from workers.rewards.schema import RewardSpecError


def reward_environments(rewards: Any) -> dict[int, list[str]]:
    """For each reward config version, the environments whose trajectories it can score (their `produces` cover
    every term's inputs): the launch form offers only the rewards that fit the chosen environment."""
    fits: dict[int, list[str]] = {}
    for reward in rewards:
        try:
            fits[reward.pk] = [
                name
                for name, _ in environment_choices()
                if not check_reward_compatible(get_environment(name), reward.spec)
            ]
        except RewardSpecError:
            fits[reward.pk] = []
    return fits


CALIBRATION_SECONDS_PER_SLOT = {"smollm2-135m-instruct": 30 / (8 * 4 * 128), "tiny-llama-smollm2-tokenizer": 0.0005}
"""Seconds per sampled-token slot (prompts x group x max_new_tokens) of a training step on 2 CPU cores, from the
trainer benchmark (docs/benchmarks.md, "Trainer step": 8 prompts x 4 completions of up to 128 tokens in about 30 s)."""


def run_time_rates(limit: int = 50) -> dict[str, dict[str, Any]]:
    """Per base model, the seconds a training step takes per sampled-token slot: the median over this
    installation's finished training runs of that model (their wall time over steps x prompts x group x
    max_new_tokens), else the trainer benchmark's figure. The launch form multiplies it out (launch.js)."""
    samples: dict[str, list[float]] = {}
    finished = Run.objects.filter(kind=RunKind.TRAIN, status="succeeded", started_at__isnull=False)
    for run in finished.exclude(finished_at=None).order_by("-pk")[:limit]:
        config = run.spec.get("config") or {}
        try:
            slots = int(config["steps"]) * int(config["prompts_per_step"]) * int(config["group_size"])
            slots *= int((config.get("sampling") or {}).get("max_new_tokens") or 0)
        except (KeyError, TypeError, ValueError):
            continue
        if run.finished_at is None or run.started_at is None:
            continue
        seconds = (run.finished_at - run.started_at).total_seconds()
        if slots > 0 and seconds > 0:
            samples.setdefault(str(config.get("base_model")), []).append(seconds / slots)
    rates = {
        model: {"seconds_per_slot": rate, "source": "the trainer benchmark on 2 CPU cores"}
        for model, rate in CALIBRATION_SECONDS_PER_SLOT.items()
    }
    for model, values in samples.items():
        values.sort()
        rates[model] = {
            "seconds_per_slot": values[len(values) // 2],
            "source": f"the median of {len(values)} finished run{'s' if len(values) != 1 else ''} of this model here",
        }
    return rates


def with_fits(reward: RewardConfigVersion, fits: dict[int, list[str]]) -> RewardConfigVersion:
    reward.fits = " ".join(fits.get(reward.pk, []))  # type: ignore[attr-defined]  # the option's data-envs
    return reward


def training_checkpoints() -> Any:
    """Training runs' checkpoints, newest first: what a new run may start from."""
    return Checkpoint.objects.filter(run__kind=RunKind.TRAIN).select_related("run").order_by("-pk")
