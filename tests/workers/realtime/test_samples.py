"""Recorded sessions as trajectories and as training samples: the conversation, C4's length statistics and the
broken calls, one sample per served turn exactly as served, the baselines, the statistics, and malformed rows."""

from __future__ import annotations

import json

import pytest

from tests.workers.realtime.sessions import feedback, session, turn
from workers.realtime.reward import default_session_reward_spec
from workers.realtime.samples import (
    MALFORMED_CALL_NOTE,
    SessionRowError,
    baseline_values,
    parse_sessions_jsonl,
    session_samples,
    session_to_trajectory,
    session_trajectory_id,
    trajectory_from_row,
)
from workers.rewards.schema import validate_reward_spec
from workers.rewards.score import score_trajectory

FEEDBACK_ONLY = {"terms": [{"type": "session_feedback"}]}

READ_CALL = {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}


def _agent_session():  # type: ignore[no-untyped-def]
    system = {"role": "system", "content": "You edit code."}
    user = {"role": "user", "content": "fix it"}
    first = turn(0, messages=[system, user], content="look", tool_calls=[READ_CALL], completion=list(range(10)))
    history = [system, user, {"role": "assistant", "content": "look", "tool_calls": [READ_CALL]}]
    second = turn(
        1,
        messages=[*history, {"role": "tool", "tool_call_id": "call_1", "content": "x = 1\n"}],
        content=[{"type": "text", "text": "fixed"}],  # type: ignore[arg-type]
        completion=[5, 6, 7, 8, 9],
    )
    return session("agent", turns=[second, first], signals=[feedback("edit_kept")], task_type="fix")


def test_a_session_becomes_a_trajectory_with_its_conversation_feedback_and_turn_indices() -> None:
    trajectory = session_to_trajectory(_agent_session())
    assert trajectory.id == "agent@7" and trajectory.task_id == "fix"
    assert [(t.role, t.content, t.tool) for t in trajectory.turns] == [
        ("system", "You edit code.", None),
        ("user", "fix it", None),
        ("assistant", "look", "read_file"),
        ("tool", "x = 1\n", "read_file"),  # the tool's name comes from the call it answers
        ("assistant", "fixed", None),
    ]
    assert trajectory.turns[2].args == {"path": "a.py"}
    assert trajectory.tool_calls == ["read_file"] and trajectory.num_turns == 2
    assert trajectory.session_turns == [0, 1]
    assert [(f.signal, f.turn_index) for f in trajectory.feedback] == [("edit_kept", None)]


def test_the_length_statistics_split_each_reply_between_text_and_tool_calls() -> None:
    stats = session_to_trajectory(_agent_session()).length_stats
    assert stats is not None
    # Turn 0: 10 tokens; "look" is 4 characters, the call <tool_call>{"name": "read_file"}{"path": "a.py"}</tool_call>
    # 23 + 21 + 16 = 60: round(10 · 60/64) = 9 call tokens, 1 of thinking. Turn 1 (the last): 5 tokens of final
    # message. Tool output: 6 characters at 4 per token, 2.
    assert stats.model_dump() == {
        "thinking_tokens": 1,
        "tool_call_tokens": 9,
        "tool_output_tokens": 2,
        "final_message_tokens": 5,
        "summary_tokens": 0,
        "tool_calls": 1,
        "turns": 2,
    }


def test_several_calls_in_one_reply_are_one_assistant_turn_each_and_unparsed_blocks_count_as_broken() -> None:
    calls = [
        READ_CALL,
        {"id": "call_2", "type": "function", "function": {"name": "run", "arguments": "not json"}},
    ]
    record = session(
        turns=[
            turn(0, content="two calls", tool_calls=calls),
            turn(
                1,
                messages=[
                    {"role": "assistant", "content": "two calls", "tool_calls": calls},
                    {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
                    {"role": "tool", "tool_call_id": "call_9", "content": "error: no such call"},
                ],
                content='oops <tool_call>{"name": broken}</tool_call>',
            ),
        ]
    )
    trajectory = session_to_trajectory(record)
    assert [(t.role, t.content, t.tool) for t in trajectory.turns] == [
        ("user", "request 0", None),
        ("assistant", "two calls", "read_file"),
        ("assistant", "", "run"),
        ("tool", "ok", "read_file"),
        ("tool", "error: no such call", None),  # answers no call: malformed
        ("assistant", 'oops <tool_call>{"name": broken}</tool_call>', None),
        ("tool", MALFORMED_CALL_NOTE, None),
    ]
    assert trajectory.turns[2].args == {"raw": "not json"}
    broken = validate_reward_spec({"terms": [{"type": "broken_tool_calls"}]})
    assert score_trajectory(broken, trajectory).terms["broken_tool_calls"] == pytest.approx(0.2)


def test_a_long_session_id_still_makes_an_ingestible_trajectory_id() -> None:
    record = session("x" * 200)
    identifier = session_trajectory_id(record)
    assert len(identifier) == 200 and identifier.startswith("x" * 150)
    assert identifier != session_trajectory_id(session("x" * 199 + "y"))


# --- samples -------------------------------------------------------------------------------------------------------


def test_each_served_turn_is_one_sample_exactly_as_served() -> None:
    record = session(
        turns=[
            turn(0, prompt=[1, 2], completion=[3, 4], logprobs=[-0.5, -0.25], policy_version=3),
            turn(1, prompt=[1, 2, 3, 4, 9], completion=[5], logprobs=[-2.0], policy_version=4),
        ],
        signals=[feedback("edit_kept", turn_index=1)],
    )
    samples, advantages, stats = session_samples([record], FEEDBACK_ONLY, "none", policy_version=4)
    assert [(s.token_ids, s.completion_start, s.loss_mask, s.old_logprobs) for s in samples] == [
        ([1, 2, 3, 4], 2, [1, 1], [-0.5, -0.25]),
        ([1, 2, 3, 4, 9, 5], 5, [1], [-2.0]),
    ]
    assert [s.reward for s in samples] == [1.0, 1.0] and advantages == [1.0, 1.0]
    assert [s.policy_version for s in samples] == [3, 4]
    assert samples[1].trajectory["id"] == "s1@7#1" and samples[1].trajectory["request_id"] == "chatcmpl-1"
    assert stats.on_policy_share == 0.5 and stats.tokens == 10 and stats.completion_tokens == 3


def _batch():  # type: ignore[no-untyped-def]
    return [
        session("a", task_type="fix", signals=[feedback("edit_kept")]),  # +1
        session("b", task_type="fix", signals=[feedback("dissatisfied_followup")]),  # -1
        session("c", task_type="fix", signals=[feedback("edit_kept")]),  # +1
        session("d", task_type="explain", signals=[feedback("tests_failed", value=0.5)]),  # -0.5
        session("e", task_type="explain"),  # no feedback: dropped
    ]


def test_the_batch_mean_baseline() -> None:
    samples, advantages, stats = session_samples(_batch(), FEEDBACK_ONLY, "batch_mean", policy_version=0)
    mean = (1 - 1 + 1 - 0.5) / 4
    assert [s.reward for s in samples] == [1.0, -1.0, 1.0, -0.5]
    assert advantages == pytest.approx([1 - mean, -1 - mean, 1 - mean, -0.5 - mean])
    assert stats.baseline_values == {"batch": pytest.approx(mean)}
    assert (stats.sessions, stats.used, stats.dropped, stats.turns, stats.dropped_turns) == (5, 4, 1, 4, 1)
    assert stats.reward_mean == pytest.approx(mean) and stats.on_policy_share == 1.0


def test_the_task_type_baseline_falls_back_to_the_batch_mean_for_a_lone_turn() -> None:
    samples, advantages, stats = session_samples(_batch(), FEEDBACK_ONLY, "task_type_mean")
    fix_mean, batch_mean = (1 - 1 + 1) / 3, 0.125
    assert advantages == pytest.approx([1 - fix_mean, -1 - fix_mean, 1 - fix_mean, -0.5 - batch_mean])
    assert stats.baseline_values == {"batch": 0.125, "type:explain": 0.125, "type:fix": pytest.approx(fix_mean)}
    assert stats.on_policy_share is None  # the checkpoint trained from is not known


def test_no_baseline_keeps_the_rewards() -> None:
    _, advantages, _ = session_samples(_batch(), FEEDBACK_ONLY, "none")
    assert advantages == [1.0, -1.0, 1.0, -0.5]
    with pytest.raises(ValueError, match="baseline must be one of batch_mean, task_type_mean, none"):
        session_samples(_batch(), FEEDBACK_ONLY, "median")
    assert baseline_values([], [], "batch_mean") == ([], {})


def test_turns_without_tokens_or_beyond_max_samples_are_left_out_newest_kept() -> None:
    record = session(
        turns=[turn(0, created_at=5.0), turn(1, completion=[], created_at=6.0), turn(2, created_at=4.0)],
        signals=[feedback("edit_kept")],
    )
    older = session("old", turns=[turn(0, created_at=1.0)], signals=[feedback("edit_kept")])
    samples, _, stats = session_samples([older, record], FEEDBACK_ONLY, "none", max_samples=2)
    assert [s.trajectory["id"] for s in samples] == ["s1@7#0", "s1@7#2"]
    assert (stats.empty_turns, stats.cut_turns, stats.used, stats.dropped, stats.turns) == (1, 1, 1, 0, 2)


def test_the_default_reward_prices_broken_calls_and_length_on_every_turn() -> None:
    record = session(
        turns=[turn(0, content="<tool_call>{", completion=[1] * 10), turn(1, completion=[1] * 10)],
        signals=[feedback("edit_kept")],
    )
    samples, _, _ = session_samples([record], default_session_reward_spec(), "none")
    # broken: 0.1; C4: x = 20 tokens · 0.001 + 2 turns · 0.01 = 0.04, cost x/(1+x), times 0.1
    expected = 1.0 - 0.1 - 0.1 * (0.04 / 1.04)
    assert [s.reward for s in samples] == [pytest.approx(expected)] * 2
    assert samples[0].malformed_tool_calls == 1 and samples[0].terms["broken_tool_calls"] == pytest.approx(0.1)


# --- rows ----------------------------------------------------------------------------------------------------------


def _rows(*records) -> bytes:  # type: ignore[no-untyped-def]
    return "".join(r.model_dump_json() + "\n" for r in records).encode()


def test_session_rows_parse_and_convert() -> None:
    data = _rows(session("a"), session("b")) + b"\n"
    assert [r.session_id for r in parse_sessions_jsonl(data)] == ["a", "b"]
    row = json.loads(session("a").model_dump_json())
    trajectory = trajectory_from_row(row)
    assert trajectory is not None and trajectory.id == "a@7"
    assert trajectory_from_row({"id": "plain"}) is None


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda row: "{not json", "line 2: invalid JSON"),
        (lambda row: "[1, 2]", "line 2: expected a JSON object"),
        (lambda row: {**row, "format": "session/v2"}, "line 2: field 'format': expected 'session/v1'"),
        (
            lambda row: {**row, "turns": [{**row["turns"][0], "logprobs": [0.0]}]},
            "line 2: field 'turns[0]': Value error, logprobs has 1 values for 3 completion tokens",
        ),
        (lambda row: {**row, "turns": []}, "line 2: field 'turns': List should have at least 1 item"),
        (
            lambda row: {**row, "session_id": "a"},
            "line 2: field 'session_id': session 'a' of serve run 7 repeats line 1",
        ),
        (
            lambda row: {**row, "turns": [{**row["turns"][0], "prompt_token_ids": []}]},
            "line 2: field 'turns' (turn_index 0): prompt_token_ids is empty",
        ),
        (
            lambda row: {**row, "feedback": [{"event_id": "e", "signal": "thumbs", "created_at": 1.0}]},
            "line 2: field 'feedback[0]': Value error, value: thumbs takes value +1",
        ),
    ],
)
def test_a_malformed_session_row_names_its_line_and_field(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    row = json.loads(session("b").model_dump_json())
    bad = mutate(row)
    line = bad if isinstance(bad, str) else json.dumps(bad)
    with pytest.raises(SessionRowError) as caught:
        parse_sessions_jsonl(_rows(session("a")) + line.encode() + b"\n")
    assert str(caught.value).startswith(message), str(caught.value)
    assert caught.value.line == 2
