"""DAPO's dynamic sampling (docs/methods.md P3, workers.rl.sampling): groups without signal are left out and the batch
is refilled to its size from extra rollouts, up to `dynamic_sampling_max_rounds` rounds; a batch still short
trains as it is and says by how much."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from workers.models.base import Generation, SamplingParams, encode_chat
from workers.models.registry import TINY_LLAMA, load_tokenizer, resolve_base_model
from workers.rl.config import TrainConfig
from workers.rl.learner import Learner
from workers.rl.rollout import RolloutWorker, Sample
from workers.rl.sampling import dynamic_sampling_batch, fill_batch, groups_with_signal, refill_order


def _sample(group: int, reward: float) -> Sample:
    return Sample(
        task_id=f"t{group}",
        group=group,
        token_ids=[1, 2, 3],
        completion_start=2,
        loss_mask=[1],
        old_logprobs=[-1.0],
        reward=reward,
        terms={},
        policy_version=0,
        num_turns=1,
        malformed_tool_calls=0,
        finish_reason="stop",
        error=None,
        trajectory={"id": f"x{group}-{reward}"},
    )


def _round(*groups: tuple[float, float], first: int = 0) -> list[Sample]:
    """Samples of groups of two with the given rewards, numbered from `first`."""
    return [_sample(first + g, r) for g, rewards in enumerate(groups) for r in rewards]


def test_a_group_has_signal_when_its_rewards_differ() -> None:
    assert groups_with_signal([1, 1, 0, 1, 0, 0, 0.5, 0.25], 2) == [False, True, False, True]
    with pytest.raises(ValueError, match="group_size=3"):
        groups_with_signal([1, 2], 3)


def test_the_batch_is_refilled_to_its_size_from_extra_rounds_and_trimmed() -> None:
    rounds = {
        1: _round((0, 0), (1, 0), (1, 1), first=10),  # one more with signal
        2: _round((0, 1), (0, 1), (0, 1), first=20),  # two more than needed
    }
    asked: list[int] = []

    def more(round_: int) -> list[Sample]:
        asked.append(round_)
        return rounds[round_]

    first = _round((1, 1), (0, 1), (0, 0))  # one of three groups has signal
    filled = fill_batch(first, more, target_groups=3, group_size=2, max_rounds=4)

    assert asked == [1, 2] and filled.rounds == 3
    assert [s.group for s in filled.samples] == [1, 1, 11, 11, 20, 20]  # in the order they were generated
    assert all(groups_with_signal([s.reward for s in filled.samples], 2))
    assert (filled.generated_groups, filled.filtered_groups, filled.surplus_groups, filled.short_groups) == (
        9,
        4,
        2,
        0,
    )
    assert len(filled.generated) == 18  # every episode is still reported
    assert filled.metrics()["dynamic_sampling/rounds"] == 3.0


def test_after_the_last_round_a_short_batch_trains_as_it_is_and_says_so() -> None:
    calls: list[int] = []

    def more(round_: int) -> list[Sample]:
        calls.append(round_)
        return _round((1, 1), (0, 0), first=10 * round_)

    filled = fill_batch(_round((1, 0), (1, 1)), more, target_groups=2, group_size=2, max_rounds=3)

    assert calls == [1, 2] and filled.rounds == 3
    assert len(filled.samples) == 2 and filled.short_groups == 1
    one_round = fill_batch(_round((1, 1), (1, 1)), more, target_groups=2, group_size=2, max_rounds=1)
    assert calls == [1, 2] and one_round.samples == [] and one_round.short_groups == 2
    with pytest.raises(ValueError, match="max_rounds must be >= 1"):
        fill_batch([], more, target_groups=1, group_size=2, max_rounds=0)


def test_refill_prompts_are_fresh_and_the_same_on_a_resumed_run() -> None:
    first = refill_order(10, seed=3, step=5, round_=1, count=4, used=[0, 1, 2, 3])
    assert first == refill_order(10, seed=3, step=5, round_=1, count=4, used=[0, 1, 2, 3])
    assert not set(first) & {0, 1, 2, 3} and len(set(first)) == 4
    assert refill_order(10, seed=3, step=5, round_=2, count=4, used=[0, 1, 2, 3]) != first
    repeated = refill_order(3, seed=0, step=0, round_=1, count=5, used=[0])  # fewer fresh rows than asked
    assert len(repeated) == 5 and set(repeated[:2]) == {1, 2}


class SplitBackend:
    """The tiny model's tokenizer replying "42" to even-numbered prompts of each call and "7" to odd ones: a group
    of two gets one of each, so it has signal exactly when its task's answer is 42 or 7."""

    def __init__(self) -> None:
        self._tokenizer = load_tokenizer(resolve_base_model(TINY_LLAMA))
        self.calls = 0

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def policy_version(self) -> int:
        return 0

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> list[int]:
        return encode_chat(self._tokenizer, messages, add_generation_prompt=add_generation_prompt)

    def generate(self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        self.calls += 1
        out = []
        for index, prompt in enumerate(prompt_token_ids):
            text = "42" if index % 2 == 0 else "7"
            ids = self._tokenizer.encode(text, add_special_tokens=False)
            out.append(Generation(list(prompt), list(ids), [-0.5] * len(ids), text, "stop", 0))
        return out


def _refill(rows: list[dict[str, Any]], max_rounds: int) -> tuple[Any, list[list[int]]]:
    worker = RolloutWorker(
        SplitBackend(),  # type: ignore[arg-type]
        environment="exact_answer",
        env_params={"answer_format": "last_number"},
        reward={"terms": [{"type": "exact_match"}]},
    )
    rounds: list[list[int]] = []

    def generate(order: list[int], round_: int) -> list[Sample]:
        rounds.append(order)
        return worker.rollout([rows[i] for i in order], group_size=2, seed=round_, id_prefix=f"r{round_}-").samples

    first = worker.rollout(rows[:3], group_size=2, seed=0).samples
    filled = dynamic_sampling_batch(
        first,
        generate,
        num_rows=len(rows),
        seed=0,
        step=0,
        first_rows=[0, 1, 2],
        target_groups=3,
        group_size=2,
        max_rounds=max_rounds,
    )
    return filled, rounds


def test_dynamic_sampling_refills_a_step_with_real_rollouts_of_fresh_prompts() -> None:
    """The step's regular prompts (rows 0-2) have answer 5, so none of their groups has signal; four of the other
    nine rows have answer 42. Refill rounds draw three fresh rows each, so within four rounds the batch is full
    with three groups that each have one right and one wrong answer, and the learner trains on exactly those."""
    rows = [{"id": f"q{i}", "prompt": f"Question {i}?", "answer": 42 if i in (5, 7, 9, 11) else 5} for i in range(12)]

    filled, rounds = _refill(rows, max_rounds=4)

    assert all(len(order) == 3 and not set(order) & {0, 1, 2} for order in rounds)  # fresh prompts first
    assert filled.rounds == 1 + len(rounds) and filled.short_groups == 0
    assert len(filled.samples) == 6 and [s.reward for s in filled.samples] == [1.0, 0.0] * 3
    assert {s.task_id for s in filled.samples} <= {"q5", "q7", "q9", "q11"}
    assert filled.filtered_groups == filled.generated_groups - 3 - filled.surplus_groups

    config = TrainConfig(base_model=TINY_LLAMA, algorithm="dapo", prompts_per_step=3, group_size=2)
    learner = Learner(resolve_base_model(TINY_LLAMA), config)
    metrics = learner.train_step(filled.samples)
    assert metrics["dropped_groups"] == 0 and metrics["trained_samples"] == 6


def test_a_step_without_any_signal_stops_after_the_last_round_and_takes_no_update() -> None:
    rows = [{"id": f"q{i}", "prompt": f"Question {i}?", "answer": 5} for i in range(12)]

    filled, rounds = _refill(rows, max_rounds=3)

    assert len(rounds) == 2 and filled.rounds == 3
    assert filled.samples == [] and filled.short_groups == 3 and len(filled.generated) == 2 * (3 + 3 + 3)
    config = TrainConfig(base_model=TINY_LLAMA, algorithm="dapo", prompts_per_step=3, group_size=2)
    learner = Learner(resolve_base_model(TINY_LLAMA), config)
    metrics = learner.train_step(filled.samples)
    assert metrics["trained_samples"] == 0.0 and learner.version == 0 and learner.step == 1
