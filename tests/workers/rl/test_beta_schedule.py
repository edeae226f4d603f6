"""Context-1's F-beta anneal (docs/methods.md X3): beta starts at 4 (recall weighted 16x) and moves linearly to 2 by
the schedule's last epoch, then stays; the trainer moves it between epochs, never inside one."""

from __future__ import annotations

import pytest

from workers.rl.config import TrainConfig
from workers.rl.config_sections import BetaSchedule
from workers.rl.steps import annealed_beta


def test_the_default_schedule_moves_from_4_to_2_over_five_epochs_and_stays() -> None:
    schedule = BetaSchedule()
    assert [schedule.beta(epoch) for epoch in range(7)] == pytest.approx([4.0, 3.5, 3.0, 2.5, 2.0, 2.0, 2.0])
    assert BetaSchedule(epochs=1, start=4, end=1).beta(0) == 1.0  # one epoch: the end value at once
    assert BetaSchedule(start=4, end=2).beta(-1) == 4.0


def test_the_trainer_changes_beta_only_when_an_epoch_ends() -> None:
    config = TrainConfig(prompts_per_step=4, beta_schedule={"start": 4, "end": 2, "epochs": 3})
    # 10 tasks, 4 prompts a step: a step is in the epoch of its first prompt (step x 4 // 10)
    betas = [annealed_beta(config, step, 10) for step in range(8)]
    assert betas == pytest.approx([4.0, 4.0, 4.0, 3.0, 3.0, 2.0, 2.0, 2.0])
    assert annealed_beta(TrainConfig(), 3, 10) is None
