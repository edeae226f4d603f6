"""The OpenAI wire format without a server: validation naming fields, rendering as the environments render, tool
calls split out of replies, and the bodies the official client parses."""

from __future__ import annotations

import json

import numpy as np
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from workers.envs.registry import make_env
from workers.envs.toolcalls import format_tool_call
from workers.models.registry import TINY_LLAMA, load_tokenizer, resolve_base_model
from workers.serving.arm import text_pieces
from workers.serving.control import pick_arm, session_point
from workers.serving.openai_api import (
    Envelope,
    completion_body,
    make_reply,
    render_messages,
    split_reply,
    stream_chunks,
    tool_specs,
)
from workers.serving.openai_request import APIError, parse_request
from workers.serving.recorder import percentile


def _body(**fields: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


def _refused(body: object) -> APIError:
    with pytest.raises(APIError) as caught:
        parse_request(body if isinstance(body, bytes) else json.dumps(body))
    assert caught.value.status == 400
    return caught.value


def test_an_unknown_field_is_refused_naming_it() -> None:
    error = _refused(_body(bogus=1))
    assert error.param == "bogus" and "unrecognized request argument" in error.message
    assert error.body() == {
        "error": {"message": error.message, "type": "invalid_request_error", "param": "bogus", "code": None}
    }


def test_n_other_than_one_is_refused_naming_n() -> None:
    error = _refused(_body(n=3))
    assert error.param == "n" and "only n=1" in error.message
    assert parse_request(json.dumps(_body(n=1))).n == 1


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
        (_body(messages=[]), "messages"),
        (_body(messages=[{"role": "user", "content": 3}]), "messages[0].content"),
        (_body(messages=[{"role": "wizard", "content": "x"}]), "messages[0]"),
        (_body(messages=[{"role": "tool", "content": "x"}]), "messages[0].tool_call_id"),
        (_body(messages=[{"role": "assistant"}]), "messages[0]"),
        (_body(temperature=3), "temperature"),
        (_body(top_p=0), "top_p"),
        (_body(max_tokens=0), "max_tokens"),
        (_body(stop=["a", "b", "c", "d", "e"]), "stop"),
        (_body(top_logprobs=3), "top_logprobs"),
        (_body(presence_penalty=0.5), "presence_penalty"),
        (_body(tool_choice="required"), "tool_choice"),
        (_body(tools=[{"type": "function", "function": {"name": "has space"}}]), "tools[0].function.name"),
    ],
)
def test_a_malformed_field_is_named_with_its_path(body: dict[str, object], param: str) -> None:
    assert _refused(body).param == param


def test_a_body_that_is_not_a_json_object_is_refused() -> None:
    assert "not valid JSON" in _refused(b"{nope").message
    assert "JSON object" in _refused(b"[1, 2]").message


def test_max_tokens_over_the_endpoints_cap_is_refused_naming_it() -> None:
    request = parse_request(json.dumps(_body(max_completion_tokens=900, max_tokens=10)))
    with pytest.raises(APIError) as caught:
        request.max_new_tokens(512)
    assert caught.value.param == "max_completion_tokens"
    assert parse_request(json.dumps(_body(max_tokens=10))).max_new_tokens(512) == 10
    assert parse_request(json.dumps(_body())).max_new_tokens(512) == 512


def _calculator_tools() -> list[dict[str, object]]:
    env = make_env("calculator")
    return [tool.json_schema() for tool in env.tools]


def test_tools_are_rendered_into_the_system_prompt_exactly_as_the_environment_renders_them() -> None:
    env = make_env("calculator")
    task = env.validate_task_row({"id": "t", "prompt": "What is 6 times 7?", "answer": 42})
    expected = env.initial_messages(task)
    request = parse_request(
        json.dumps(
            {
                "model": "m",
                "messages": [{"role": m["role"], "content": m["content"]} for m in expected if m["role"] != "system"],
                "tools": _calculator_tools(),
            }
        )
    )
    # The environment's system prompt is its own text then the tool prompt; a client sends its own text as the
    # system message and the tools as `tools`.
    own = env.system_prompt
    request.messages.insert(
        0, parse_request(json.dumps(_body(messages=[{"role": "system", "content": own}]))).messages[0]
    )
    rendered = render_messages(request, tool_specs(request.tools or []))
    assert rendered == [dict(m) for m in expected]


def test_without_a_system_message_the_tool_prompt_is_a_system_message_of_its_own() -> None:
    request = parse_request(json.dumps(_body(tools=_calculator_tools())))
    rendered = render_messages(request, tool_specs(request.tools or []))
    assert rendered[0]["role"] == "system" and "<tools>" in rendered[0]["content"]
    assert rendered[1] == {"role": "user", "content": "hi"}
    none = parse_request(json.dumps(_body(tools=_calculator_tools(), tool_choice="none")))
    assert render_messages(none, []) == [{"role": "user", "content": "hi"}]


def test_assistant_tool_calls_and_tool_results_are_written_as_the_environments_write_them() -> None:
    request = parse_request(
        json.dumps(
            _body(
                messages=[
                    {"role": "user", "content": "6*7?"},
                    {
                        "role": "assistant",
                        "content": "Let me compute.",
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "calculate", "arguments": '{"expression": "6*7"}'},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "42"}]},
                ],
                tools=_calculator_tools(),
            )
        )
    )
    rendered = render_messages(request, tool_specs(request.tools or []))
    assert rendered[2] == {
        "role": "assistant",
        "content": "Let me compute.\n" + format_tool_call("calculate", {"expression": "6*7"}),
    }
    assert rendered[3] == {"role": "tool", "content": "42"}


def test_tool_call_arguments_that_are_not_a_json_object_are_refused_naming_them() -> None:
    bad = _body(
        messages=[
            {
                "role": "assistant",
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "calculate", "arguments": "[1]"}}],
            }
        ]
    )
    request = parse_request(json.dumps(bad))
    with pytest.raises(APIError) as caught:
        render_messages(request, [])
    assert caught.value.param == "messages[0].tool_calls[0].function.arguments"


def test_a_tool_parameter_without_one_json_type_is_refused_naming_it() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {"type": "object", "properties": {"x": {"anyOf": [{"type": "string"}]}}},
            },
        }
    ]
    request = parse_request(json.dumps(_body(tools=tools)))
    with pytest.raises(APIError) as caught:
        tool_specs(request.tools or [])
    assert caught.value.param == "tools[0].function.parameters.properties.x.type"
    nullable = [
        {
            "type": "function",
            "function": {"name": "g", "parameters": {"properties": {"y": {"type": ["integer", "null"]}}}},
        }
    ]
    [spec] = tool_specs(parse_request(json.dumps(_body(tools=nullable))).tools or [])
    assert spec.parameters[0].type == "integer" and not spec.parameters[0].required


def test_a_reply_is_split_into_tool_calls_and_malformed_blocks_stay_in_the_content() -> None:
    specs = make_env("calculator").tools
    good = format_tool_call("calculate", {"expression": "6*7"})
    bad = '<tool_call>{"name": "calculate", "arguments": {"expression": 42}}</tool_call>'
    content, calls = split_reply(f"Sure.\n{good}\n{bad} done", specs)
    assert [(c.name, c.arguments) for c in calls] == [("calculate", {"expression": "6*7"})]
    assert content == f"Sure.\n\n{bad} done"
    assert split_reply("no calls here ", specs) == ("no calls here ", [])
    assert split_reply("<tool_call>unclosed", specs) == ("<tool_call>unclosed", [])


def test_a_reply_with_a_tool_call_finishes_with_tool_calls_and_the_client_parses_it() -> None:
    specs = make_env("calculator").tools
    reply = make_reply(format_tool_call("calculate", {"expression": "1+1"}), "stop", specs)
    assert reply.finish_reason == "tool_calls" and reply.content is None
    envelope = Envelope(id="chatcmpl-1", created=1, model="m", policy_version=7, session_id="s")
    completion = ChatCompletion.model_validate(completion_body(envelope, reply, prompt_tokens=3, completion_tokens=5))
    [call] = completion.choices[0].message.tool_calls or []
    assert call.function.name == "calculate" and json.loads(call.function.arguments) == {"expression": "1+1"}
    assert completion.system_fingerprint == "crucible-v7"
    assert completion.model_extra == {"policy_version": 7, "session_id": "s"}
    chunks = [
        ChatCompletionChunk.model_validate(c)
        for c in stream_chunks(envelope, reply, [], prompt_tokens=3, completion_tokens=5, include_usage=True)
    ]
    streamed = [tc for c in chunks for choice in c.choices for tc in choice.delta.tool_calls or []]
    assert [tc.function.name for tc in streamed if tc.function] == ["calculate"]
    assert chunks[-2].choices[0].finish_reason == "tool_calls" and chunks[-1].usage is not None
    # Without tools in the request the same text is plain content.
    plain = make_reply(format_tool_call("calculate", {"expression": "1+1"}), "stop", None)
    assert plain.tool_calls == [] and plain.finish_reason == "stop" and plain.content and "<tool_call>" in plain.content


def test_streamed_pieces_join_to_exactly_the_completion_text() -> None:
    tokenizer = load_tokenizer(resolve_base_model(TINY_LLAMA))
    text = "Héllo wörld 🚀 done"
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces = text_pieces(tokenizer, ids, text)
    assert len(pieces) == len(ids) and "".join(pieces) == text
    # A stop string cut the text short: the pieces stop where the text does.
    assert "".join(text_pieces(tokenizer, ids, "Héllo")) == "Héllo"


def test_the_arm_of_a_session_is_stable_and_follows_the_weights() -> None:
    arms = [("a", 0.75), ("b", 0.25)]
    sessions = [f"session-{i}" for i in range(4000)]
    picks = [pick_arm(s, arms) for s in sessions]
    assert picks == [pick_arm(s, arms) for s in sessions]
    assert 0.72 < picks.count("a") / len(picks) < 0.78
    assert {pick_arm(s, [("a", 1.0), ("b", 0.0)]) for s in sessions[:50]} == {"a"}
    assert all(0.0 <= session_point(s) < 1.0 for s in sessions[:50])
    with pytest.raises(ValueError):
        pick_arm("s", [("a", 0.0)])


def test_percentiles_match_numpy() -> None:
    values = [float(v) for v in np.random.default_rng(0).exponential(50.0, size=101)]
    for q in (50, 95):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert percentile([], 50) == 0.0


def test_openai_errors_are_what_the_official_client_raises() -> None:
    assert openai.BadRequestError and openai.NotFoundError  # the classes the live tests expect
