"""Context-1's easy -> hard curriculum by hop count: weighted draws that switch phase at `switch_at`."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from workers.rl.config import TrainConfig
from workers.rl.config_sections import CurriculumConfig
from workers.rl.sampling import Curriculum


def _rows(hops: list[int]) -> list[dict[str, object]]:
    return [{"id": f"t{i}", "hops": h} for i, h in enumerate(hops)]


def test_the_easy_phase_draws_mostly_easy_tasks_and_the_hard_phase_mostly_hard() -> None:
    rows = _rows([1] * 50 + [2] * 50)
    curriculum = Curriculum.from_rows(rows, CurriculumConfig(by="hops", switch_at=0.5, skew=4.0), steps=10, seed=0)
    assert curriculum.switch_step == 5
    easy_share, hard_share = [], []
    for step in range(10):
        drawn, weights = curriculum.draw(step, 20)
        assert len(set(drawn)) == 20  # without replacement
        share = curriculum.metrics(weights)["sampling/hard_share"]
        assert share == sum(1 for i in drawn if rows[i]["hops"] == 2) / 20
        (easy_share if step < 5 else hard_share).append(share)
    assert max(easy_share) < 0.5 < min(hard_share)
    # The draw is a function of the step: a resumed run draws the same rows.
    again = Curriculum.from_rows(rows, CurriculumConfig(by="hops", skew=4.0), steps=10, seed=0)
    assert again.draw(7, 20) == curriculum.draw(7, 20)


def test_rows_without_hops_are_named() -> None:
    with pytest.raises(ValueError, match=r"task row 2 \(t1\) has no integer 'hops'"):
        Curriculum.from_rows([{"id": "t0", "hops": 1}, {"id": "t1"}], CurriculumConfig(by="hops"), steps=4, seed=0)


def test_a_curriculum_and_hard_upsampling_cannot_both_choose_the_prompts() -> None:
    with pytest.raises(ValidationError, match="curriculum and upsample_hard"):
        TrainConfig(curriculum={"by": "hops"}, upsample_hard={"by": "turns"})
    with pytest.raises(ValidationError, match="skew"):
        CurriculumConfig(by="hops", skew=1.0)
