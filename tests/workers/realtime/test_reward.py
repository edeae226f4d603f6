"""The session reward (`session_feedback` term): every rule from users' signals to a per-turn scalar, against values
computed by hand, and how it combines with C4's length penalty and the broken-tool-calls penalty."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from workers.envs.checks import check_reward_compatible
from workers.envs.registry import get_environment
from workers.realtime.reward import default_session_reward_config, default_session_reward_spec, score_session
from workers.rewards.schema import RewardSpecError, spec_hash, validate_reward_spec
from workers.rewards.score import score_trajectory
from workers.rewards.term_feedback import SignalWeights
from workers.rewards.terms import feedback_signal_value, feedback_turn_position, session_turn_credits
from workers.session_records import SIGNALS
from workers.trajectories import LengthStats, Trajectory, Turn


def _traj(served: int = 1, feedback: list[dict[str, object]] | None = None, **fields: object) -> Trajectory:
    """A session of `served` turns (client indices 0, 1, ...) with `feedback`."""
    return Trajectory.model_validate(
        {"id": "s", "session_turns": list(range(served)), "feedback": feedback or [], **fields}
    )


def _credits(spec: dict[str, object], trajectory: Trajectory) -> list[float | None]:
    return score_session(
        validate_reward_spec({"terms": [{"type": "session_feedback", **spec}]}), trajectory
    ).turn_rewards


# --- one signal --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("signal", "value", "expected"),
    [
        ("edit_kept", None, 1.0),
        ("accepted", None, 1.0),
        ("edit_reverted", None, -1.0),
        ("rejected", None, -1.0),
        ("dissatisfied_followup", None, -1.0),
        ("thumbs", 1.0, 1.0),
        ("thumbs", -1.0, -1.0),
        ("tests_passed", 0.75, 0.75),  # the fraction that passed
        ("tests_passed", None, 1.0),
        ("tests_failed", 0.25, -0.25),  # the fraction that failed: -(1 - 0.75 passed)
        ("tests_failed", None, -1.0),
    ],
)
def test_each_signal_is_worth_its_default_weight(signal: str, value: float | None, expected: float) -> None:
    trajectory = _traj(feedback=[{"signal": signal, "value": value}])
    assert _credits({}, trajectory) == [pytest.approx(expected)]


def test_the_default_weights_cover_every_signal_and_text_carries_no_reward() -> None:
    assert set(SignalWeights.model_fields) == set(SIGNALS)
    # text is worth 0, so a session with only a comment has no feedback: dropped by default, neutral when asked.
    comment = _traj(feedback=[{"signal": "text", "text": "hm"}])
    assert _credits({}, comment) == [None]
    assert _credits({"no_feedback": "neutral", "neutral_value": 0.25}, comment) == [0.25]


def test_weights_scale_and_flip_signals() -> None:
    weights = {"thumbs": 0.5, "tests_failed": -2.0, "edit_kept": 3.0}
    assert _credits({"weights": weights}, _traj(feedback=[{"signal": "thumbs", "value": -1}])) == [-0.5]
    assert _credits({"weights": weights}, _traj(feedback=[{"signal": "tests_failed", "value": 0.5}])) == [-1.0]
    assert _credits({"weights": weights, "weight": 0.5}, _traj(feedback=[{"signal": "edit_kept"}])) == [1.5]


def test_signal_value_formula() -> None:
    assert feedback_signal_value("thumbs", -1.0, 2.0) == -2.0
    assert feedback_signal_value("tests_passed", 0.2, 1.0) == 0.2
    assert feedback_signal_value("edit_kept", None, -0.5) == -0.5
    with pytest.raises(ValueError, match="thumbs takes value"):
        feedback_signal_value("thumbs", None, 1.0)
    with pytest.raises(ValueError, match="must lie in"):
        feedback_signal_value("tests_failed", 1.5, 1.0)


# --- several signals and several turns ---------------------------------------------------------------------------


def test_a_signal_credits_earlier_turns_with_the_decay_and_a_session_signal_is_about_the_last_turn() -> None:
    trajectory = _traj(3, [{"signal": "edit_kept", "turn_index": 1}, {"signal": "dissatisfied_followup"}])
    # turn 0: +1·0.5 − 1·0.25; turn 1: +1 − 1·0.5; turn 2: −1 (edit_kept on turn 1 does not reach turn 2)
    assert _credits({"turn_decay": 0.5}, trajectory) == [0.25, 0.5, -1.0]
    # mean: each sum over the signals reaching the turn, divided by how many reach it
    assert _credits({"turn_decay": 0.5, "combine": "mean"}, trajectory) == [0.125, 0.25, -1.0]
    # decay 1 (the default): every earlier turn fully
    assert _credits({}, trajectory) == [0.0, 0.0, -1.0]


def test_a_session_level_signal_credits_the_last_turn_most() -> None:
    trajectory = _traj(4, [{"signal": "edit_kept"}])
    assert _credits({"turn_decay": 0.5}, trajectory) == [0.125, 0.25, 0.5, 1.0]
    assert _credits({}, trajectory) == [1.0, 1.0, 1.0, 1.0]


def test_signals_on_one_turn_add_up_or_average() -> None:
    trajectory = _traj(
        1, [{"signal": "edit_kept"}, {"signal": "tests_passed", "value": 0.5}, {"signal": "thumbs", "value": 1}]
    )
    assert _credits({}, trajectory) == [2.5]
    assert _credits({"combine": "mean"}, trajectory) == [pytest.approx(2.5 / 3)]


def test_turns_no_signal_reaches_are_dropped_or_neutral() -> None:
    trajectory = _traj(3, [{"signal": "edit_reverted", "turn_index": 0}])
    assert _credits({}, trajectory) == [-1.0, None, None]
    assert _credits({"no_feedback": "neutral", "neutral_value": 0.5}, trajectory) == [-1.0, 0.5, 0.5]
    silent = _traj(2)
    assert _credits({}, silent) == [None, None]
    assert _credits({"no_feedback": "neutral"}, silent) == [0.0, 0.0]


def test_feedback_names_turns_by_the_clients_index() -> None:
    # recorded turns 2, 5 and 9: a signal about turn 6 (not recorded) is about turn 5, one about turn 0 about the
    # first recorded turn, one about turn 40 about the last
    assert feedback_turn_position([2, 5, 9], 6) == 1
    assert feedback_turn_position([2, 5, 9], 0) == 0
    assert feedback_turn_position([2, 5, 9], 40) == 2
    assert feedback_turn_position([2, 5, 9], None) == 2
    trajectory = Trajectory.model_validate(
        {"id": "s", "session_turns": [2, 5, 9], "feedback": [{"signal": "edit_kept", "turn_index": 5}]}
    )
    assert _credits({"turn_decay": 0.5}, trajectory) == [0.5, 1.0, None]


def test_session_turn_credits_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="decay must lie in"):
        session_turn_credits(1, [], decay=0.0)
    with pytest.raises(ValueError, match="outside the session"):
        session_turn_credits(2, [(2, 1.0)])
    with pytest.raises(ValueError, match="num_turns"):
        session_turn_credits(0, [])


# --- the session as a whole --------------------------------------------------------------------------------------


def test_the_sessions_value_is_the_mean_of_its_kept_turns_and_a_session_without_feedback_is_dropped() -> None:
    spec = validate_reward_spec({"terms": [{"type": "session_feedback", "turn_decay": 0.5}]})
    trajectory = _traj(3, [{"signal": "edit_kept", "turn_index": 1}])
    result = score_trajectory(spec, trajectory)
    assert result.reward == pytest.approx((0.5 + 1.0) / 2) and not result.dropped
    silent = score_trajectory(spec, _traj(3))
    assert silent.dropped and silent.terms == {"session_feedback": 0.0}
    assert score_session(spec, _traj(3)).dropped
    # trajectories of other terms are never dropped
    assert not score_trajectory(validate_reward_spec({"terms": [{"type": "exact_match"}]}), _traj()).dropped


def test_the_session_reward_combines_with_the_length_and_broken_tool_call_penalties() -> None:
    spec = validate_reward_spec(
        {
            "terms": [
                {"type": "session_feedback", "turn_decay": 0.5},
                {"type": "broken_tool_calls"},
                {"type": "length_penalty", "weight": 0.1},
            ]
        }
    )
    trajectory = _traj(
        2,
        [{"signal": "edit_kept"}],
        turns=[Turn(role="assistant", content="<tool_call>{"), Turn(role="tool", content="error: bad call")],
        length_stats=LengthStats(final_message_tokens=1000),
    )
    # credits [0.5, 1]; broken calls: one malformed, 0.1; C4 at x = 1000·0.001 = 1 with k=1, q=2: 1 − 1/2 = 0.5,
    # times 0.1. Every turn pays the session's penalties.
    scored = score_session(spec, trajectory)
    assert scored.turn_rewards == [pytest.approx(0.5 - 0.15), pytest.approx(1.0 - 0.15)]
    assert scored.result.reward == pytest.approx(0.75 - 0.15)  # the mean of the turns'
    assert scored.result.terms == {
        "session_feedback": 0.75,
        "broken_tool_calls": pytest.approx(0.1),
        "length_penalty": pytest.approx(0.5),
    }


def test_the_floor_and_cap_apply_to_each_turn() -> None:
    spec = validate_reward_spec(
        {
            "terms": [{"type": "session_feedback", "turn_decay": 0.5}, {"type": "broken_tool_calls"}],
            "floor": -0.2,
            "cap_at_pre_penalty": True,
        }
    )
    trajectory = _traj(2, [{"signal": "dissatisfied_followup"}], turns=[Turn(role="tool", content="error: x")])
    # turn 1: gains −1, −1.1 after the penalty, floored to −0.2, capped at the gains: −1. Turn 0: gains −0.5 the same
    # way: max(−0.6, −0.2) = −0.2, min(−0.2, −0.5) = −0.5.
    assert score_session(spec, trajectory).turn_rewards == [-0.5, -1.0]


def test_other_gain_terms_count_in_full_on_every_turn() -> None:
    spec = validate_reward_spec({"terms": [{"type": "session_feedback"}, {"type": "tests_passed", "weight": 2}]})
    trajectory = _traj(2, [{"signal": "edit_kept", "turn_index": 0}], tests_passed=0.5)
    assert score_session(spec, trajectory).turn_rewards == [2.0, None]


# --- the config ----------------------------------------------------------------------------------------------------


def test_the_default_session_reward_and_its_hash() -> None:
    spec = default_session_reward_spec()
    assert [term.type for term in spec.terms] == ["session_feedback", "broken_tool_calls", "length_penalty"]
    config = default_session_reward_config()
    assert config["terms"][0] == {
        "type": "session_feedback",
        "name": "session_feedback",
        "weight": 1.0,
        "weights": {
            "edit_kept": 1.0,
            "edit_reverted": -1.0,
            "dissatisfied_followup": -1.0,
            "accepted": 1.0,
            "rejected": -1.0,
            "thumbs": 1.0,
            "tests_passed": 1.0,
            "tests_failed": -1.0,
            "text": 0.0,
        },
        "no_feedback": "drop",
        "neutral_value": 0.0,
        "turn_decay": 1.0,
        "combine": "sum",
    }
    # content-hashed: the written-out defaults, the short form and a reordered form hash the same
    short = {
        "terms": [
            {"type": "session_feedback"},
            {"type": "broken_tool_calls"},
            {"type": "length_penalty", "weight": 0.1},
        ]
    }
    assert spec_hash(validate_reward_spec(config)) == spec_hash(validate_reward_spec(short)) == spec_hash(spec)
    changed = default_session_reward_spec(weights={"edit_kept": 2.0})
    assert spec_hash(changed) != spec_hash(spec)
    assert spec_hash(default_session_reward_spec(turn_decay=0.9)) != spec_hash(spec)


@pytest.mark.parametrize(
    ("term", "field", "fragment"),
    [
        ({"turn_decay": 0}, "terms[0].turn_decay", "greater than 0"),
        ({"turn_decay": 1.5}, "terms[0].turn_decay", "less than or equal to 1"),
        ({"no_feedback": "ignore"}, "terms[0].no_feedback", "'drop' or 'neutral'"),
        ({"combine": "max"}, "terms[0].combine", "'sum' or 'mean'"),
        ({"weights": {"edit_kep": 1}}, "terms[0].weights.edit_kep", "allowed fields: edit_kept"),
        ({"weights": {"thumbs": "a lot"}}, "terms[0].weights.thumbs", "valid number"),
        ({"neutral_value": float("inf")}, "terms[0].neutral_value", "finite"),
    ],
)
def test_a_bad_session_reward_names_the_field(term: dict[str, object], field: str, fragment: str) -> None:
    with pytest.raises(RewardSpecError) as caught:
        validate_reward_spec({"terms": [{"type": "session_feedback", **term}]})
    [error] = caught.value.errors
    assert error["field"] == field and error["term"] == "session_feedback"
    assert fragment in str(error["message"])


def test_feedback_on_a_trajectory_is_validated() -> None:
    with pytest.raises(ValidationError, match="unknown signal 'likes'"):
        _traj(feedback=[{"signal": "likes"}])
    with pytest.raises(ValidationError, match="thumbs takes value"):
        _traj(feedback=[{"signal": "thumbs", "value": 2}])
    with pytest.raises(ValidationError, match="fraction of tests"):
        _traj(feedback=[{"signal": "tests_passed", "value": -0.1}])
    # old rows (no feedback, no session turns) still parse
    assert Trajectory.model_validate({"id": "old"}).feedback == []


def test_no_environment_feeds_the_session_reward() -> None:
    [problem] = check_reward_compatible(get_environment("exact_answer"), {"terms": [{"type": "session_feedback"}]})
    assert problem.startswith("terms[0] (session_feedback): reads feedback")
