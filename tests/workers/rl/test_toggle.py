"""Kimi K2.5's Toggle (docs/methods.md K4, K5) against hand-computed cases."""

from __future__ import annotations

from typing import Any

import pytest

from workers.rl.config import TrainConfig, settings_for
from workers.rl.config_sections import ToggleConfig
from workers.rl.rollout import Sample
from workers.rl.toggle import apply_toggle, phase, task_budgets


def _sample(task: str, reward: float, length: int) -> Sample:
    return Sample(
        task_id=task,
        group=0,
        token_ids=[1] * (3 + length),
        completion_start=3,
        loss_mask=[1] * length,
        old_logprobs=[0.0] * length,
        reward=reward,
        terms={},
        policy_version=0,
        num_turns=1,
        malformed_tool_calls=0,
        finish_reason="stop",
        error=None,
        trajectory={},
    )


def test_the_budget_is_the_rho_percentile_of_correct_lengths_only() -> None:
    samples = [_sample("a", 1.0, n) for n in (10, 20, 30, 40)] + [_sample("a", 0.0, 500), _sample("b", 0.5, 9)]
    budgets = task_budgets(samples, rho=75, correct_at=1.0)
    assert budgets == {"a": pytest.approx(32.5)}  # numpy's linear percentile of 10, 20, 30, 40; b never correct


def test_phase_zero_zeroes_long_correct_samples_unless_the_group_is_still_failing() -> None:
    config = ToggleConfig(**{"lambda": 0.5, "m": 2})
    easy = [_sample("a", 1.0, 10), _sample("a", 1.0, 50), _sample("a", 0.0, 60), _sample("a", 1.0, 30)]
    hard = [_sample("h", 1.0, 90), _sample("h", 0.0, 10), _sample("h", 0.0, 10), _sample("h", 0.0, 10)]
    budgets = {"a": 30.0, "h": 20.0}

    rewards, metrics = apply_toggle(easy + hard, 4, step=1, config=config, budgets=budgets)  # ⌊1/2⌋ = 0: phase 0
    # easy group (mean 0.75 >= λ): 50 > 30 zeroed, 30 <= 30 kept, the wrong one stays 0; hard group (mean 0.25 < λ)
    assert rewards == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert metrics["toggle/phase"] == 0.0 and metrics["toggle/zeroed_share"] == pytest.approx(1 / 8)

    kept, metrics = apply_toggle(easy + hard, 4, step=2, config=config, budgets=budgets)  # ⌊2/2⌋ = 1: phase 1
    assert kept == [s.reward for s in easy + hard] and metrics["toggle/phase"] == 1.0
    unknown, _ = apply_toggle(easy, 4, step=0, config=config, budgets={})
    assert unknown == [s.reward for s in easy]  # no budget known: nothing zeroed


def test_phases_switch_every_m_steps() -> None:
    assert [phase(t, 3) for t in range(8)] == [0, 0, 0, 1, 1, 1, 0, 0]


def test_the_toggle_is_off_by_default_and_shows_on_the_run_page_when_on() -> None:
    assert TrainConfig().toggle is None
    rows: dict[str, Any] = {r.name: r for r in settings_for(TrainConfig(toggle={"lambda": 0.4})).rows}
    assert rows["toggle"].value.startswith("λ 0.4, m 10, ρ 75") and rows["toggle"].overridden
    notes = settings_for(TrainConfig(toggle={"budget_from": "first_rollout"})).notes
    assert any("first rolled-out group" in note for note in notes)
    with pytest.raises(ValueError, match="rho"):
        TrainConfig(toggle={"rho": 0})
