"""The learner trains each algorithm as its paper normalises it (docs/methods.md P1-P5), against values worked out by
hand from the ratios the test sets: dropped groups and empty completions still count in GRPO's and Dr. GRPO's
normalisers, DAPO averages over the tokens it trains on and adds its overlong penalty, Composer's k1 KL is a reward
penalty, and GSPO's clip fraction is per sequence however the batch is cut into micro-batches."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch

from workers.models.registry import TINY_LLAMA, resolve_base_model
from workers.rl.config import TrainConfig
from workers.rl.learner import Learner
from workers.rl.packing import completion_logprobs
from workers.rl.rollout import Sample

EPS_STD = 1e-4  # added to the group std (TRL's convention, workers.rl.advantages)


@pytest.fixture(scope="module")
def model_path():  # type: ignore[no-untyped-def]
    return resolve_base_model(TINY_LLAMA)


def _config(**overrides: Any) -> TrainConfig:
    base: dict[str, Any] = {
        "base_model": TINY_LLAMA,
        "prompts_per_step": 2,
        "group_size": 2,
        "learning_rate": 1e-3,
        "sampling": {"max_new_tokens": 8},
    }
    return TrainConfig(**{**base, **overrides})


def _sample(learner: Learner, index: int, reward: float, length: int, deltas: list[float]) -> Sample:
    """An episode of `length` completion tokens whose ratio ρ_t = π_θ / π_old is exactly exp(deltas[t]): its
    old log-probs are the model's minus the delta. Sample `index` belongs to group index // 2."""
    prompt = [100 + 37 * index + k for k in range(5)]
    completion = [900 + 53 * index + 11 * t for t in range(length)]
    tokens = prompt + completion
    if length:
        with torch.no_grad():
            (logp,) = completion_logprobs(learner.model, [tokens], [len(prompt)])
        old = [float(v) - d for v, d in zip(logp.tolist(), deltas, strict=True)]
    else:
        old = []
    return Sample(
        task_id=f"t{index // 2}",
        group=index // 2,
        token_ids=tokens,
        completion_start=len(prompt),
        loss_mask=[1] * length,
        old_logprobs=old,
        reward=reward,
        terms={},
        policy_version=0,
        num_turns=1,
        malformed_tool_calls=0,
        finish_reason="stop",
        error=None,
        trajectory={"id": f"x{index}"},
    )


def _ppo(delta: float, adv: float, low: float, high: float) -> float:
    """min(ρA, clip(ρ, 1 − ε_low, 1 + ε_high)A) for ρ = e^δ."""
    ratio = math.exp(delta)
    return min(ratio * adv, min(max(ratio, 1 - low), 1 + high) * adv)


DELTAS = {
    2: [0.25, -0.1, 0.05, 0.0, 0.3, -0.25, 0.1, 0.02],  # through and beyond the 0.2 clip range
    3: [-0.3, 0.15, 0.0, 0.21, -0.05, 0.1, 0.2, -0.15],
}


def _batch(learner: Learner, lengths: dict[int, int], rewards: list[float]) -> list[Sample]:
    return [_sample(learner, i, rewards[i], lengths[i], DELTAS.get(i, [0.0] * 8)[: lengths[i]]) for i in range(4)]


def test_grpo_with_a_dropped_equal_group_still_divides_by_every_sequence_of_the_batch(model_path):
    """P1: J = mean over groups of (1/G) Σ_i (1/|o_i|) Σ_t ...: the all-equal group contributes 0 and counts in
    the mean. Dividing by the kept sequences only would double this loss."""
    config = _config(algorithm="grpo", loss={"kl_coef": 0.0})  # no KL: skipping the equal group is exact
    learner = Learner(model_path, config)
    assert learner.settings.drop_equal_groups
    lengths = {0: 3, 1: 4, 2: 5, 3: 8}
    samples = _batch(learner, lengths, [1.0, 1.0, 0.0, 1.0])  # group 0 all equal, group 1 has signal

    metrics = learner.train_step(samples)

    adv = 0.5 / (math.sqrt(0.5) + EPS_STD)  # (r − mean) / (std + eps), n−1 std of {0, 1}
    per_sequence = [
        sum(_ppo(d, sign * adv, 0.2, 0.2) for d in DELTAS[i][: lengths[i]]) / lengths[i]
        for i, sign in ((2, -1.0), (3, 1.0))
    ]
    assert metrics["dropped_groups"] == 1 and metrics["trained_samples"] == 2
    assert (metrics["groups"], metrics["signal_groups"]) == (2, 1)
    assert metrics["loss"] == pytest.approx(-sum(per_sequence) / 4, abs=2e-6)


def test_keeping_or_skipping_an_equal_group_gives_the_same_gradient_when_the_kl_is_off(model_path):
    norms = []
    for drop in (True, False):
        learner = Learner(model_path, _config(algorithm="grpo", loss={"kl_coef": 0.0}, drop_equal_groups=drop))
        samples = _batch(learner, {0: 3, 1: 4, 2: 5, 3: 8}, [1.0, 1.0, 0.0, 1.0])
        metrics = learner.train_step(samples)
        norms.append((metrics["loss"], metrics["grad_norm"]))
    assert norms[0] == pytest.approx(norms[1], rel=1e-5)


def test_dr_grpo_has_no_std_division_and_divides_by_every_sequence_times_the_episode_limit(model_path):
    learner = Learner(model_path, _config(algorithm="dr_grpo"))
    assert learner.settings.scale_rewards == "none" and learner.loss_config.max_completion_length == 8
    lengths = {0: 3, 1: 4, 2: 5, 3: 8}
    samples = _batch(learner, lengths, [1.0, 1.0, 0.0, 1.0])

    metrics = learner.train_step(samples)

    # P2: Â = r − mean = ∓0.5 (no std); token sum / (B · L) with B = 4 sampled sequences and L = 8 × 1 turn
    token_sum = sum(_ppo(d, -0.5, 0.2, 0.2) for d in DELTAS[2][:5]) + sum(_ppo(d, 0.5, 0.2, 0.2) for d in DELTAS[3])
    assert metrics["advantage_abs_mean"] == pytest.approx(0.5)
    assert metrics["loss"] == pytest.approx(-token_sum / (4 * 8), abs=2e-6)


def test_an_empty_completion_keeps_its_reward_in_its_group_and_is_counted(model_path):
    learner = Learner(model_path, _config(algorithm="dr_grpo"))
    lengths = {0: 0, 1: 4, 2: 5, 3: 8}
    samples = _batch(learner, lengths, [0.0, 1.0, 0.0, 1.0])  # sample 0 produced no token

    metrics = learner.train_step(samples)

    # Group 0's mean includes the empty completion's reward: sample 1's advantage is 1 − 0.5, not 0.
    token_sum = (
        sum(_ppo(0.0, 0.5, 0.2, 0.2) for _ in range(4))
        + sum(_ppo(d, -0.5, 0.2, 0.2) for d in DELTAS[2][:5])
        + sum(_ppo(d, 0.5, 0.2, 0.2) for d in DELTAS[3])
    )
    assert metrics["empty_completions"] == 1 and metrics["trained_samples"] == 3
    assert metrics["loss"] == pytest.approx(-token_sum / (4 * 8), abs=2e-6)


def test_dapo_adds_the_overlong_penalty_and_averages_over_the_tokens_it_trains_on(model_path):
    learner = Learner(model_path, _config(algorithm="dapo"))
    settings = learner.settings
    assert settings.overlong_penalty and (settings.overlong_max_tokens, settings.overlong_cache_tokens) == (8, 2)
    lengths = {0: 3, 1: 3, 2: 4, 3: 7}
    samples = _batch(learner, lengths, [1.0, 1.0, 0.0, 1.0])

    metrics = learner.train_step(samples)

    # eq. 13 with L_max = 8, L_cache = 2: 0 up to 6 tokens, (6 − 7) / 2 = −0.5 at 7
    assert metrics["overlong_penalty_mean"] == pytest.approx(-0.5 / 4)
    assert metrics["shaped_reward_mean"] == pytest.approx((1 + 1 + 0 + 0.5) / 4)
    adv = 0.25 / (math.sqrt(0.125) + EPS_STD)  # shaped group 1: {0, 0.5}
    token_sum = sum(_ppo(d, -adv, 0.2, 0.28) for d in DELTAS[2][:4]) + sum(
        _ppo(d, adv, 0.2, 0.28) for d in DELTAS[3][:7]
    )
    assert metrics["dropped_groups"] == 1
    assert metrics["loss"] == pytest.approx(-token_sum / (4 + 7), abs=2e-6)  # P3: 1 / Σ|o_i| of the trained batch


def test_composers_k1_kl_is_a_reward_penalty_on_the_sampled_sequence(model_path):
    """With the reference equal to the initial policy, k1 of a token is log π_old − log π_ref = −δ: the sequence
    penalty is β Σ_t (−δ_t), and it gives the equal-reward group its own advantages (it is not dropped)."""
    learner = Learner(model_path, _config(algorithm="composer", loss={"kl_coef": 0.5}))
    assert learner.loss_config.kl_in_reward and learner.reference is not None
    deltas = {0: [0.1, 0.2, 0.0], 1: [-0.1, 0.0, 0.05, 0.05], 2: DELTAS[2][:5], 3: DELTAS[3]}
    lengths = {i: len(d) for i, d in deltas.items()}
    samples = [_sample(learner, i, [1.0, 1.0, 0.0, 1.0][i], lengths[i], deltas[i]) for i in range(4)]

    metrics = learner.train_step(samples)

    kl = [-sum(deltas[i]) for i in range(4)]
    assert metrics["kl_penalty_mean"] == pytest.approx(0.5 * sum(kl) / 4, abs=1e-5)
    assert metrics["kl"] == pytest.approx(sum(kl) / sum(lengths.values()), abs=1e-5)
    assert metrics["dropped_groups"] == 0  # rewards 1 − 0.5·(−0.3) and 1 − 0.5·(0) differ
    shaped = [[1.0, 1.0, 0.0, 1.0][i] - 0.5 * kl[i] for i in range(4)]
    adv = [shaped[0] - (shaped[0] + shaped[1]) / 2, shaped[1] - (shaped[0] + shaped[1]) / 2]
    adv += [shaped[2] - (shaped[2] + shaped[3]) / 2, shaped[3] - (shaped[2] + shaped[3]) / 2]
    token_sum = sum(_ppo(d, adv[i], 0.2, 0.2) for i in range(4) for d in deltas[i])
    assert metrics["loss"] == pytest.approx(-token_sum / (4 * 8), abs=2e-6)  # no KL term inside the loss


def test_gspos_clip_fraction_is_per_sequence_across_micro_batches(model_path):
    """One sequence in four leaves GSPO's range: the clip fraction is 1/4 whatever its length (weighting the
    micro-batches by their tokens would give 30/39)."""
    learner = Learner(model_path, _config(algorithm="gspo", max_tokens_per_pack=64, sampling={"max_new_tokens": 32}))
    lengths = {0: 3, 1: 3, 2: 3, 3: 30}
    samples = [
        _sample(learner, i, [0.0, 1.0, 0.0, 1.0][i], lengths[i], [0.01 if i == 3 else 0.0] * lengths[i])
        for i in range(4)
    ]

    metrics = learner.train_step(samples)

    assert metrics["clip_fraction"] == pytest.approx(0.25)
    assert metrics["ratio_mean"] == pytest.approx((3 + math.exp(0.01)) / 4, abs=1e-5)
    assert metrics["ratio_max"] == pytest.approx(math.exp(0.01), abs=1e-5)


def test_kimi_keeps_equal_groups_subtracts_the_group_mean_and_divides_by_the_batch_tokens(model_path):
    """K3: advantage r − mean(r) (no std), every group trained (its τ term counts even when A = 0), the token sum
    (policy term masked outside the log-ratio band, plus τ·(log ρ)² everywhere) divided by the batch's N tokens."""
    learner = Learner(model_path, _config(algorithm="kimi", loss={"epsilon_low": 0.2, "epsilon_high": 0.2, "tau": 0.1}))
    assert learner.settings.scale_rewards == "none" and not learner.settings.drop_equal_groups
    lengths = {0: 3, 1: 3, 2: 8, 3: 8}
    samples = _batch(learner, lengths, [1.0, 1.0, 0.0, 1.0])

    metrics = learner.train_step(samples)

    assert metrics["dropped_groups"] == 0
    # Nothing is dropped, yet the all-equal group is still counted as one without signal (the run's signal share).
    assert (metrics["groups"], metrics["signal_groups"]) == (2, 1)
    adv = {0: 0.0, 1: 0.0, 2: -0.5, 3: 0.5}
    token_sum = sum(
        math.exp(d) * adv[i] - 0.1 * d * d for i in range(4) for d in DELTAS.get(i, [0.0] * 8)[: lengths[i]]
    )
    assert metrics["loss"] == pytest.approx(-token_sum / sum(lengths.values()), abs=2e-6)
    outside = sum(1 for i in (2, 3) for d in DELTAS[i] if abs(d) > 0.2)
    assert metrics["clip_fraction"] == pytest.approx(outside / sum(lengths.values()), abs=1e-6)


def test_substeps_take_one_optimizer_step_per_minibatch_of_whole_groups(model_path) -> None:  # type: ignore[no-untyped-def]
    """substeps=2 on two groups is two optimizer steps, each on one group normalised as a batch of its own:
    the same weights as two one-group steps, and not the weights of one step on both."""
    from workers.rl.batching import minibatches as _minibatches

    assert _minibatches(8, 2, 4) == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    assert _minibatches(6, 2, 4) == [range(0, 2), range(2, 4), range(4, 6)]  # three groups: three minibatches
    assert _minibatches(8, 2, 1) == [range(0, 8)]

    def batch(learner: Learner) -> list[Sample]:
        # Old log-probs set against the initial weights for both groups, as the rollout recorded them.
        return [_sample(learner, i, r, 8, DELTAS[2 if i % 2 else 3]) for i, r in enumerate([1.0, 0.0, 0.0, 1.0])]

    split = Learner(model_path, _config(algorithm="cispo", substeps=2))
    metrics = split.train_step(batch(split))
    assert metrics["substeps"] == 2 and split.version == 1

    stepwise = Learner(model_path, _config(algorithm="cispo", prompts_per_step=1))
    samples = batch(stepwise)
    for group in (samples[:2], samples[2:]):
        stepwise.train_step([dataclasses.replace(s, group=0) for s in group])
    whole = Learner(model_path, _config(algorithm="cispo"))
    whole.train_step(batch(whole))
    pairs = list(zip(split.model.named_parameters(), stepwise.model.parameters(), strict=True))
    for (name, a), b in pairs:
        assert torch.allclose(a, b, atol=1e-6), name
    others = zip(split.model.parameters(), whole.model.parameters(), strict=True)
    assert any(not torch.allclose(a, c, atol=1e-6) for a, c in others)
