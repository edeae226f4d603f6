"""Template tags for training runs: `{% load training %}`.

`recipe_defaults run` gives what a training run took from its environment's recipe because the launch named none
(algorithm, substeps, reward) and the warnings about its reward's schedule (an anneal horizon longer than the run).

`effective_algorithm_settings run` gives a training run's effective algorithm settings (the algorithm's defaults from
docs/methods.md merged with the run's overrides, workers.rl.algorithms) for the run page, resolved from the run's stored
config so runs launched before a default changed show what they ran with: values they stored are overrides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django import template
from pydantic import ValidationError

from apps.runs.models import Run, RunKind
from workers.rewards.schema import RewardSpecError, validate_reward_spec
from workers.rewards.term_base import Anneal
from workers.rl.algorithms import SettingsError
from workers.rl.config import TrainConfig, settings_for
from workers.rl.effective import EffectiveSettings

register = template.Library()


def run_effective_settings(run: Run) -> EffectiveSettings | None:
    """The effective settings of a training run, or None for another kind or a config that no longer parses (the
    full spec below it on the page still shows what was stored)."""
    config: Any = (run.spec or {}).get("config")
    if run.kind != RunKind.TRAIN or not isinstance(config, dict):
        return None
    try:
        return settings_for(TrainConfig.model_validate(config))
    except (ValidationError, SettingsError):
        return None


@register.simple_tag
def effective_algorithm_settings(run: Run) -> EffectiveSettings | None:
    return run_effective_settings(run)


@dataclass
class RecipeDefaults:
    """What a training run took from its environment's recipe (each as (setting, value, environment)) and what
    the run page warns about."""

    taken: list[tuple[str, str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def run_recipe_defaults(run: Run) -> RecipeDefaults | None:
    """A training run's recipe defaults and warnings, read from its stored config and reward; None for another kind."""
    config: Any = (run.spec or {}).get("config")
    if run.kind != RunKind.TRAIN or not isinstance(config, dict):
        return None
    out = RecipeDefaults()
    for name in ("algorithm", "substeps", "group_size"):
        environment = config.get(f"{name}_default_of")
        if environment:
            out.taken.append((name, str(config.get(name)), str(environment)))
    cap_of = config.get("max_new_tokens_default_of")
    if cap_of:
        out.taken.append(
            ("sampling.max_new_tokens", str((config.get("sampling") or {}).get("max_new_tokens")), str(cap_of))
        )
    reward_of = (run.spec or {}).get("reward_default_of")
    if reward_of and run.reward_version is not None:
        out.taken.append(("reward", str(run.reward_version), str(reward_of)))
    steps = config.get("steps")
    if run.reward_version is not None and isinstance(steps, int) and steps >= 1:
        try:
            spec = validate_reward_spec(run.reward_version.spec)
        except RewardSpecError:
            return out
        for term in spec.terms:
            anneal = getattr(term, "anneal", None)
            if not isinstance(anneal, Anneal) or anneal.steps is None or anneal.steps <= steps - 1:
                continue
            left = anneal.factor(steps - 1)  # the run's last step is 0-based step steps - 1
            out.warnings.append(
                f"reward term {term.name} anneals its weight to 0 over {anneal.steps} steps, longer than the run's "
                f"{steps}: it never reaches 0 ({left:.0%} of it is left at the last step). Leave anneal.steps empty "
                f"to anneal over the run's own steps, or set it to at most {max(1, steps - 1)}"
            )
    return out


@register.simple_tag
def recipe_defaults(run: Run) -> RecipeDefaults | None:
    return run_recipe_defaults(run)
