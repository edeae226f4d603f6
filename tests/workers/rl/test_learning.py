"""Real training of a tiny seeded model on a verifiable toy task: the reward rises for GRPO and CISPO within a
bounded number of steps, and does not with a learning rate of zero.

The toy task is verifiable in token space: a completion earns the fraction of its tokens that are the target
token. A randomly initialised model spreads its mass over 49,152 tokens, so nothing would ever be rewarded; the
test's copy of the tiny model is therefore shaped to prefer four candidate tokens (about 18% each), so the target
is sampled from the first step and every group carries signal. The rollout path is the real one (chat prompts,
sampling with log-probabilities, the exact-answer environment); only the reward is the toy's, assigned to each
sample before the learner sees it.
"""

from __future__ import annotations

import statistics

import pytest

from tests.learning_task import shaped_tiny_model
from workers.envs.registry import arithmetic_tasks
from workers.models import make_backend
from workers.rl.config import TrainConfig
from workers.rl.learner import Learner
from workers.rl.rollout import RolloutWorker
from workers.rl.weightsync import WeightSyncReceiver

STEPS = 8
CANDIDATES = [1000, 2000, 3000, 4000]
TARGET = CANDIDATES[0]


@pytest.fixture(scope="module")
def toy_model(tmp_path_factory):  # type: ignore[no-untyped-def]
    """The tiny model shaped to prefer the four candidate tokens (tests/learning_task.py)."""
    return shaped_tiny_model(tmp_path_factory.mktemp("toy-model"), CANDIDATES)


def _train(path, algorithm: str, learning_rate: float) -> list[float]:  # type: ignore[no-untyped-def]
    config = TrainConfig(
        base_model=str(path),
        algorithm=algorithm,  # type: ignore[arg-type]
        learning_rate=learning_rate,
        steps=STEPS,
        prompts_per_step=4,
        group_size=4,
        loss={"kl_coef": 0.0},
        sampling={"max_new_tokens": 8},  # type: ignore[arg-type]
        seed=3,
    )
    backend = make_backend("transformers", path)
    rollouts = RolloutWorker(
        backend,
        environment="exact_answer",
        env_params={},
        reward={"terms": [{"type": "exact_match"}]},
        max_new_tokens=8,
    )
    learner = Learner(path, config)
    receiver = WeightSyncReceiver()
    tasks = arithmetic_tasks(32, seed=0)
    rewards = []
    for step in range(STEPS):
        result = rollouts.rollout(tasks[(step * 4) % 32 : (step * 4) % 32 + 4], group_size=4, seed=step)
        for sample in result.samples:
            completion = sample.token_ids[sample.completion_start :]
            sampled = [t for t, m in zip(completion, sample.loss_mask, strict=True) if m]
            sample.reward = sum(1 for t in sampled if t == TARGET) / max(len(sampled), 1)
        rewards.append(statistics.mean(s.reward for s in result.samples))
        learner.train_step(result.samples)
        blob, _ = learner.weight_update()
        if blob is not None:
            backend.load_state_dict(receiver.receive(blob), learner.version)
    return rewards


@pytest.mark.parametrize("algorithm", ["grpo", "cispo"])
def test_the_mean_reward_rises_on_a_verifiable_toy_task(toy_model, algorithm):
    rewards = _train(toy_model, algorithm, learning_rate=0.05)
    assert rewards[0] > 0.05  # the target is sampled from the start: the test measures learning, not luck
    first, last = statistics.mean(rewards[:2]), statistics.mean(rewards[-2:])
    assert last - first > 0.15, rewards


def test_the_mean_reward_does_not_rise_with_a_learning_rate_of_zero(toy_model):
    rewards = _train(toy_model, "grpo", learning_rate=0.0)
    first, last = statistics.mean(rewards[:2]), statistics.mean(rewards[-2:])
    assert abs(last - first) < 0.15, rewards
