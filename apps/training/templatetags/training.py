"""Template tags for training runs: `{% load training %}`.

`effective_algorithm_settings run` gives a training run's effective algorithm settings (the algorithm's defaults from
methods.md merged with the run's overrides, workers.rl.algorithms) for the run page, resolved from the run's stored
config so runs launched before a default changed show what they ran with: values they stored are overrides.
"""

from __future__ import annotations

from typing import Any

from django import template
from pydantic import ValidationError

from apps.runs.models import Run, RunKind
from workers.rl.algorithms import EffectiveSettings, SettingsError
from workers.rl.config import TrainConfig, settings_for

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
