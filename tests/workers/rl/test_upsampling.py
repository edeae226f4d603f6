"""Composer 2's hard-data upsampling (docs/methods.md section 2, `TrainConfig.upsample_hard`, workers.rl.sampling): a
task's weight grows with the turns or tokens its past rollouts needed, each step draws its prompts with those
weights (deterministic, without replacement within a step), and with the option off the trainer's order is what
it was."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

import workers.jobs.train as train
from workers.envs.registry import arithmetic_tasks
from workers.rl.config import TrainConfig, settings_for
from workers.rl.rollout import Sample
from workers.rl.sampling import (
    HardUpsampler,
    TaskNeeds,
    refill_order,
    upsample_weight,
    weighted_order,
)
from workers.rl.steps import data_order, step_prompts
from workers.specs import TrainSpec


def _sample(task_id: str, *, turns: int = 1, tokens: int = 1) -> Sample:
    return Sample(
        task_id=task_id,
        group=0,
        token_ids=[1, 2],
        completion_start=1,
        loss_mask=[1] * tokens,
        old_logprobs=[-1.0] * tokens,
        reward=0.0,
        terms={},
        policy_version=0,
        num_turns=turns,
        malformed_tool_calls=0,
        finish_reason="stop",
        error=None,
        trajectory={"id": task_id},
    )


# --- the weight ---------------------------------------------------------------------------------------------------


def test_the_weight_grows_above_the_mean_need_and_is_capped() -> None:
    # min(max_weight, 1 + strength * max(0, need / mean - 1))
    assert upsample_weight(6.0, 4.0, strength=2.0, max_weight=10.0) == pytest.approx(2.0)  # 1 + 2 * 0.5
    assert upsample_weight(12.0, 4.0, strength=2.0, max_weight=3.0) == 3.0  # 1 + 2 * 2 = 5, capped
    assert upsample_weight(2.0, 4.0, strength=2.0, max_weight=3.0) == 1.0  # below the mean: never below 1
    assert upsample_weight(None, 4.0, strength=2.0, max_weight=3.0) == 1.0  # never rolled out
    assert upsample_weight(5.0, 0.0, strength=2.0, max_weight=3.0) == 1.0  # nothing to compare with
    assert upsample_weight(9.0, 3.0, strength=0.0, max_weight=3.0) == 1.0  # strength 0: uniform


def test_the_upsampler_weighs_each_task_by_its_running_mean_need_hand_computed() -> None:
    upsampler = HardUpsampler(["a", "b", "c", "d"], by="turns", strength=2.0, max_weight=2.5, seed=0)
    upsampler.record([_sample("a", turns=2), _sample("a", turns=4), _sample("b", turns=6)])
    upsampler.record([_sample("c", turns=1)] * 3)
    # means: a 3, b 6, c 1; d never rolled out. M = (3 + 6 + 1) / 3 = 10/3 (each task once, however often drawn)
    assert upsampler.needs.mean_over_tasks() == pytest.approx(10 / 3)
    # b: 1 + 2 * (6 / (10/3) - 1) = 1 + 2 * 0.8 = 2.6, capped at 2.5; a: 3 / (10/3) = 0.9 -> 1; c -> 1; d -> 1
    assert upsampler.weights() == pytest.approx([1.0, 2.5, 1.0, 1.0])

    upsampler.strength = 1.0
    assert upsampler.weights() == pytest.approx([1.0, 1.8, 1.0, 1.0])


def test_need_by_tokens_counts_the_sampled_tokens() -> None:
    upsampler = HardUpsampler(["a", "b"], by="tokens", strength=1.0, max_weight=10.0, seed=0)
    upsampler.record([_sample("a", turns=9, tokens=10), _sample("b", turns=1, tokens=30)])
    # means a 10, b 30, M = 20: a -> 1, b -> 1 + (30/20 - 1) = 1.5
    assert upsampler.weights() == pytest.approx([1.0, 1.5])


def test_the_needs_round_trip_through_json_and_refuse_another_measure() -> None:
    upsampler = HardUpsampler(["a", "b"], by="turns", strength=1.0, max_weight=4.0, seed=0)
    upsampler.record([_sample("a", turns=3), _sample("b", turns=1)])
    restored = HardUpsampler(["a", "b"], by="turns", strength=1.0, max_weight=4.0, seed=0)
    restored.load(json.loads(json.dumps(upsampler.state())))
    assert restored.weights() == upsampler.weights() and restored.draw(5, 2) == upsampler.draw(5, 2)
    with pytest.raises(ValueError, match="by turns"):
        HardUpsampler(["a"], by="tokens", strength=1.0, max_weight=4.0, seed=0).load(upsampler.state())
    with pytest.raises(ValueError, match="same task ids"):
        TaskNeeds.from_json({"by": "turns", "totals": {"a": 1.0}, "counts": {}})


# --- the draw -----------------------------------------------------------------------------------------------------


def test_the_draw_is_deterministic_given_the_seed_and_distinct_within_a_step() -> None:
    weights = [1.0, 3.0, 1.0, 2.0, 1.0, 4.0, 1.0, 1.0]
    first = weighted_order(weights, seed=7, step=3, count=5)
    assert first == weighted_order(weights, seed=7, step=3, count=5)
    assert len(set(first)) == 5
    assert weighted_order(weights, seed=7, step=4, count=5) != first
    assert weighted_order(weights, seed=8, step=3, count=5) != first
    # a shorter draw is the start of the longer one: one row at a time, in key order
    assert weighted_order(weights, seed=7, step=3, count=2) == first[:2]


def test_rows_repeat_only_past_every_row_and_used_rows_come_last() -> None:
    weights = [1.0, 5.0, 1.0]
    rows = weighted_order(weights, seed=0, step=0, count=7)
    assert sorted(rows[:3]) == [0, 1, 2] and sorted(rows[3:6]) == [0, 1, 2]
    refill = weighted_order(weights, seed=0, step=0, count=2, used=[1])
    assert sorted(refill) == [0, 2]  # the heavy row 1 was used this step: the fresh ones first
    assert refill_order(3, 0, 0, 1, 2, [1], weights=weights) == weighted_order(
        weights, seed=0, step=0, count=2, stream="dynamic-sampling:1", used=[1]
    )


def test_bad_weights_are_refused() -> None:
    with pytest.raises(ValueError, match="> 0"):
        weighted_order([1.0, 0.0], seed=0, step=0, count=1)
    with pytest.raises(ValueError, match="no rows"):
        weighted_order([], seed=0, step=0, count=1)
    with pytest.raises(ValueError, match="3 weights for 2 rows"):
        refill_order(2, 0, 0, 1, 1, weights=[1.0, 1.0, 1.0])


def test_draws_favour_hard_tasks_in_proportion_to_their_weights() -> None:
    """Five tasks of weight 4 and five of weight 1: the first prompt of a step is a hard one with probability
    20/25 = 0.8 (successive sampling proportional to weight); over 4,000 seeded steps the share is within 0.02
    (3.2 standard deviations), and hard tasks are drawn more often overall."""
    weights = [4.0] * 5 + [1.0] * 5
    steps = 4000
    first_hard = 0
    drawn: Counter[int] = Counter()
    for step in range(steps):
        rows = weighted_order(weights, seed=11, step=step, count=3)
        first_hard += rows[0] < 5
        drawn.update(rows)
    assert first_hard / steps == pytest.approx(0.8, abs=0.02)
    hard, easy = sum(drawn[i] for i in range(5)), sum(drawn[i] for i in range(5, 10))
    assert hard + easy == 3 * steps and hard > 2 * easy
    assert min(drawn[i] for i in range(5)) > max(drawn[i] for i in range(5, 10))


def test_equal_weights_draw_uniformly() -> None:
    drawn: Counter[int] = Counter()
    for step in range(3000):
        drawn.update(weighted_order([1.0] * 6, seed=2, step=step, count=2))
    assert all(abs(drawn[i] / 6000 - 1 / 6) < 0.02 for i in range(6))


def test_the_upsampler_draws_tasks_whose_rollouts_needed_more_turns_more_often() -> None:
    task_ids = [f"t{i}" for i in range(8)]
    upsampler = HardUpsampler(task_ids, by="turns", strength=3.0, max_weight=4.0, seed=5)
    upsampler.record([_sample(t, turns=8 if t in ("t0", "t1") else 1) for t in task_ids])
    counts: Counter[int] = Counter()
    for step in range(2000):
        rows, weights = upsampler.draw(step, 3)
        counts.update(rows)
        assert len(set(rows)) == 3
    assert weights and min(counts[0], counts[1]) > 2 * max(counts[i] for i in range(2, 8))
    metrics = upsampler.metrics([4.0, 1.0, 1.0, 1.0])
    assert metrics["sampling/upsample_weight_mean"] == pytest.approx(1.75)
    assert metrics["sampling/hard_share"] == pytest.approx(0.25)
    assert metrics["sampling/tasks_seen"] == 8.0 and metrics["sampling/need_mean"] == pytest.approx(22 / 8)


# --- off is today's order -----------------------------------------------------------------------------------------


def test_with_the_option_off_the_order_is_the_seeded_epoch_shuffle_exactly() -> None:
    """Golden values from the trainer before upsampling existed: epochs of a seeded shuffle, and the dynamic
    sampling refill drawn uniformly."""
    assert TrainConfig().upsample_hard.by == "off"
    assert [step_prompts(10, 3, s, 4, None) for s in range(4)] == [
        ([8, 6, 5, 2], []),
        ([3, 4, 1, 7], []),
        ([9, 0, 1, 5], []),
        ([0, 7, 3, 2], []),
    ]
    assert [data_order(10, 3, s, 4) for s in range(4)] == [
        rows for rows, _ in (step_prompts(10, 3, s, 4, None) for s in range(4))
    ]
    assert refill_order(10, 3, 2, 1, 4, [0, 1, 2]) == [8, 9, 3, 7]
    assert refill_order(3, 3, 2, 1, 5, [0, 1]) == [2, 1, 1, 0, 0]


# --- the config ---------------------------------------------------------------------------------------------------


def test_the_option_is_validated_and_shown_with_the_effective_settings() -> None:
    off = settings_for(TrainConfig())
    row = next(r for r in off.rows if r.name == "upsample_hard")
    assert row.value == "off" and not row.overridden and not any("upsample" in n for n in off.notes)

    on = TrainConfig(upsample_hard={"by": "turns", "strength": 0.5, "max_weight": 3})
    settings = settings_for(on)
    row = next(r for r in settings.rows if r.name == "upsample_hard")
    assert row.value == "by turns, strength 0.5, max_weight 3" and row.overridden
    assert "min(max_weight, 1 + strength * max(0, m / M - 1))" in row.source
    assert any(n.startswith("upsample_hard is on") for n in settings.notes)  # grpo samples uniformly
    composer = settings_for(on.model_copy(update={"algorithm": "composer"}))
    assert not any("upsample" in n for n in composer.notes)  # Composer 2 does upsample hard data

    for bad in ({"by": "thinking"}, {"strength": -1}, {"max_weight": 0.5}, {"by": "turns", "typo": 1}):
        with pytest.raises(ValidationError):
            TrainConfig(upsample_hard=bad)


# --- the trainer --------------------------------------------------------------------------------------------------


class RecordingReporter:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __enter__(self) -> RecordingReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self.calls.append((name, args, kwargs))


@pytest.mark.slow
def test_a_run_with_upsampling_reports_its_draws_and_saves_the_needs_beside_its_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reporter = RecordingReporter()
    monkeypatch.setattr(train, "reporter_for", lambda spec: reporter)
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in arithmetic_tasks(6, seed=0)))
    spec = TrainSpec(
        run_id=1,
        kind="train",
        ingest_url="http://127.0.0.1:9/",
        input_uri=f"file://{tmp_path}/tasks.jsonl",
        reward={"terms": [{"type": "exact_match"}]},
        output_prefix=f"file://{tmp_path}/out",
        config={
            "base_model": "tiny-llama-smollm2-tokenizer",
            "steps": 2,
            "prompts_per_step": 2,
            "group_size": 2,
            "checkpoint_every": 1,
            "sampling": {"max_new_tokens": 4},
            "env_params": {"answer_format": "last_number"},
            "compute": {"cpus": 2, "memory_gb": 2},
            "upsample_hard": {"by": "tokens", "strength": 1.0, "max_weight": 4.0},
        },
    )

    train.run(spec)

    metrics = [args[1] for name, args, _ in reporter.calls if name == "metric"]
    assert len(metrics) == 2
    assert metrics[0]["sampling/upsample_weight_mean"] == 1.0 and metrics[0]["sampling/tasks_seen"] == 0.0
    assert metrics[1]["sampling/tasks_seen"] == 2.0 and metrics[1]["sampling/upsample_weight_mean"] >= 1.0
    saved = json.loads((tmp_path / "out/checkpoints/step-000002.pt.sampling.json").read_text())
    assert saved["by"] == "tokens" and sum(saved["counts"].values()) == 8  # 2 steps x 2 prompts x G=2
    logs = [args[0] for name, args, _ in reporter.calls if name == "log"]
    assert any("upsample_hard=by tokens, strength 1, max_weight 4" in line for line in logs)

    # Resumed from step 1's checkpoint, the run restores the needs and draws step 2's prompts as it did.
    def step_two_tasks(calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]]) -> list[str]:
        return sorted(kw["task_id"] for name, _, kw in calls if name == "trajectory" and kw["step"] == 2)

    resumed = RecordingReporter()
    monkeypatch.setattr(train, "reporter_for", lambda spec: resumed)
    checkpoint = f"file://{tmp_path}/out/checkpoints/step-000001.pt"
    train.run(spec.model_copy(update={"resume_from": checkpoint, "output_prefix": f"file://{tmp_path}/resumed"}))
    resumed_logs = [args[0] for name, args, _ in resumed.calls if name == "log"]
    assert "upsample_hard: the needs of 2 tasks restored" in resumed_logs
    assert len(step_two_tasks(reporter.calls)) == 4 and step_two_tasks(resumed.calls) == step_two_tasks(reporter.calls)
