"""`Learner.train_step(samples, advantages)`: caller-given advantages for samples in no groups (real-time RL's
sessions) replace the group advantages, every sample with a token trains, and the per-sequence normaliser counts
the whole batch. Checked against a loss and a first Adam step computed by hand."""

from __future__ import annotations

import random

import pytest
import torch

from workers.models.registry import TINY_LLAMA, resolve_base_model
from workers.rl.advantages import group_advantages
from workers.rl.config import TrainConfig
from workers.rl.learner import Learner
from workers.rl.packing import completion_logprobs
from workers.rl.rollout import Sample

LR = 1e-3


def _config(**overrides):  # type: ignore[no-untyped-def]
    base = {
        "base_model": TINY_LLAMA,
        "algorithm": "grpo",
        "prompts_per_step": 2,
        "group_size": 2,
        "learning_rate": LR,
        "loss": {"kl_coef": 0.0},
        "max_grad_norm": 1e6,
    }
    return TrainConfig(**{**base, **overrides})


def _samples(learner: Learner, lengths: list[int], rewards: list[float]) -> list[Sample]:
    """On-policy samples (old log-probs from the learner itself): ratio 1 at the first step."""
    rng = random.Random(3)
    out = []
    for i, (length, reward) in enumerate(zip(lengths, rewards, strict=True)):
        prompt = [rng.randrange(100, 5000) for _ in range(4)]
        completion = [rng.randrange(100, 5000) for _ in range(length)]
        old: list[float] = []
        if length:
            with torch.no_grad():
                (logp,) = completion_logprobs(learner.model, [prompt + completion], [len(prompt)])
            old = logp.tolist()
        out.append(
            Sample(
                task_id="t",
                group=i,
                token_ids=prompt + completion,
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
                trajectory={"id": f"x{i}"},
            )
        )
    return out


@pytest.fixture(scope="module")
def model_path():  # type: ignore[no-untyped-def]
    return resolve_base_model(TINY_LLAMA)


def test_given_advantages_train_every_sample_with_a_token_normalised_over_the_whole_batch(model_path) -> None:  # type: ignore[no-untyped-def]
    learner = Learner(model_path, _config())
    # Three samples in no groups (an odd count, which group advantages would refuse) and an empty completion.
    samples = _samples(learner, [3, 5, 2, 0], [9.0, 9.0, 9.0, 9.0])
    advantages = [1.5, -0.5, 2.0, 3.0]

    # The hand-computed oracle: at ratio 1 GRPO's loss is −(1/N) Σ_i A_i · mean_t ρ_it with N = 4 (the empty
    # completion counts in the normaliser), so its value is −(1.5 − 0.5 + 2 + 0)/4 and its gradient that of
    # −(1/N) Σ_i A_i · mean_t log π(o_it).
    reference = Learner(model_path, _config())
    loss = torch.zeros(())
    for sample, advantage in zip(samples[:3], advantages[:3], strict=True):
        (logp,) = completion_logprobs(reference.model, [sample.token_ids], [sample.completion_start])
        loss = loss - advantage * logp.mean() / 4
    loss.backward()  # type: ignore[no-untyped-call]
    gradients = {name: p.grad.clone() for name, p in reference.model.named_parameters() if p.grad is not None}
    before = {name: p.detach().clone() for name, p in learner.model.named_parameters()}

    metrics = learner.train_step(samples, advantages)

    assert metrics["loss"] == pytest.approx(-0.75, abs=1e-6)
    assert metrics["trained_samples"] == 3 and metrics["empty_completions"] == 1
    assert metrics["groups"] == 0 and metrics["dropped_groups"] == 0
    assert metrics["advantage_mean"] == pytest.approx(1.5) and metrics["reward_mean"] == 9.0
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    # AdamW's first step moves each weight by lr · g / (|g| + eps): −lr times the gradient's sign where it is clear.
    checked = 0
    for name, param in learner.model.named_parameters():
        grad = gradients.get(name)
        if grad is None:
            continue
        clear = grad.abs() > 1e-5
        step = (param.detach() - before[name])[clear]
        assert torch.allclose(step, -LR * grad[clear].sign(), rtol=1e-2, atol=1e-7), name
        checked += int(clear.sum())
    assert checked > 1000


def test_given_group_advantages_reproduce_the_grouped_step_bit_for_bit(model_path) -> None:  # type: ignore[no-untyped-def]
    grouped, given = Learner(model_path, _config()), Learner(model_path, _config())
    rewards = [1.0, 0.0, 0.25, 1.0]
    samples = _samples(grouped, [3, 4, 2, 5], rewards)
    advantages = group_advantages(torch.tensor(rewards, dtype=torch.float64), 2, scale="group").advantages
    a = grouped.train_step(samples)
    b = given.train_step(samples, advantages)
    assert a["loss"] == b["loss"] and a["advantage_mean"] == b["advantage_mean"]
    for (name, p), (_, q) in zip(grouped.model.named_parameters(), given.model.named_parameters(), strict=True):
        assert torch.equal(p, q), name


def test_given_advantages_are_checked(model_path) -> None:  # type: ignore[no-untyped-def]
    learner = Learner(model_path, _config())
    samples = _samples(learner, [2, 2], [0.0, 1.0])
    with pytest.raises(ValueError, match=r"one number per sample \(\[2\]\)"):
        learner.train_step(samples, [1.0])
    with pytest.raises(ValueError, match="finite"):
        learner.train_step(samples, [1.0, float("nan")])
    assert learner.step == 0
