"""A recipe's environment brings the recipe's defaults (issue 36, section 2): a run on `swarm` that names nothing
trains with Kimi K2.5's loss (K3) and the PARL reward (K1), one on `search` with CISPO, Context-1's reward (X2-X5)
and 4 gradient substeps per step; PARL's λ1, λ2 anneal over the run's own steps unless a horizon is given. A named
value always wins."""

from __future__ import annotations

from typing import ClassVar

import pytest
from pydantic import ValidationError

from workers.envs import registry
from workers.envs.exact_answer import ExactAnswerEnv
from workers.rewards.schema import anneal_horizons, context1_spec, parl_spec, validate_reward_spec, with_anneal_horizon
from workers.rewards.score import annealed_weights
from workers.rewards.term_base import Anneal
from workers.rl.config import TrainConfig, loss_config_for, settings_for
from workers.rl.config_sections import (
    SFTConfig,
    environment_default_group_size,
    environment_default_max_new_tokens,
    environment_default_substeps,
)
from workers.search.environment import SearchEnv
from workers.specs import TrainSpec
from workers.swarm.environment import SwarmEnv


def test_a_swarm_run_that_names_nothing_trains_with_kimis_loss() -> None:
    config = TrainConfig(environment="swarm")
    assert config.algorithm == "kimi" and config.algorithm_default_of == "swarm"
    loss = loss_config_for(config)
    assert loss.algorithm == "kimi" and loss.tau > 0  # K3: the squared log-ratio term
    assert settings_for(config).scale_rewards == "none"  # K3: r − r̄, no division by the std
    assert config.substeps == 1 and config.substeps_default_of is None  # Kimi K2.5 gives no substep count


def test_a_search_run_that_names_nothing_trains_with_cispo_and_4_substeps() -> None:
    config = TrainConfig(environment="search")
    assert (config.algorithm, config.algorithm_default_of) == ("cispo", "search")
    assert (config.substeps, config.substeps_default_of) == (4, "search")
    assert loss_config_for(config).algorithm == "cispo"
    assert TrainConfig(environment="search", substeps=None).substeps == 4
    assert environment_default_substeps("search") == 4 and environment_default_substeps("exact_answer") is None


def test_a_search_run_that_names_no_group_size_samples_contexts_1s_8_per_query() -> None:
    config = TrainConfig(environment="search")
    assert (config.group_size, config.group_size_default_of) == (8, "search")  # Context-1: 128 queries x 8 envs
    assert TrainConfig(environment="search", group_size=None).group_size == 8
    assert TrainConfig(environment="search", group_size=4).group_size_default_of is None
    assert (TrainConfig().group_size, TrainConfig().group_size_default_of) == (4, None)
    assert TrainConfig(environment="swarm").group_size == 4 and environment_default_group_size("swarm") is None
    stored = TrainConfig(environment="search").model_dump(mode="json")
    assert TrainConfig.model_validate(stored) == TrainConfig(environment="search")
    with pytest.raises(ValidationError, match="group_size_default_of='search' names another environment"):
        TrainConfig.model_validate(
            {**stored, "environment": "exact_answer", "algorithm_default_of": None, "substeps_default_of": None}
        )


def test_a_search_or_swarm_run_that_names_no_cap_samples_room_for_its_reply_format() -> None:
    config = TrainConfig(environment="search")
    assert (config.sampling.max_new_tokens, config.max_new_tokens_default_of) == (256, "search")
    assert TrainConfig(environment="swarm").sampling.max_new_tokens == 512
    assert (TrainConfig().sampling.max_new_tokens, TrainConfig().max_new_tokens_default_of) == (64, None)
    kept = TrainConfig(environment="search", sampling={"max_new_tokens": 8, "temperature": 0.7})
    assert (kept.sampling.max_new_tokens, kept.sampling.temperature, kept.max_new_tokens_default_of) == (8, 0.7, None)
    other = TrainConfig(environment="search", sampling={"temperature": 0.7})  # the cap alone comes from the recipe
    assert (other.sampling.max_new_tokens, other.sampling.temperature) == (256, 0.7)
    assert environment_default_max_new_tokens("search") == 256 and environment_default_max_new_tokens("x") is None
    stored = config.model_dump(mode="json")
    assert TrainConfig.model_validate(stored) == config
    with pytest.raises(ValidationError, match="max_new_tokens_default_of='search' names another environment"):
        TrainConfig.model_validate(
            {
                **stored,
                "environment": "exact_answer",
                **{f"{k}_default_of": None for k in ("algorithm", "substeps", "group_size")},
            }
        )


def test_a_model_teacher_samples_with_the_same_cap_as_a_training_run_on_its_environment() -> None:
    assert (SFTConfig().sampling.max_new_tokens, SFTConfig().max_new_tokens_default_of) == (256, "search")
    assert SFTConfig(environment="exact_answer").sampling.max_new_tokens == 64
    assert SFTConfig(sampling={"max_new_tokens": 16}).sampling.max_new_tokens == 16
    assert SFTConfig.model_validate(SFTConfig().model_dump(mode="json")) == SFTConfig()
    with pytest.raises(ValidationError, match="max_new_tokens_default_of='search' names another environment"):
        SFTConfig.model_validate({**SFTConfig().model_dump(mode="json"), "environment": "exact_answer"})


def test_explicit_choices_win_over_the_recipe() -> None:
    config = TrainConfig(environment="search", algorithm="grpo", substeps=1)
    assert (config.algorithm, config.algorithm_default_of, config.substeps, config.substeps_default_of) == (
        "grpo",
        None,
        1,
        None,
    )
    assert TrainConfig(environment="swarm", algorithm="cispo", substeps=2).substeps == 2
    assert TrainConfig().substeps == 1 and TrainConfig().substeps_default_of is None


def test_the_resolved_substeps_survive_the_stored_config_and_name_their_environment() -> None:
    stored = TrainConfig(environment="search").model_dump(mode="json")
    assert stored["substeps"] == 4 and stored["substeps_default_of"] == "search"
    assert TrainConfig.model_validate(stored) == TrainConfig(environment="search")
    with pytest.raises(ValidationError, match="substeps_default_of='search' names another environment"):
        TrainConfig.model_validate({**stored, "environment": "swarm", "algorithm_default_of": None})


def test_an_environment_declaring_bad_substeps_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    class BadSubsteps(ExactAnswerEnv):
        name: ClassVar[str] = "bad_substeps_test"
        default_substeps: ClassVar[int | None] = 0

    monkeypatch.setitem(registry.ENVIRONMENTS, BadSubsteps.name, BadSubsteps)
    with pytest.raises(ValidationError, match="default_substeps=0"):
        TrainConfig(environment=BadSubsteps.name)


def test_the_recipe_rewards_are_the_recipes() -> None:
    assert SearchEnv.default_reward() == context1_spec().model_dump(mode="json")
    swarm = SwarmEnv.default_reward()
    assert swarm == parl_spec().model_dump(mode="json")
    spec = validate_reward_spec(swarm)
    assert {t.name: t.weight for t in spec.terms} == {
        "item_f1": 1.0,
        "normalized_match": 1.0,
        "parallel_instantiation": 0.1,
        "subagent_finish": 0.1,
    }
    assert anneal_horizons(spec) == {"parallel_instantiation": None, "subagent_finish": None}
    assert ExactAnswerEnv.default_reward() is None


def test_parl_anneals_over_the_runs_steps_unless_a_horizon_is_given() -> None:
    # A 21-step run: steps 0..20, full weight at step 0, zero at its last step.
    resolved = validate_reward_spec(with_anneal_horizon(parl_spec(0.2, 0.1).model_dump(mode="json"), 21))
    assert anneal_horizons(resolved) == {"parallel_instantiation": 20, "subagent_finish": 20}
    assert annealed_weights(resolved, 0) == pytest.approx(
        {"reward/lambda/parallel_instantiation": 0.2, "reward/lambda/subagent_finish": 0.1}
    )
    assert annealed_weights(resolved, 10) == pytest.approx(
        {"reward/lambda/parallel_instantiation": 0.1, "reward/lambda/subagent_finish": 0.05}
    )
    assert annealed_weights(resolved, 20) == {
        "reward/lambda/parallel_instantiation": 0.0,
        "reward/lambda/subagent_finish": 0.0,
    }  # zero at the run's last step
    one_step = with_anneal_horizon(parl_spec().model_dump(mode="json"), 1)
    assert set(anneal_horizons(validate_reward_spec(one_step)).values()) == {1}
    explicit = with_anneal_horizon(parl_spec(anneal_steps=100).model_dump(mode="json"), 20)
    assert anneal_horizons(validate_reward_spec(explicit)) == {"parallel_instantiation": 100, "subagent_finish": 100}
    left_out = with_anneal_horizon({"terms": [{"type": "subagent_finish"}, {"type": "exact_match"}]}, 8)
    assert anneal_horizons(validate_reward_spec(left_out)) == {"subagent_finish": 7}


def test_an_unresolved_horizon_is_refused_when_a_training_step_is_scored() -> None:
    assert Anneal().factor(None) == 1.0  # evaluation and re-scoring: unannealed
    with pytest.raises(ValueError, match="with_anneal_horizon"):
        Anneal().factor(3)


def test_the_training_job_anneals_over_its_own_steps() -> None:
    spec = TrainSpec.model_validate(
        {
            "run_id": 1,
            "kind": "train",
            "ingest_url": "http://x/",
            "input_uri": "file:///tasks.jsonl",
            "output_prefix": "file:///out",
            "reward": parl_spec().model_dump(mode="json"),
            "config": {"environment": "swarm", "steps": 12},
        }
    )
    assert spec.config.algorithm == "kimi"
    assert anneal_horizons(validate_reward_spec(spec.reward)) == {"parallel_instantiation": 11, "subagent_finish": 11}
