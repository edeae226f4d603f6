"""Each algorithm means what its paper means (workers.rl.algorithms): the method's defaults, a run's overrides
merged over them, and a clear error naming the field for a combination that cannot work."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from workers.models.registry import BUILTIN_SHAPES
from workers.rl.algorithms import ALGORITHMS, DEFAULT_DYNAMIC_SAMPLING_MAX_ROUNDS, METHOD_DEFAULTS, SettingsError
from workers.rl.config import TrainConfig, estimate_memory_gb, loss_config_for, settings_for
from workers.rl.effective import effective_settings, episode_token_limit


def _config(**values: Any) -> TrainConfig:
    return TrainConfig(**values)


def _rows(config: TrainConfig) -> dict[str, tuple[str, bool]]:
    return {row.name: (row.value, row.overridden) for row in settings_for(config).rows}


# --- the method's defaults --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("algorithm", "scale"),
    [
        ("grpo", "group"),
        ("dr_grpo", "none"),
        ("composer", "none"),
        ("dapo", "group"),
        ("cispo", "group"),
        ("gspo", "group"),
    ],
)
def test_the_advantage_scale_is_the_methods_own(algorithm: str, scale: str) -> None:
    """P2 and C1 do not divide by the group std; P1 (and DAPO, CISPO, GSPO after it) do."""
    settings = settings_for(_config(algorithm=algorithm))
    assert settings.scale_rewards == scale
    assert _rows(_config(algorithm=algorithm))["scale_rewards"] == (scale, False)
    assert settings.notes == ()


def test_dr_grpo_can_still_be_told_to_divide_by_the_std_and_the_run_page_says_it_departs() -> None:
    settings = settings_for(_config(algorithm="dr_grpo", scale_rewards="group"))
    assert settings.scale_rewards == "group"
    assert _rows(_config(algorithm="dr_grpo", scale_rewards="group"))["scale_rewards"] == ("group", True)
    assert any("does not divide" in note for note in settings.notes)


def test_only_dapo_samples_dynamically_and_penalises_overlong_answers_by_default() -> None:
    for algorithm in ALGORITHMS:
        settings = settings_for(_config(algorithm=algorithm))
        assert settings.dynamic_sampling is (algorithm == "dapo")
        assert settings.overlong_penalty is (algorithm == "dapo")
    dapo = settings_for(_config(algorithm="dapo", sampling={"max_new_tokens": 100}))
    assert dapo.dynamic_sampling_max_rounds == DEFAULT_DYNAMIC_SAMPLING_MAX_ROUNDS
    assert (dapo.overlong_max_tokens, dapo.overlong_cache_tokens) == (100, 20)  # exact_answer: one turn; L_max / 5


def test_grpo_keeps_equal_groups_because_its_kl_covers_them_and_the_others_skip_them() -> None:
    assert settings_for(_config(algorithm="grpo")).drop_equal_groups is False  # β = 0.04, k3 in the loss
    assert settings_for(_config(algorithm="grpo", loss={"kl_coef": 0.0})).drop_equal_groups is True
    for algorithm in ("dr_grpo", "composer", "dapo", "cispo", "gspo"):
        assert settings_for(_config(algorithm=algorithm)).drop_equal_groups is True
    forced = settings_for(_config(algorithm="grpo", drop_equal_groups=True))
    assert forced.drop_equal_groups is True and any("lose their KL term" in note for note in forced.notes)


def test_composer_is_dr_grpo_without_std_with_a_k1_kl_as_a_reward_penalty() -> None:
    loss = loss_config_for(_config(algorithm="composer"))
    assert (loss.kl_estimator, loss.kl_placement) == ("k1", "reward")
    assert loss.kl_coef > 0 and loss.kl_in_reward and not loss.kl_in_loss
    assert "Composer 2" in loss.source and "our choice" in loss.source


def test_choosing_k1_alone_moves_the_kl_to_the_reward_where_k1_regularises() -> None:
    loss = loss_config_for(_config(algorithm="grpo", loss={"kl_estimator": "k1"}))
    assert (loss.kl_estimator, loss.kl_placement, loss.kl_coef) == ("k1", "reward", 0.04)
    assert loss_config_for(_config(algorithm="composer", loss={"kl_estimator": "k3"})).kl_placement == "loss"


def test_k2_or_k3_as_a_reward_penalty_is_allowed_but_noted_as_biased() -> None:
    settings = settings_for(_config(algorithm="grpo", loss={"kl_placement": "reward"}))
    assert settings.loss.kl_in_reward and any("biased" in note for note in settings.notes)


def test_a_reference_copy_is_counted_in_memory_whichever_the_kl_placement() -> None:
    shape = BUILTIN_SHAPES["smollm2-135m-instruct"]
    with_kl = estimate_memory_gb(_config(algorithm="composer"), shape)
    without = estimate_memory_gb(_config(algorithm="dr_grpo"), shape)
    assert with_kl["reference"] > 0 and without["reference"] == 0


# --- Dr. GRPO's constant: the environment's real limits ----------------------------------------------------------


def test_dr_grpos_constant_is_max_new_tokens_times_the_environments_max_turns() -> None:
    search = _config(
        algorithm="dr_grpo",
        environment="search",
        env_params={"index_uri": "file:///nowhere", "max_turns": 12},
        sampling={"max_new_tokens": 256},
    )
    assert loss_config_for(search).max_completion_length == 256 * 12
    assert episode_token_limit(search) == 256 * 12
    calculator = _config(algorithm="dr_grpo", environment="calculator", sampling={"max_new_tokens": 50})
    assert loss_config_for(calculator).max_completion_length == 50 * 6  # the calculator's default max_turns
    single = _config(algorithm="dr_grpo", sampling={"max_new_tokens": 50})
    assert loss_config_for(single).max_completion_length == 50


# --- validation: the field named, with the fix -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "field", "words"),
    [
        ({"loss": {"kl_estimator": "k1", "kl_placement": "loss"}}, "loss", "kl_placement='reward'"),
        ({"loss": {"kl_placement": "prior"}}, "loss", "kl_placement must be one of loss, reward"),
        ({"loss": {"max_completion_length": 10}}, "loss", "unknown setting(s) max_completion_length"),
        ({"algorithm": "dapo", "drop_equal_groups": False}, "dynamic_sampling", "unset drop_equal_groups"),
        ({"dynamic_sampling": True, "drop_equal_groups": False}, "dynamic_sampling", "dynamic_sampling to false"),
        ({"overlong_cache_tokens": 65}, "overlong_cache_tokens", "at most 64"),
        ({"dynamic_sampling_max_rounds": 0}, "dynamic_sampling_max_rounds", "greater than or equal to 1"),
    ],
)
def test_a_combination_that_cannot_work_is_refused_naming_the_field(values: dict[str, Any], field: str, words: str):
    with pytest.raises(ValidationError) as caught:
        _config(**values)
    [error] = caught.value.errors()
    assert error["loc"] == (field,) and words in error["msg"], error


def test_the_dapo_refill_needs_no_drop_setting_and_an_explicit_off_switch_works() -> None:
    assert settings_for(_config(algorithm="dapo", dynamic_sampling=False, drop_equal_groups=False)).notes
    assert settings_for(_config(algorithm="dapo", drop_equal_groups=True)).dynamic_sampling


def test_effective_settings_also_refuse_what_the_schema_could_not_see() -> None:
    """A config changed without validation (model_copy) still cannot slip past the resolution."""
    config = TrainConfig().model_copy(update={"algorithm": "dapo", "drop_equal_groups": False})
    with pytest.raises(SettingsError) as caught:
        effective_settings(config)
    assert caught.value.field == "drop_equal_groups"
    cached = TrainConfig().model_copy(update={"overlong_penalty": True, "overlong_cache_tokens": 1000})
    with pytest.raises(SettingsError) as caught:
        effective_settings(cached)
    assert caught.value.field == "overlong_cache_tokens" and "at most 64" in str(caught.value)


def test_old_runs_with_explicit_values_keep_them() -> None:
    """Runs launched before the defaults moved stored scale_rewards="group", drop_equal_groups=true: they are
    overrides now, so a resumed dr_grpo run trains as it did and its page says it departs from P2."""
    settings = settings_for(_config(algorithm="dr_grpo", scale_rewards="group", drop_equal_groups=True))
    assert settings.scale_rewards == "group" and settings.drop_equal_groups is True
    assert METHOD_DEFAULTS["dr_grpo"].scale_rewards == "none"
