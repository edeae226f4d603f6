"""Generative reward models with rubrics (Kimi K2.5): the judge's prompt and scores, caching by content hash, the
judgement stored with the record and reused without a model, and the term's validation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from workers.rewards import judge
from workers.rewards.schema import RewardSpecError, validate_reward_spec
from workers.rewards.score import judgements_of, score_trajectory
from workers.trajectories import Trajectory

RECORD: dict[str, Any] = {
    "id": "t1",
    "answer": "Paris",
    "gold_answers": ["Paris"],
    "turns": [
        {"role": "system", "content": "You answer questions."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris"},
    ],
}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> judge.JudgementCache:
    fresh = judge.JudgementCache(tmp_path / "judgements")
    monkeypatch.setattr(judge, "CACHE", fresh)
    return fresh


def test_scores_are_read_per_criterion_and_rescaled() -> None:
    text = "Helpfulness: 8/10\n- instruction following = 3\nrelevance: 4/5\nnonsense: 9\nhelpfulness: 1"
    scores = judge.parse_scores(text, ["helpfulness", "instruction_following", "relevance", "detail"], 10)
    assert scores == {"helpfulness": 8.0, "instruction_following": 3.0, "relevance": 8.0, "detail": None}
    assert judge.parse_scores("detail: 40/10", ["detail"], 10) == {"detail": 10.0}  # clamped


def test_the_view_holds_the_task_the_answer_and_the_last_steps_within_its_size() -> None:
    view = judge.trajectory_view(RECORD, 4000)
    assert "TASK:\nWhat is the capital of France?" in view and "FINAL ANSWER:\nParis" in view
    assert len(judge.trajectory_view({**RECORD, "turns": RECORD["turns"] * 200}, 600)) <= 600


def test_a_tiny_judge_scores_once_and_the_record_carries_its_judgement(
    cache: judge.JudgementCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = validate_reward_spec(
        {
            "terms": [
                {"type": "normalized_match"},
                {"type": "rubric_judge", "judge": "tiny-llama-smollm2-tokenizer", "max_new_tokens": 8},
            ]
        }
    )
    trajectory = Trajectory.model_validate(RECORD)
    first = score_trajectory(spec, trajectory)
    stored = judgements_of(spec, trajectory)["rubric_judge"]
    assert set(stored["scores"]) == {"helpfulness", "instruction_following", "relevance", "detail"}
    assert stored["score"] == first.terms["rubric_judge"] and 0.0 <= stored["score"] <= 1.0
    assert isinstance(stored["text"], str) and len(stored["key"]) == 64
    assert (cache.root / f"{stored['key']}.json").is_file()  # type: ignore[operator]

    def no_model(checkpoint: str) -> Any:
        raise AssertionError("the judge model was called again")

    monkeypatch.setattr("workers.rewards.judge.frozen_backend", no_model)
    assert score_trajectory(spec, trajectory).terms["rubric_judge"] == first.terms["rubric_judge"]  # cache
    monkeypatch.setattr(judge, "CACHE", judge.JudgementCache(None))
    with_record = Trajectory.model_validate({**RECORD, "judgements": {"rubric_judge": stored}})
    assert score_trajectory(spec, with_record).terms["rubric_judge"] == first.terms["rubric_judge"]  # the record's


def test_a_changed_trajectory_or_rubric_is_judged_again(cache: judge.JudgementCache) -> None:
    base = judge.judgement_key("m", [("helpfulness", "h", 1.0)], 10, "view")
    assert base != judge.judgement_key("m", [("helpfulness", "h", 2.0)], 10, "view")
    assert base != judge.judgement_key("m", [("helpfulness", "h", 1.0)], 10, "other view")
    assert base != judge.judgement_key("m2", [("helpfulness", "h", 1.0)], 10, "view")


@pytest.mark.parametrize(
    ("term", "message"),
    [
        ({"judge": "gpt-9"}, "unknown model 'gpt-9'"),
        ({"criteria": []}, "criteria"),
        ({"criteria": [{"name": "a", "description": "x"}, {"name": "a", "description": "y"}]}, "unique"),
        ({"criteria": [{"name": "a", "description": "x", "weight": 0}]}, "weighs 0"),
        ({"criteria": [{"name": "has space", "description": "x"}]}, "criteria"),
        ({"max_score": 0}, "max_score"),
    ],
)
def test_a_bad_rubric_is_refused_naming_the_field(term: dict[str, Any], message: str) -> None:
    with pytest.raises(RewardSpecError, match=message):
        validate_reward_spec({"terms": [{"type": "rubric_judge", **term}]})


def test_agreement_by_hand() -> None:
    pairs = [(0.9, 1.0), (0.8, 1.0), (0.2, 0.0), (0.7, 0.0)]
    found = judge.agreement(pairs, "grm", "exact")
    assert found.n == 4 and found.agreement == pytest.approx(3 / 4)
    assert found.judge_mean_when_passed == pytest.approx(0.85) and found.judge_mean_when_failed == pytest.approx(0.45)
    xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
    mx, my = sum(xs) / 4, sum(ys) / 4
    r = (
        sum((x - mx) * (y - my) for x, y in pairs)
        / (sum((x - mx) ** 2 for x in xs) * sum((y - my) ** 2 for y in ys)) ** 0.5
    )
    assert found.pearson == pytest.approx(r)
    assert judge.agreement([(0.5, 1.0), (0.6, 1.0)], "g", "v").pearson is None  # the verified side is constant
    assert judge.agreement([], "g", "v").n == 0


def test_where_no_model_may_run_a_missing_judgement_is_refused_not_computed(
    cache: judge.JudgementCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_model(checkpoint: str) -> Any:
        raise AssertionError("a judge model was loaded")

    monkeypatch.setattr("workers.rewards.judge.frozen_backend", no_model)
    spec = validate_reward_spec({"terms": [{"type": "rubric_judge", "judge": "tiny-llama-smollm2-tokenizer"}]})
    with judge.stored_judgements_only(), pytest.raises(judge.JudgeUnavailable, match="re-score it in a job"):
        score_trajectory(spec, Trajectory.model_validate(RECORD))
