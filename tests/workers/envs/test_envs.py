"""Environments: the tool-call format, the safe calculator, scripted episodes scored by the real reward code,
task-row validation and the checks a run's dataset and reward config pass at creation."""

from __future__ import annotations

import json
import operator
import re
import time
from typing import Any

import pytest

from workers.envs import (
    ENVIRONMENTS,
    CalculatorEnv,
    EpisodeStateError,
    ExactAnswerEnv,
    Task,
    TaskFieldError,
    arithmetic_tasks,
    check_reward_compatible,
    check_task_fields,
    check_task_rows,
    environment_choices,
    make_env,
    parse_tool_calls,
    render_tool_prompt,
)
from workers.envs.answers import canonical_number, extract_answer
from workers.envs.calculator import (
    CALCULATE,
    CalculatorError,
    evaluate_expression,
    format_number,
    word_problem_tasks,
)
from workers.envs.toolcalls import FORMAT_HINT, ToolParameter, ToolSpec, format_tool_call
from workers.rewards.schema import (
    TERM_INPUTS,
    TERM_TYPES,
    coding_agent_spec,
    context1_spec,
    parl_spec,
    validate_reward_spec,
)
from workers.rewards.score import score_trajectory
from workers.rewards.term_base import TermInputs
from workers.trajectories import Trajectory, parse_trajectories_jsonl

LOOKUP = ToolSpec(
    name="lookup",
    description="Look a key up",
    parameters=(
        ToolParameter("key", "string", "the key"),
        ToolParameter("limit", "integer", "how many", required=False),
        ToolParameter("exact", "boolean", "exact match only", required=False),
    ),
)
TOOLS = (CALCULATE, LOOKUP)


def _calc(expression: str) -> str:
    return format_tool_call("calculate", {"expression": expression})


def _score(spec_data: dict[str, Any], record: dict[str, Any]) -> Any:
    return score_trajectory(validate_reward_spec(spec_data), Trajectory.model_validate(record))


def _task(answer: str = "87", **extra: Any) -> Task:
    return CalculatorEnv.validate_task_row({"id": "t-1", "prompt": "What is 12 * 7 + 3?", "answer": answer, **extra})


# --- tool-call format ----------------------------------------------------------------------------------------------


def test_a_well_formed_call_parses_into_its_name_and_arguments_and_the_rest_is_final_text() -> None:
    result = parse_tool_calls(
        'Let me work it out. <tool_call>{"name": "calculate", "arguments": {"expression": "2 + 3"}}</tool_call>',
        TOOLS,
    )
    assert [(c.name, c.arguments) for c in result.calls] == [("calculate", {"expression": "2 + 3"})]
    assert result.errors == []
    assert result.final_text == "Let me work it out."
    assert result.has_tool_calls


def test_several_calls_in_one_reply_parse_in_order_with_whitespace_inside_the_tags() -> None:
    text = (
        '<tool_call>\n  {"name": "lookup", "arguments": {"key": "a", "limit": 2}}\n</tool_call>\n'
        "then\n"
        '<tool_call>{"name": "calculate", "arguments": {"expression": "1"}}</tool_call>'
    )
    result = parse_tool_calls(text, TOOLS)
    assert [(c.name, c.arguments) for c in result.calls] == [
        ("lookup", {"key": "a", "limit": 2}),
        ("calculate", {"expression": "1"}),
    ]
    assert result.final_text == "then"


def test_a_reply_without_tags_has_no_calls_and_is_all_final_text() -> None:
    result = parse_tool_calls("  The answer is 42.  ", TOOLS)
    assert result.calls == [] and result.errors == [] and not result.has_tool_calls
    assert result.final_text == "The answer is 42."


def test_format_tool_call_writes_what_the_parser_reads() -> None:
    result = parse_tool_calls(format_tool_call("lookup", {"key": "x", "exact": True}), TOOLS)
    assert [(c.name, c.arguments) for c in result.calls] == [("lookup", {"key": "x", "exact": True})]


def test_malformed_json_is_an_error_that_shows_the_expected_format() -> None:
    result = parse_tool_calls('<tool_call>{"name": "calculate", "arguments": {"expression": 2 + 3}}</tool_call>', TOOLS)
    assert result.calls == []
    [error] = result.errors
    assert error.startswith("error: invalid JSON in <tool_call> block")
    assert error.endswith(f"expected format: {FORMAT_HINT}")


def test_an_unknown_tool_is_an_error_listing_the_available_tools() -> None:
    result = parse_tool_calls('<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>', TOOLS)
    assert result.calls == []
    assert result.errors == [
        f"error: unknown tool 'search'; available tools: calculate, lookup; expected format: {FORMAT_HINT}"
    ]


def test_a_missing_required_argument_is_an_error_naming_it_with_an_example_call() -> None:
    [error] = parse_tool_calls('<tool_call>{"name": "calculate", "arguments": {}}</tool_call>', TOOLS).errors
    assert "missing required argument 'expression' (a string)" in error
    assert error.endswith('<tool_call>{"name": "calculate", "arguments": {"expression": "<string>"}}</tool_call>')


def test_a_missing_arguments_key_is_fine_when_no_argument_is_required() -> None:
    empty = ToolSpec(name="ping", description="no arguments")
    result = parse_tool_calls('<tool_call>{"name": "ping"}</tool_call>', [empty])
    assert [(c.name, c.arguments) for c in result.calls] == [("ping", {})]


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"key": 7}, "argument 'key' of tool 'lookup' must be a string, got a number"),
        ({"key": "a", "limit": 2.5}, "argument 'limit' of tool 'lookup' must be an integer, got a number"),
        ({"key": "a", "limit": True}, "argument 'limit' of tool 'lookup' must be an integer, got a boolean"),
        ({"key": "a", "exact": "yes"}, "argument 'exact' of tool 'lookup' must be true or false, got a string"),
        ({"key": "a", "colour": "red"}, "tool 'lookup' has no argument 'colour'"),
    ],
)
def test_a_mistyped_or_unknown_argument_is_an_error_naming_it(arguments: dict[str, Any], expected: str) -> None:
    [error] = parse_tool_calls(format_tool_call("lookup", arguments), TOOLS).errors
    assert error.startswith(f"error: {expected};")


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('{"name": "calculate", "arguments": "{\\"expression\\": \\"1\\"}"}', "must be a JSON object, not a string"),
        ('{"name": "calculate", "parameters": {"expression": "1"}}', "unexpected key 'parameters'"),
        ('["calculate", "1"]', "holds an array, not an object"),
        ('{"arguments": {"expression": "1"}}', "has no 'name' string"),
        ("   ", "empty <tool_call> block"),
        ('{"name": "lookup", "arguments": {"key": "a", "limit": NaN}}', "invalid JSON"),
    ],
)
def test_calls_outside_the_documented_shape_are_errors(body: str, expected: str) -> None:
    result = parse_tool_calls(f"<tool_call>{body}</tool_call>", TOOLS)
    assert result.calls == []
    [error] = result.errors
    assert expected in error


def test_an_unclosed_tag_and_a_stray_closing_tag_are_each_one_malformed_call() -> None:
    unclosed = parse_tool_calls('ok <tool_call>{"name": "calculate", "arguments": {"expression": "1"}}', TOOLS)
    assert unclosed.calls == [] and len(unclosed.errors) == 1 and "never closed" in unclosed.errors[0]
    assert unclosed.final_text == "ok"
    stray = parse_tool_calls(f"done </tool_call> {_calc('1')}", TOOLS)
    assert [c.name for c in stray.calls] == ["calculate"]
    assert len(stray.errors) == 1 and "without an opening" in stray.errors[0]


def test_the_tool_prompt_lists_every_tool_schema_and_the_call_format() -> None:
    prompt = render_tool_prompt(TOOLS)
    match = re.search(r"<tools>\n(.*)\n</tools>", prompt, re.DOTALL)
    assert match is not None
    schemas = [json.loads(line) for line in match.group(1).splitlines()]
    assert schemas == [
        {
            "type": "function",
            "function": {
                "name": "calculate",
                "description": CALCULATE.description,
                "parameters": {
                    "type": "object",
                    "properties": {
                        "expression": {"type": "string", "description": "The expression, e.g. (12 + 7) * 3"}
                    },
                    "required": ["expression"],
                },
            },
        },
        LOOKUP.json_schema(),
    ]
    assert LOOKUP.json_schema()["function"]["parameters"]["required"] == ["key"]
    assert FORMAT_HINT in prompt
    assert render_tool_prompt([]) == ""


# --- calculator ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("2 + 3 * 4", 14),
        ("(2 + 3) * 4", 20),
        ("-3 ** 2", -9),
        ("(-3) ** 2", 9),
        ("7 // 2", 3),
        ("-7 // 2", -4),
        ("7 % 3", 1),
        ("7 / 2", 3.5),
        ("2 ** -1", 0.5),
        ("2 ** 10", 1024),
        ("+5 - -5", 10),
        ("1.5 * 4", 6.0),
    ],
)
def test_the_calculator_evaluates_arithmetic(expression: str, value: float) -> None:
    assert evaluate_expression(expression) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os').system('true')", "function calls are not allowed"),
        ("x + 1", "names are not allowed ('x')"),
        ("(1).real", "attribute access is not allowed"),
        ("abs(-1)", "function calls are not allowed"),
        ("'a' * 3", "only numbers are allowed"),
        ("True + 1", "only numbers are allowed"),
        ("[1, 2][0]", "Subscript is not allowed"),
        ("1 if 1 else 2", "IfExp is not allowed"),
        ("1 < 2", "Compare is not allowed"),
        ("lambda: 1", "Lambda is not allowed"),
        ("1 & 3", "operator BitAnd is not allowed"),
        ("1 +", "not a valid arithmetic expression"),
        ("", "the expression is empty"),
        ("1j * 2", "only numbers are allowed"),
    ],
)
def test_the_calculator_refuses_anything_but_arithmetic(expression: str, message: str) -> None:
    with pytest.raises(CalculatorError, match=re.escape(message)):
        evaluate_expression(expression)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("2 ** 10000", "exponent 10000 is too large"),
        ("9 ** 9 ** 9", "too large"),
        ("10 ** 19", "number too large"),
        ("999999999999 * 999999999999", "number too large"),
        ("1e300 * 1e300", "number too large"),
        ("9" * 30, "number too large"),
        ("(-8) ** 0.5", "not a real number"),
        ("0 ** -1", "division by zero"),
        ("1 + " * 60 + "1", "expression too long"),
    ],
)
def test_the_calculator_refuses_huge_numbers_and_exponents_quickly(expression: str, message: str) -> None:
    started = time.perf_counter()
    with pytest.raises(CalculatorError, match=re.escape(message)):
        evaluate_expression(expression)
    assert time.perf_counter() - started < 0.5


def test_the_largest_allowed_power_is_computed_exactly() -> None:
    assert evaluate_expression("10 ** 18") == 10**18
    assert evaluate_expression("2 ** 59") == 576460752303423488


@pytest.mark.parametrize(("value", "text"), [(3.0, "3"), (0.1 + 0.2, "0.3"), (7 / 3, "2.33333333333"), (-12, "-12")])
def test_results_are_formatted_without_float_noise(value: float, text: str) -> None:
    assert format_number(value) == text


# --- calculator episodes -------------------------------------------------------------------------------------------


def test_a_scripted_calculator_episode_runs_tools_and_ends_on_a_plain_answer() -> None:
    env = make_env("calculator", max_turns=5)
    initial = env.reset(_task())
    assert [m["role"] for m in initial] == ["system", "user"]
    assert FORMAT_HINT in initial[0]["content"] and initial[1]["content"] == "What is 12 * 7 + 3?"

    first = env.step(f"First the product. {_calc('12 * 7')}")
    assert not first.done and first.observation is not None
    assert first.observation.messages == [{"role": "tool", "content": "84"}]
    assert first.info == {"turn": 1, "tool_calls": 1, "malformed_tool_calls": 0, "tool_errors": 0}

    second = env.step(_calc("84 + 3"))
    assert second.observation is not None and second.observation.messages == [{"role": "tool", "content": "87"}]

    last = env.step("So the answer is 87.")
    assert last.done and last.observation is None
    record = env.trajectory("traj-1")
    assert record["answer"] == "87" and record["gold_answers"] == ["87"] and record["error"] is None
    assert record["counts"] == {"turns": 3, "tool_calls": 2, "malformed_tool_calls": 0, "tool_errors": 0}
    parsed = Trajectory.model_validate(record)
    assert parsed.tool_calls == ["calculate", "calculate"]
    assert parsed.num_turns == 3
    assert [t.role for t in parsed.turns] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert parsed.turns[2].args == {"expression": "12 * 7"}
    assert [m["role"] for m in env.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]


def test_a_calculator_trajectory_scores_with_exact_match_and_the_turn_penalty() -> None:
    env = CalculatorEnv(max_turns=5)
    env.reset(_task())
    env.step(_calc("12 * 7 + 3"))
    env.step("87")
    spec = {"terms": [{"type": "exact_match"}, {"type": "turn_penalty", "start": 1, "ramp": 4, "max_penalty": 0.5}]}
    result = _score(spec, env.trajectory("t"))
    # 2 assistant turns: penalty 0.5 · (2 − 1) / 4 = 0.125; reward 1 − 0.125
    assert result.terms == {"exact_match": 1.0, "turn_penalty": 0.125}
    assert result.reward == pytest.approx(0.875)


def test_a_wrong_final_number_scores_zero() -> None:
    env = CalculatorEnv()
    env.reset(_task())
    env.step("It is 86 apples.")
    record = env.trajectory("t")
    assert record["answer"] == "86"
    assert _score({"terms": [{"type": "exact_match"}]}, record).reward == 0.0


def test_division_by_zero_comes_back_as_an_error_observation_and_counts_as_a_tool_error() -> None:
    env = CalculatorEnv()
    env.reset(_task())
    result = env.step(_calc("5 / (3 - 3)"))
    assert not result.done and result.observation is not None
    assert result.observation.messages == [{"role": "tool", "content": "error: division by zero"}]
    assert result.info["tool_errors"] == 1 and result.info["malformed_tool_calls"] == 0
    env.step("87")
    assert env.trajectory("t")["counts"] == {"turns": 2, "tool_calls": 1, "malformed_tool_calls": 0, "tool_errors": 1}


def test_malformed_calls_go_back_to_the_model_and_are_counted_in_the_trajectory() -> None:
    env = CalculatorEnv()
    env.reset(_task())
    first = env.step('<tool_call>{"name": "calculate", "arguments": {"expr": "1"}}</tool_call>')
    assert first.observation is not None and not first.done
    [message] = first.observation.messages
    assert message["role"] == "tool" and message["content"].startswith("error: tool 'calculate' has no argument")
    second = env.step(f'{_calc("12 * 7")}<tool_call>not json</tool_call><tool_call>{{"name": "add"}}</tool_call>')
    assert second.observation is not None
    assert [m["content"] for m in second.observation.messages][0] == "84"
    assert second.info["malformed_tool_calls"] == 2 and second.info["tool_calls"] == 1
    env.step("87")
    record = env.trajectory("t")
    assert record["counts"] == {"turns": 3, "tool_calls": 1, "malformed_tool_calls": 3, "tool_errors": 0}
    parsed = Trajectory.model_validate(record)
    # Malformed calls are not tool calls: only the well-formed one reaches Trajectory.tool_calls.
    assert parsed.tool_calls == ["calculate"]
    assert sum(1 for t in parsed.turns if t.role == "tool" and t.content.startswith("error:")) == 3


def test_max_turns_ends_the_episode_without_an_answer_and_marks_it_failed() -> None:
    env = CalculatorEnv(max_turns=2)
    env.reset(_task())
    assert not env.step(_calc("1 + 1")).done
    last = env.step(_calc("2 + 2"))
    assert last.done and last.observation is None and last.info["truncated"] is True
    record = env.trajectory("t")
    assert record["answer"] is None
    assert record["error"] == "no final answer within max_turns=2"
    assert record["counts"]["turns"] == 2 and record["counts"]["tool_calls"] == 2
    # An errored trajectory gets no floor (docs/methods.md X2), so the floor of 0.1 does not lift it.
    assert _score({"terms": [{"type": "exact_match"}], "floor": 0.1}, record).reward == 0.0
    with pytest.raises(EpisodeStateError, match="is done"):
        env.step("87")


def test_calls_beyond_the_per_reply_limit_are_not_run_and_are_counted() -> None:
    env = CalculatorEnv(max_calls_per_turn=2)
    env.reset(_task())
    result = env.step(_calc("1") + _calc("2") + _calc("3"))
    assert result.observation is not None
    assert [m["content"] for m in result.observation.messages][:2] == ["1", "2"]
    assert "at most 2 tool calls per reply" in result.observation.messages[2]["content"]
    assert result.info["tool_calls"] == 2 and result.info["malformed_tool_calls"] == 1


def test_an_episode_refuses_steps_before_reset_and_a_trajectory_before_it_ends() -> None:
    env = CalculatorEnv()
    with pytest.raises(EpisodeStateError, match="call reset"):
        env.step("1")
    env.reset(_task())
    env.step(_calc("1"))
    with pytest.raises(EpisodeStateError, match="not done"):
        env.trajectory()
    env.abort("generation timed out")
    record = env.trajectory()
    assert record["error"] == "generation timed out" and record["id"]


def test_reset_starts_a_fresh_episode() -> None:
    env = CalculatorEnv()
    env.reset(_task())
    env.step("<tool_call>bad</tool_call>")
    env.step("87")
    env.reset(_task())
    env.step("87")
    assert env.trajectory("t")["counts"] == {"turns": 1, "tool_calls": 0, "malformed_tool_calls": 0, "tool_errors": 0}


def test_a_task_given_as_messages_keeps_its_system_prompt_ahead_of_the_tool_prompt() -> None:
    env = CalculatorEnv(system_prompt=None)
    task = CalculatorEnv.validate_task_row(
        {
            "id": 1,
            "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
            "answer": 4,
        }
    )
    messages = env.reset(task)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == "Be brief.\n\n" + render_tool_prompt([CALCULATE])


# --- exact-answer episodes -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "exact", "normalized", "reward"),
    [("12", 1.0, 1.0, 1.0), (" 12\n", 1.0, 1.0, 1.0), ("12.", 0.0, 1.0, 0.3), ("13", 0.0, 0.0, 0.0)],
)
def test_an_exact_answer_episode_is_one_reply_scored_by_the_answer_terms(
    reply: str, exact: float, normalized: float, reward: float
) -> None:
    env = make_env("exact_answer")
    task = ExactAnswerEnv.validate_task_row({"id": "a-1", "prompt": "What is 7 + 5?", "answer": 12})
    assert env.reset(task) == [{"role": "user", "content": "What is 7 + 5?"}]
    result = env.step(reply)
    assert result.done and result.observation is None
    record = env.trajectory("traj-a")
    assert record["gold_answers"] == ["12"] and record["task_id"] == "a-1" and record["env"] == "exact_answer"
    spec = {"terms": [{"type": "exact_match", "weight": 0.7}, {"type": "normalized_match", "weight": 0.3}]}
    scored = _score(spec, record)
    assert scored.terms == {"exact_match": exact, "normalized_match": normalized}
    assert scored.reward == pytest.approx(reward)


def test_an_exact_answer_env_reading_the_last_number_scores_a_chatty_reply() -> None:
    env = ExactAnswerEnv(answer_format="last_number", system_prompt="Answer with a number.")
    task = ExactAnswerEnv.validate_task_row({"id": "a", "prompt": "What is 7 + 5?", "answer": "12.0"})
    assert env.reset(task)[0] == {"role": "system", "content": "Answer with a number."}
    env.step("7 + 5 = 12")
    record = env.trajectory("t")
    assert record["answer"] == "12" and record["gold_answers"] == ["12"]
    assert _score({"terms": [{"type": "exact_match"}]}, record).reward == 1.0


def test_an_exact_answer_env_ignores_tool_tags_and_has_no_tools() -> None:
    env = ExactAnswerEnv()
    env.reset(ExactAnswerEnv.validate_task_row({"id": "a", "prompt": "q", "answer": "x"}))
    result = env.step(_calc("1"))
    assert result.done
    assert env.trajectory("t")["counts"]["tool_calls"] == 0


def test_trajectories_from_both_environments_pass_the_jsonl_upload_parser() -> None:
    lines = []
    for index, env in enumerate([ExactAnswerEnv(), CalculatorEnv()]):
        env.reset(_task())
        if isinstance(env, CalculatorEnv):
            env.step(_calc("12 * 7 + 3"))
        env.step("87")
        lines.append(json.dumps(env.trajectory(f"traj-{index}")))
    result = parse_trajectories_jsonl(("\n".join(lines) + "\n").encode())
    assert result.ok and [t.id for t in result.trajectories] == ["traj-0", "traj-1"]
    assert [t.tool_calls for t in result.trajectories] == [[], ["calculate"]]


@pytest.mark.parametrize(
    ("text", "answer_format", "answer"),
    [
        ("The answer is 1,200.", "last_number", "1200"),
        ("3 apples then 12.50 dollars", "last_number", "12.5"),
        ("minus -4", "last_number", "-4"),
        ("no digits here", "last_number", None),
        ("  Paris \n", "text", "Paris"),
        ("   ", "text", None),
    ],
)
def test_the_answer_is_taken_from_the_reply_by_the_chosen_format(
    text: str, answer_format: Any, answer: str | None
) -> None:
    assert extract_answer(text, answer_format) == answer


def test_canonical_numbers_drop_trailing_zeros_and_separators() -> None:
    assert [canonical_number(s) for s in ["12.0", "1,200.50", "-0", "007", "1e3", "abc"]] == [
        "12",
        "1200.5",
        "0",
        "7",
        None,
        None,
    ]


# --- task rows -----------------------------------------------------------------------------------------------------


def test_a_row_without_a_needed_field_is_refused_naming_the_field_the_row_and_the_environment() -> None:
    with pytest.raises(TaskFieldError) as info:
        CalculatorEnv.validate_task_row({"id": "x", "question": "2+2?", "answer": "4"}, index=3)
    assert info.value.field == "prompt" and info.value.environment == "calculator"
    message = str(info.value)
    assert message.startswith("task row 3: missing field 'prompt', which environment 'calculator' needs")
    assert "the row has: answer, id, question" in message


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({"id": "x", "prompt": "q"}, "answer"),
        ({"id": "x", "prompt": "q", "answer": None}, "answer"),
        ({"id": "x", "prompt": "q", "answer": {"value": 4}}, "answer"),
        ({"id": "x", "prompt": "q", "answer": True}, "answer"),
        ({"id": "x", "prompt": "q", "answer": "  "}, "answer"),
        ({"id": True, "prompt": "q", "answer": "4"}, "id"),
        ({"id": "", "prompt": "q", "answer": "4"}, "id"),
        ({"id": "x", "prompt": "   ", "answer": "4"}, "prompt"),
        ({"id": "x", "prompt": [{"role": "user"}], "answer": "4"}, "prompt"),
        ({"id": "x", "prompt": 5, "answer": "4"}, "prompt"),
        (["x", "q", "4"], None),
    ],
)
def test_a_row_with_a_field_in_the_wrong_shape_is_refused_naming_it(row: object, field: str | None) -> None:
    with pytest.raises(TaskFieldError) as info:
        ExactAnswerEnv.validate_task_row(row)
    assert info.value.field == field and info.value.environment == "exact_answer"
    if field is not None:
        assert f"'{field}" in str(info.value)


def test_a_valid_row_becomes_a_task_with_aliases_and_metadata() -> None:
    task = ExactAnswerEnv.validate_task_row(
        {"id": 7, "prompt": "Capital of France?", "answer": ["Paris", "paris, France"], "topic": "geo"}
    )
    assert task == Task(
        id="7",
        prompt="Capital of France?",
        answer="Paris",
        aliases=("paris, France",),
        metadata={"topic": "geo"},
    )
    assert task.gold_answers == ["Paris", "paris, France"]


def test_a_dataset_without_a_needed_field_is_refused_before_the_run_starts() -> None:
    assert check_task_fields(CalculatorEnv, ["id", "prompt", "answer", "extra"]) == []
    assert check_task_fields(CalculatorEnv, ["id", "question"]) == [
        "the dataset has no field 'answer', which environment 'calculator' needs in every task row "
        "(required: answer, id, prompt)",
        "the dataset has no field 'prompt', which environment 'calculator' needs in every task row "
        "(required: answer, id, prompt)",
    ]


def test_checking_dataset_rows_reports_each_bad_row_by_number_up_to_a_limit() -> None:
    rows: list[object] = [{"id": 1, "prompt": "q", "answer": "1"}, {"id": 2, "prompt": "q"}, "oops"]
    problems = check_task_rows(ExactAnswerEnv, rows)
    assert len(problems) == 2
    assert problems[0].startswith("task row 2: missing field 'answer'")
    assert problems[1] == "task row 3: expected a JSON object, got a string"
    assert len(check_task_rows(ExactAnswerEnv, [{}] * 30, max_errors=5)) == 5


# --- reward compatibility ------------------------------------------------------------------------------------------


def test_every_reward_term_type_has_its_inputs_declared() -> None:
    assert set(TERM_INPUTS) == set(TERM_TYPES)


def test_term_inputs_keeps_its_old_values() -> None:
    answer = frozenset({"answer", "gold_answers"})
    # The table workers/envs/base.py held before the terms declared their own inputs.
    assert TERM_INPUTS == {
        "exact_match": TermInputs((answer,)),
        "normalized_match": TermInputs((answer,)),
        "f_beta": TermInputs((frozenset({"output_doc_ids", "gold_doc_ids"}),)),
        "trajectory_recall": TermInputs((frozenset({"seen_doc_ids", "gold_doc_ids"}),)),
        "final_answer_bonus": TermInputs((frozenset({"output_doc_ids", "answer_doc_ids"}), answer)),
        "prune_penalty": TermInputs((frozenset({"turns"}),), tools=frozenset({"prune_chunks"})),
        "turn_penalty": TermInputs((frozenset({"turns"}),)),
        "tests_passed": TermInputs((frozenset({"tests_passed"}),)),
        "hidden_tests": TermInputs((frozenset({"hidden_tests"}), frozenset({"tests_passed"}))),
        "broken_tool_calls": TermInputs((frozenset({"turns"}),)),
        "todo_left": TermInputs((frozenset({"diff"}),)),
        "length_penalty": TermInputs((frozenset({"length_stats"}),)),
        "session_feedback": TermInputs((frozenset({"feedback"}),)),
        "item_f1": TermInputs((frozenset({"answer", "gold_table"}),)),
        "parallel_instantiation": TermInputs((frozenset({"swarm"}),)),
        "subagent_finish": TermInputs((frozenset({"swarm"}),)),
        "critical_steps": TermInputs((frozenset({"swarm"}),)),
        "rubric_judge": TermInputs((frozenset({"turns"}),)),
    }


def test_the_context1_retrieval_reward_is_incompatible_with_the_calculator() -> None:
    problems = check_reward_compatible(CalculatorEnv, context1_spec())
    assert len(problems) == 3
    f_beta, recall, prune = problems
    assert f_beta.startswith("terms[0] (f_beta): reads gold_doc_ids, output_doc_ids, which environment 'calculator'")
    assert recall.startswith("terms[1] (trajectory_recall): reads gold_doc_ids, seen_doc_ids")
    assert prune.startswith("terms[3] (prune_penalty): counts calls to prune_chunks")
    # final_answer_bonus (terms[2]) falls back to the answer text, and turn_penalty reads turns: both fit.


def test_answer_terms_fit_both_environments_given_as_class_instance_or_json() -> None:
    spec = {
        "terms": [
            {"type": "exact_match", "name": "em"},
            {"type": "normalized_match"},
            {"type": "final_answer_bonus"},
            {"type": "turn_penalty"},
        ]
    }
    assert check_reward_compatible(ExactAnswerEnv, spec) == []
    assert check_reward_compatible(CalculatorEnv(max_turns=3), validate_reward_spec(spec)) == []


def test_a_renamed_incompatible_term_is_reported_under_its_name() -> None:
    spec = {"terms": [{"type": "f_beta", "name": "docs"}, {"type": "exact_match"}]}
    [problem] = check_reward_compatible(ExactAnswerEnv(), spec)
    assert problem.startswith("terms[0] (f_beta 'docs'): reads gold_doc_ids, output_doc_ids")
    assert "it produces answer, gold_answers, turns" in problem


# --- registry and toy tasks ----------------------------------------------------------------------------------------


def test_make_env_refuses_an_unknown_name_listing_the_choices() -> None:
    expected = (
        "unknown environment 'hive'; choose one of: calculator, coding, coding_agent, exact_answer, search, swarm"
    )
    with pytest.raises(ValueError, match=re.escape(expected)):
        make_env("hive")


def test_make_env_names_a_missing_required_parameter() -> None:
    with pytest.raises(ValueError, match="environment 'search' needs parameter 'index_uri'"):
        make_env("search")


def test_make_env_refuses_a_parameter_the_environment_does_not_take() -> None:
    with pytest.raises(ValueError, match=r"environment 'exact_answer' takes no parameter 'max_turns'; it takes: "):
        make_env("exact_answer", max_turns=3)
    with pytest.raises(ValueError, match="max_turns must be an integer >= 1, got 0"):
        make_env("calculator", max_turns=0)
    with pytest.raises(ValueError, match="answer_format must be one of text, last_number"):
        make_env("calculator", answer_format="json")


def test_every_registered_environment_has_a_description_and_a_matching_name() -> None:
    assert [name for name, _ in environment_choices()] == [
        "calculator",
        "coding",
        "coding_agent",
        "exact_answer",
        "search",
        "swarm",
    ]
    assert all(description for _, description in environment_choices())
    assert all(cls.name == name for name, cls in ENVIRONMENTS.items())


_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_arithmetic_tasks_are_deterministic_valid_and_correct(difficulty: int) -> None:
    rows = arithmetic_tasks(40, seed=3, difficulty=difficulty)
    assert rows == arithmetic_tasks(40, seed=3, difficulty=difficulty)
    assert rows[:10] == arithmetic_tasks(10, seed=3, difficulty=difficulty)
    assert rows != arithmetic_tasks(40, seed=4, difficulty=difficulty)
    assert len({row["id"] for row in rows}) == 40
    assert check_task_rows(ExactAnswerEnv, rows) == []
    for row in rows:
        match = re.fullmatch(r"What is (\d+) ([-+*]) (\d+)\? Answer with just the number\.", row["prompt"])
        assert match is not None, row["prompt"]
        expected = _OPS[match.group(2)](int(match.group(1)), int(match.group(3)))
        assert row["answer"] == str(expected) and expected >= 0


def test_arithmetic_tasks_refuse_an_unknown_difficulty() -> None:
    with pytest.raises(ValueError, match="difficulty must be one of"):
        arithmetic_tasks(3, seed=0, difficulty=4)


def test_word_problems_are_deterministic_and_valid_for_the_calculator() -> None:
    rows = word_problem_tasks(25, seed=1)
    assert rows == word_problem_tasks(25, seed=1) and rows != word_problem_tasks(25, seed=2)
    assert check_task_rows(CalculatorEnv, rows) == []
    assert all(row["answer"].isdigit() for row in rows)
    # The stickers template must divide evenly: its answer times the child count is the total in the prompt.
    for row in rows:
        match = re.match(r"(\d+) stickers are shared equally among (\d+) children", row["prompt"])
        if match:
            assert int(match.group(1)) == int(row["answer"]) * int(match.group(2))


# --- what the control plane asks an environment ------------------------------------------------------------------

# The values apps/benchmarks/services.py hard-coded (SCORE_FIELDS, DEFAULT_METRICS, eval_reward) and
# apps/runs/services.py decided by name ("search" reads a corpus index), copied so the move changes nothing.
_EXACT_MATCH = {"terms": [{"type": "exact_match"}]}
CONTROL_PLANE_FACTS: dict[str, tuple[str, str, bool, dict[str, Any]]] = {
    "exact_answer": ("reward", "mean_score", False, _EXACT_MATCH),
    "calculator": ("reward", "mean_score", False, _EXACT_MATCH),
    "coding": ("tests_passed", "pass@1", False, {"terms": [{"type": "tests_passed"}]}),
    "search": ("output_recall", "mean_score", True, context1_spec().model_dump(mode="json")),
    "coding_agent": ("tests_passed", "pass@1", False, coding_agent_spec().model_dump(mode="json")),
    "swarm": ("task_score", "mean_score", True, parl_spec(0.0, 0.0).model_dump(mode="json")),
}


def test_every_environment_declares_what_the_control_plane_used_to_hard_code() -> None:
    assert set(CONTROL_PLANE_FACTS) == set(ENVIRONMENTS)
    for name, cls in ENVIRONMENTS.items():
        score_field, metric, needs_index, reward = CONTROL_PLANE_FACTS[name]
        assert (cls.score_field, cls.default_metric, cls.needs_corpus_index) == (score_field, metric, needs_index)
        assert cls.eval_reward() == reward, name
        assert cls.eval_reward() is not cls.eval_reward()  # a fresh dict each time: callers may edit it


def test_an_environments_eval_reward_can_score_its_own_episodes() -> None:
    for name, cls in ENVIRONMENTS.items():
        assert check_reward_compatible(cls, cls.eval_reward()) == [], name
        validate_reward_spec(cls.eval_reward())  # raises when the spec is not one


def test_only_the_search_environments_name_corpus_chunks() -> None:
    from workers.search.environment import SearchEnv

    row = {"gold_chunk_ids": ["a", "b"], "answer_chunk_ids": ["b"], "distractor_chunk_ids": ["c"], "other": ["d"]}
    assert SearchEnv.referenced_chunk_ids(row) == {"a", "b", "c"}
    assert SearchEnv.referenced_chunk_ids({"gold_chunk_ids": "not a list"}) == set()
    for name, cls in ENVIRONMENTS.items():
        if not issubclass(cls, SearchEnv):  # the swarm environment is built on the search harness
            assert cls.referenced_chunk_ids(row) == set(), name
