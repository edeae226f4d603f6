"""What the training launch form offers: rewards that fit each environment, checkpoints to start from, and the
run-time estimate's rates."""

from __future__ import annotations

from typing import Any

from apps.rewards.models import RewardConfigVersion
from apps.runs.models import Checkpoint, Run, RunKind
from workers.envs.checks import check_reward_compatible
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


# The training form's basic view: what a newcomer picks; every other field is under "Advanced".
BASIC_FIELDS = ("base_model", "environment", "steps")

# The settings a recipe preset carries (form field paths); the rest keep their own defaults.
RECIPE_KEYS = (
    "algorithm",
    "learning_rate",
    "steps",
    "prompts_per_step",
    "group_size",
    "lora.rank",
    "checkpoint_every",
    "sampling.max_new_tokens",
)
DEFAULT_RECIPE = "cpu-lora"


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)
    return out


def recipe_presets(field_defaults: dict[str, str]) -> list[dict[str, Any]]:
    """The launch form's recipes, each with the form values it sets (`RECIPE_KEYS`). `field_defaults` are the
    form's own defaults (TrainConfig's fields): the paper recipe is those.

    - `cpu-lora` (the default): the example run's recipe (`workers.rl.example_recipe.EXAMPLE_CONFIG`): GRPO, LoRA
      rank 16 at 1e-3, 12 steps of 8 prompts x 4 samples of up to 24 tokens; minutes on 2 CPU cores.
    - `paper`: the algorithm's reported settings as TrainConfig holds them (full parameters, learning rate 1e-6,
      20 steps): sized for GPUs, hours on a CPU.
    """
    from workers.rl.example_recipe import EXAMPLE_CONFIG

    example = _flat(EXAMPLE_CONFIG)
    return [
        {
            "name": DEFAULT_RECIPE,
            "label": "Example recipe: GRPO, LoRA 16 at 1e-3, 12 short steps (minutes on 2 CPU cores)",
            "settings": {key: example.get(key, field_defaults.get(key, "")) for key in RECIPE_KEYS},
        },
        {
            "name": "paper",
            "label": "Reported settings: the algorithm's own, full parameters at 1e-6 (sized for GPUs)",
            "settings": {key: field_defaults.get(key, "") for key in RECIPE_KEYS},
        },
        {"name": "custom", "label": "Custom: keep what I set under Advanced", "settings": {}},
    ]


def dataset_environments() -> dict[str, list[str]]:
    """For each dataset kind, the environments that train on it (`Environment.dataset_kind`): the form offers only
    the task datasets the chosen environment accepts."""
    out: dict[str, list[str]] = {}
    for name, _ in environment_choices():
        out.setdefault(get_environment(name).dataset_kind, []).append(name)
    return out
