"""The official `openai` client against a real Ray Serve app with the tiny model: completions, streaming, tools,
and every kind of refusal with its OpenAI-style body."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.workers.serving.helpers import MODEL_NAME, NO_SCOPE_KEY, ServingHarness, StubControlPlane
from workers.envs.registry import make_env

HI = [{"role": "user", "content": "Say hi."}]


def test_the_openai_client_gets_a_completion_carrying_its_policy_version(serving: ServingHarness) -> None:
    client = serving.openai_client()
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=HI, max_tokens=6, temperature=0, extra_headers={"X-Session-Id": "sess-basic"}
    )
    completion = raw.parse()
    version = completion.model_extra["policy_version"]
    assert raw.headers["X-Policy-Version"] == str(version)
    assert raw.headers["X-Session-Id"] == "sess-basic" == completion.model_extra["session_id"]
    assert completion.system_fingerprint == f"crucible-v{version}"
    assert completion.model == MODEL_NAME and completion.id.startswith("chatcmpl-")
    [choice] = completion.choices
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert completion.usage is not None and 1 <= completion.usage.completion_tokens <= 6
    # Without a session id the server makes one.
    fresh = client.chat.completions.create(model=MODEL_NAME, messages=HI, max_tokens=2)
    assert len(fresh.model_extra["session_id"]) == 32


def test_a_streamed_completion_is_the_non_streamed_one_in_chunks(serving: ServingHarness) -> None:
    client = serving.openai_client()
    kwargs = {"model": MODEL_NAME, "messages": HI, "max_tokens": 12, "temperature": 0, "logprobs": True}
    whole = client.chat.completions.create(**kwargs)
    stream = client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert {c.model_extra["policy_version"] for c in chunks} == {whole.model_extra["policy_version"]}
    streamed_logprobs = [
        lp.logprob for c in chunks if c.choices and c.choices[0].logprobs for lp in c.choices[0].logprobs.content or []
    ]
    assert streamed_logprobs == pytest.approx([lp.logprob for lp in whole.choices[0].logprobs.content])


def test_the_stream_is_server_sent_events_ending_with_done(serving: ServingHarness) -> None:
    response = httpx.post(
        f"{serving.base_url}/chat/completions",
        json={"model": MODEL_NAME, "messages": HI, "max_tokens": 3, "stream": True},
        headers={"Authorization": "Bearer crk_serve_key"},
        timeout=60,
    )
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    assert "X-Policy-Version" in response.headers
    blocks = [b for b in response.text.split("\n\n") if b]
    assert all(b.startswith("data: ") for b in blocks) and blocks[-1] == "data: [DONE]"
    assert json.loads(blocks[0].removeprefix("data: "))["object"] == "chat.completion.chunk"


def test_a_conversation_with_tools_and_tool_results_round_trips(serving: ServingHarness) -> None:
    tools = [tool.json_schema() for tool in make_env("calculator").tools]
    messages = [
        {"role": "system", "content": "You are a careful calculator."},
        {"role": "user", "content": "What is 6 times 7?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "calculate", "arguments": '{"expression": "6*7"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
    ]
    client = serving.openai_client()
    with_tools = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, tools=tools, max_tokens=4, temperature=0
    )
    without = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=4, temperature=0)
    # The tool prompt went into the system message: the same conversation is longer with tools.
    assert with_tools.usage.prompt_tokens > without.usage.prompt_tokens + 50
    choice = with_tools.choices[0]
    if choice.finish_reason == "tool_calls":  # the tiny model writes noise; a call would be parsed, never raw
        assert choice.message.tool_calls and "<tool_call>" not in (choice.message.content or "")
    else:
        assert choice.message.tool_calls is None


def test_an_unknown_model_is_a_404_with_an_openai_error_body(serving: ServingHarness) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        serving.openai_client().chat.completions.create(model="gpt-nope", messages=HI)
    error = caught.value.body
    assert caught.value.status_code == 404
    assert error["code"] == "model_not_found" and error["param"] == "model" and "gpt-nope" in error["message"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"bogus": 1}, "bogus"), ({"n": 2}, "n"), ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0]")],
)
def test_a_malformed_request_is_a_400_naming_the_field(
    serving: ServingHarness, extra: dict[str, object], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        serving.openai_client().chat.completions.create(model=MODEL_NAME, messages=HI, extra_body=extra)
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == param and caught.value.body["type"] == "invalid_request_error"


def test_a_prompt_over_max_context_or_max_tokens_over_the_cap_is_a_400(serving: ServingHarness) -> None:
    client = serving.openai_client()
    long = [{"role": "user", "content": "word " * 2000}]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL_NAME, messages=long, max_tokens=2)
    assert caught.value.body["code"] == "context_length_exceeded" and caught.value.body["param"] == "messages"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL_NAME, messages=HI, max_tokens=serving.spec.max_new_tokens + 1)
    assert caught.value.body["param"] == "max_tokens"


def test_a_missing_or_unknown_key_is_a_401_and_a_key_without_the_serve_scope_a_403(serving: ServingHarness) -> None:
    body = {"model": MODEL_NAME, "messages": HI}
    missing = httpx.post(f"{serving.base_url}/chat/completions", json=body, timeout=30)
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        serving.openai_client("crk_wrong").chat.completions.create(model=MODEL_NAME, messages=HI)
    with pytest.raises(openai.PermissionDeniedError) as caught:
        serving.openai_client(NO_SCOPE_KEY).chat.completions.create(model=MODEL_NAME, messages=HI)
    assert "serve scope" in caught.value.body["message"]
    with pytest.raises(openai.AuthenticationError):
        serving.openai_client("crk_wrong").models.list()


def test_key_answers_are_cached_for_key_cache_seconds(serving: ServingHarness, plane: StubControlPlane) -> None:
    client = serving.openai_client("crk_cache_probe")
    for _ in range(3):
        with pytest.raises(openai.AuthenticationError):
            client.models.list()
    before = plane.verify_calls
    for _ in range(3):
        with pytest.raises(openai.AuthenticationError):
            client.models.list()
    assert plane.verify_calls == before  # answered from the cache


def test_models_lists_the_served_model_and_unknown_paths_are_openai_errors(serving: ServingHarness) -> None:
    client = serving.openai_client()
    assert [m.id for m in client.models.list()] == [MODEL_NAME]
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other")
    stray = httpx.get(f"{serving.base_url}/completions", timeout=30)
    assert stray.status_code == 404 and "error" in stray.json()


def test_a_bad_session_header_is_a_400_naming_it(serving: ServingHarness) -> None:
    client = serving.openai_client()
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL_NAME, messages=HI, extra_headers={"X-Turn-Index": "-1"})
    assert caught.value.body["param"] == "X-Turn-Index"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL_NAME, messages=HI, extra_headers={"X-Session-Id": "s" * 201})
    assert caught.value.body["param"] == "X-Session-Id"
