"""An environment may name the algorithm its runs train with when they name none (`Environment.default_algorithm`;
issue 17: Composer 2's C1/C2 for the coding agent): `TrainConfig` resolves it, records where it came from, and a
run that names an algorithm keeps it."""

from __future__ import annotations

from typing import ClassVar

import pytest
from pydantic import ValidationError

from workers.envs import registry
from workers.envs.exact_answer import ExactAnswerEnv
from workers.rl.algorithms import ALGORITHMS
from workers.rl.config import TrainConfig, settings_for
from workers.rl.config_sections import environment_default_algorithm


class ComposerDefaultEnv(ExactAnswerEnv):
    """A test-only environment whose runs default to Composer 2's algorithm."""

    name: ClassVar[str] = "composer_default_test"
    default_algorithm: ClassVar[str | None] = "composer"


@pytest.fixture
def composer_env(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(registry.ENVIRONMENTS, ComposerDefaultEnv.name, ComposerDefaultEnv)
    return ComposerDefaultEnv.name


def test_a_run_that_names_no_algorithm_gets_its_environments_default(composer_env: str) -> None:
    for config in (TrainConfig(environment=composer_env), TrainConfig(environment=composer_env, algorithm=None)):
        assert config.algorithm == "composer" and config.algorithm_default_of == composer_env
        settings = settings_for(config)
        assert settings.algorithm == "composer" and settings.loss.kl_estimator == "k1"
        assert settings.scale_rewards == "none"  # C1: no division by the group std


def test_a_named_algorithm_is_kept_even_when_the_environment_has_a_default(composer_env: str) -> None:
    config = TrainConfig(environment=composer_env, algorithm="grpo")
    assert config.algorithm == "grpo" and config.algorithm_default_of is None
    named = TrainConfig(environment=composer_env, algorithm="composer")
    assert named.algorithm_default_of is None  # chosen, not defaulted


def test_an_environment_without_a_default_trains_with_grpo_as_before() -> None:
    assert TrainConfig().algorithm == "grpo" and TrainConfig().algorithm_default_of is None
    assert TrainConfig(environment="calculator").algorithm == "grpo"
    assert TrainConfig(environment="no_such_env").algorithm == "grpo"  # the environment check names it later


def test_the_resolved_algorithm_survives_a_round_trip_through_the_stored_config(composer_env: str) -> None:
    stored = TrainConfig(environment=composer_env).model_dump(mode="json")
    assert stored["algorithm"] == "composer" and stored["algorithm_default_of"] == composer_env
    assert TrainConfig.model_validate(stored) == TrainConfig(environment=composer_env)
    with pytest.raises(ValidationError, match="names another environment"):
        TrainConfig.model_validate({**stored, "environment": "exact_answer"})


def test_an_environment_declaring_an_unknown_algorithm_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken(ExactAnswerEnv):
        name: ClassVar[str] = "broken_default_test"
        default_algorithm: ClassVar[str | None] = "ppo"

    monkeypatch.setitem(registry.ENVIRONMENTS, Broken.name, Broken)
    with pytest.raises(ValidationError, match="default_algorithm='ppo'"):
        TrainConfig(environment=Broken.name)


def test_every_registered_environment_declares_a_known_algorithm_or_none() -> None:
    for name, cls in registry.ENVIRONMENTS.items():
        assert cls.default_algorithm is None or cls.default_algorithm in ALGORITHMS, name
        assert environment_default_algorithm(name) == cls.default_algorithm
