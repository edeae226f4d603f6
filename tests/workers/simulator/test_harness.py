"""The bridge between the coding harness and Chat Completions: the prompt without its tool block, tool calls
re-encoded for `env.step`, and every result of the environment matched to the call it answers; the users' seeded
draws and verdicts; feedback posts (duplicates, refusals, bad bodies)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.workers.simulator.tasks import task_row
from workers.coding.environment import CodingAgentEnv
from workers.coding.environment_summary import SUMMARY_PROMPT
from workers.envs.toolcalls import render_tool_prompt
from workers.session_records import FeedbackIn, Signal
from workers.simulator.feedback import FeedbackFailed, FeedbackPoster, FeedbackRefused
from workers.simulator.harness import WireCall, encode_reply, observation_messages, request_messages
from workers.simulator.runner import wilson_interval
from workers.simulator.users import asks_question, task_index, verdict


def _env(**params: Any) -> CodingAgentEnv:
    env = CodingAgentEnv(**{"summary_threshold_tokens": 0, **params})
    env.reset(CodingAgentEnv.validate_task_row(task_row("calc-add")))
    return env


def test_the_request_prompt_is_the_environments_without_its_tool_block() -> None:
    env = CodingAgentEnv(system_prompt=None)
    initial = env.reset(CodingAgentEnv.validate_task_row(task_row("calc-add")))
    assert initial[0]["content"] == render_tool_prompt(env.tools)
    assert request_messages(initial, env.tools) == [{"role": "user", "content": initial[1]["content"]}]
    custom = CodingAgentEnv(system_prompt="Be brief.")
    messages = request_messages(custom.reset(CodingAgentEnv.validate_task_row(task_row("calc-add"))), custom.tools)
    assert messages[0] == {"role": "system", "content": "Be brief."}


def test_every_result_answers_its_call_malformed_and_skipped_ones_included() -> None:
    env = _env(max_calls_per_turn=2)
    read = json.dumps({"path": "calc/ops.py"})
    calls = [
        WireCall("a", "read_file", read),
        WireCall("b", "read_file", "{not json"),
        WireCall("c", "nope", "{}"),
        WireCall("d", "list_files", ""),
        WireCall("e", "read_file", read),  # past max_calls_per_turn: not run
    ]
    content = 'Looking. <tool_call>{"name": "read_file"}</tool_call>'  # a malformed block the server left in the text
    reply = encode_reply(content, calls, env.tools, max_calls_per_turn=2, turn=3)
    assert reply.result_ids == ["a", "d", "call_3_x0", "b", "c", "e"]
    assert reply.action_text.startswith(content + "\n<tool_call>") and reply.action_text.count("<tool_call>") == 6
    assert reply.assistant_message["content"] == content
    assert [c["id"] for c in reply.assistant_message["tool_calls"]] == ["a", "b", "c", "d", "e"]
    step = env.step(reply.action_text)
    assert step.observation is not None
    messages = observation_messages(step.observation.messages, reply.result_ids)
    by_id = {m["tool_call_id"]: m["content"] for m in messages}
    assert len(by_id) == len(messages) == 6
    assert by_id["a"].startswith("calc/ops.py (lines") and "file(s) in the repository" in by_id["d"]
    assert "missing required argument 'path'" in by_id["call_3_x0"]
    assert by_id["b"].startswith("error: invalid JSON") and by_id["c"].startswith("error: unknown tool 'nope'")
    assert "at most 2 tool calls per reply" in by_id["e"]
    assert env.counts["malformed_tool_calls"] == 4 and env.counts["tool_calls"] == 2


def test_a_reply_with_only_a_malformed_block_is_answered_with_its_error_as_in_training() -> None:
    env = _env()
    text = '<tool_call>{"name": "read_file", "arguments": {"path": 3}}</tool_call>'
    reply = encode_reply(text, [], env.tools, max_calls_per_turn=4, turn=0)
    assert reply.result_ids == ["call_0_x0"] and "tool_calls" not in reply.assistant_message
    step = env.step(reply.action_text)
    assert not step.done and step.observation is not None  # the environment lets the model correct itself
    (message,) = observation_messages(step.observation.messages, reply.result_ids)
    assert message["tool_call_id"] == "call_0_x0" and "must be a string" in message["content"]
    # An unclosed tag in the text swallows the calls after it, as the environment's parser reads it: its one error
    # answers the server's call.
    swallowed = encode_reply("<tool_call>oops", [WireCall("a", "list_files", "{}")], env.tools, max_calls_per_turn=4)
    assert swallowed.result_ids == ["a"]


def test_a_call_whose_arguments_hold_the_closing_tag_stays_one_call() -> None:
    env = _env()
    content = 'X = "</tool_call>"\n'
    edit = WireCall("a", "edit_file", json.dumps({"path": "calc/new.py", "search": "", "replace": content}))
    reply = encode_reply(None, [edit], env.tools, max_calls_per_turn=4)
    assert reply.result_ids == ["a"] and reply.assistant_message["content"] == ""
    step = env.step(reply.action_text)
    assert step.observation is not None and step.observation.messages[0]["content"].startswith("created calc/new.py")
    assert env.workspace.read_text("calc/new.py") == content


def test_a_self_summary_request_goes_back_as_a_user_message() -> None:
    observation = [{"role": "tool", "content": "ok"}, {"role": "user", "content": SUMMARY_PROMPT}]
    assert observation_messages(observation, ["x"]) == [  # type: ignore[arg-type]
        {"role": "tool", "tool_call_id": "x", "content": "ok"},
        {"role": "user", "content": SUMMARY_PROMPT},
    ]


def test_verdicts_noise_and_the_question_opportunity() -> None:
    def signal(**kw: Any) -> Signal:
        return verdict(**{"fraction": 1.0, "asked": False, "flipped": False, "tolerates": False, **kw}).signal

    assert signal(resolved=True) == Signal.EDIT_KEPT
    assert signal(resolved=False) == Signal.DISSATISFIED_FOLLOWUP
    assert signal(resolved=True, flipped=True) == Signal.DISSATISFIED_FOLLOWUP
    assert signal(resolved=False, flipped=True) == Signal.EDIT_KEPT
    assert signal(resolved=False, asked=True, tolerates=True) == Signal.ACCEPTED
    assert signal(resolved=False, asked=True) == Signal.DISSATISFIED_FOLLOWUP
    assert signal(resolved=True, asked=True, tolerates=True) == Signal.EDIT_KEPT  # nothing to complain about
    failed = verdict(resolved=False, fraction=0.25, asked=False, flipped=True, tolerates=False)
    assert (failed.tests_signal, failed.tests_value) == (Signal.TESTS_FAILED, 0.75)
    assert asks_question("Fixed it. Anything else?", edited=True)
    assert asks_question("Let me know which function you mean.", edited=False)
    assert not asks_question("Let me know which function you mean.", edited=True)
    assert not asks_question("I fixed add().", edited=False) and not asks_question(None, edited=False)


def test_sessions_cover_every_task_once_per_pass_in_a_seeded_order() -> None:
    passes = [[task_index(3, p * 5 + i, 5) for i in range(5)] for p in range(3)]
    assert all(sorted(order) == list(range(5)) for order in passes) and len({tuple(o) for o in passes}) > 1
    assert passes[0] == [task_index(3, i, 5) for i in range(5)]
    low, high = wilson_interval(5, 10)
    assert (round(low, 4), round(high, 4)) == (0.2366, 0.7634)  # the Wilson 95% interval of 5/10


def test_feedback_posts_are_idempotent_and_refusals_are_told_apart() -> None:
    seen: set[str] = set()
    statuses: dict[str, int] = {"s-bad": 400, "s-late": 409, "s-denied": 403}

    def handler(request: httpx.Request) -> httpx.Response:
        session = request.url.path.split("/")[-3]
        body = json.loads(request.content)
        if session in statuses:
            return httpx.Response(statuses[session], json={"detail": f"{session} refused"})
        if body["event_id"] in seen:
            return httpx.Response(200, json={})
        seen.add(body["event_id"])
        return httpx.Response(201, json={})

    poster = FeedbackPoster(
        "http://cp/api/v1", "cri_x", wait_seconds=0, client=httpx.Client(transport=httpx.MockTransport(handler))
    )
    event = FeedbackIn(event_id="e1", signal=Signal.EDIT_KEPT)
    assert poster.url("a b/c") == "http://cp/api/v1/sessions/a%20b%2Fc/feedback/"
    assert poster.post("s1", event) == "created" and poster.post("s1", event) == "duplicate"
    with pytest.raises(FeedbackFailed, match="400: s-bad refused"):
        poster.post("s-bad", event)
    with pytest.raises(FeedbackFailed, match="409: s-late refused"):
        poster.post("s-late", event)
    with pytest.raises(FeedbackRefused, match="403"):
        poster.post("s-denied", event)


def test_a_feedback_refusal_carrying_retry_after_is_retried_until_it_passes() -> None:
    """The control plane answers 400 on turn_index, with Retry-After, for a turn it has not recorded yet: the
    simulator, which was just served that turn, asks again instead of giving up."""
    answers = [400, 400, 201]

    def handler(request: httpx.Request) -> httpx.Response:
        status = answers.pop(0)
        if status == 400:
            return httpx.Response(400, json={"detail": "turn_index: not yet"}, headers={"Retry-After": "2"})
        return httpx.Response(status, json={})

    poster = FeedbackPoster(
        "http://cp/api/v1", "cri_x", wait_seconds=5, client=httpx.Client(transport=httpx.MockTransport(handler))
    )
    assert poster.post("s1", FeedbackIn(event_id="e1", signal=Signal.EDIT_KEPT, turn_index=1)) == "created"
    assert answers == []


def test_the_serving_endpoint_renders_the_environments_own_conversation() -> None:
    """Against the serving side's renderer (workers.serving, built beside this package): a session's next request,
    rendered by the server, is the environment's conversation, text for text."""
    from workers.serving import openai_api as api
    from workers.serving.openai_request import parse_request

    env = _env()
    messages = request_messages(env.messages, env.tools)
    tools = [tool.json_schema() for tool in env.tools]
    raw = [
        'Let me look.\n<tool_call>{"name": "read_file", "arguments": {"path": "calc/ops.py"}}</tool_call>\n'
        '<tool_call>{"name": "read_file", "arguments": {"path": 1}}</tool_call>',
        '<tool_call>{"name": "list_files", "arguments": {}}</tool_call>',
    ]
    for turn, text in enumerate(raw):
        served = api.make_reply(
            text, "stop", api.tool_specs(parse_request({"model": "m", "messages": messages, "tools": tools}).tools)
        ).message()
        calls = [
            WireCall(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in served.get("tool_calls", [])
        ]
        reply = encode_reply(served["content"], calls, env.tools, max_calls_per_turn=4, turn=turn)
        step = env.step(reply.action_text)
        assert step.observation is not None
        messages += [reply.assistant_message, *observation_messages(step.observation.messages, reply.result_ids)]
    request = parse_request({"model": "m", "messages": messages, "tools": tools})
    rendered = api.render_messages(request, api.tool_specs(request.tools))
    assert rendered == [{"role": m["role"], "content": m["content"]} for m in env.messages]
    assert env.counts["malformed_tool_calls"] == 1
