"""Recording: every completion reaches the (stub) control plane as a `session_turn` event with the exact token ids
and log-probabilities the policy sampled; recording never fails or holds a response, and what it loses is counted."""

from __future__ import annotations

import time
from typing import Any

import pytest
import ray

from tests.workers.serving.helpers import MODEL_NAME, SIM_KEY, ServingHarness, StubControlPlane
from workers.events import EVENT
from workers.models.base import encode_chat
from workers.models.registry import TINY_LLAMA, load_tokenizer, resolve_base_model
from workers.serving.recorder import Recorder, Shipper


def _turns_of(plane: StubControlPlane, session: str, count: int) -> list[dict[str, Any]]:
    plane.wait_for(lambda: len([t for t in plane.turns() if t["session_id"] == session]) >= count)
    turns = [t for t in plane.turns() if t["session_id"] == session]
    return sorted(turns, key=lambda t: t["turn"]["turn_index"])


def test_every_completion_is_recorded_with_its_token_ids_and_logprobs_aligned(
    serving: ServingHarness, plane: StubControlPlane
) -> None:
    client = serving.openai_client()
    first = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    headers = {"X-Session-Id": "rec-1", "X-Task-Type": "coding"}
    whole = client.chat.completions.create(
        model=MODEL_NAME,
        messages=first,
        max_tokens=8,
        logprobs=True,
        extra_headers={**headers, "X-Turn-Index": "0"},
    )
    second = [
        *first,
        {"role": "assistant", "content": whole.choices[0].message.content},
        {"role": "user", "content": "Another."},
    ]
    chunks = list(
        client.chat.completions.create(
            model=MODEL_NAME,
            messages=second,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={**headers, "X-Turn-Index": "1"},
        )
    )
    streamed_text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    tokenizer = load_tokenizer(resolve_base_model(TINY_LLAMA))
    events = _turns_of(plane, "rec-1", 2)
    for event in events:
        EVENT.validate_python({"seq": 1, **event})  # a valid SessionTurnEvent, as the control plane will check
        assert event["task_type"] == "coding" and event["token_id"] == 5
        turn = event["turn"]
        assert len(turn["completion_token_ids"]) == len(turn["logprobs"]) >= 1
        assert (
            turn["arm"] == ""
            and turn["latency_ms"] > 0
            and turn["deployment_id"] == serving.plane.target["arms"][0]["deployment_id"]
        )
        # The prompt ids are the chat template over the messages as sent (no tools here).
        assert turn["prompt_token_ids"] == encode_chat(tokenizer, turn["messages"])
        assert turn["response"]["content"] == tokenizer.decode(turn["completion_token_ids"], skip_special_tokens=True)

    one, two = events
    assert one["turn"]["request_id"] == whole.id and one["turn"]["messages"] == first
    assert one["turn"]["policy_version"] == whole.model_extra["policy_version"]
    assert one["turn"]["logprobs"] == pytest.approx([lp.logprob for lp in whole.choices[0].logprobs.content])
    assert len(one["turn"]["completion_token_ids"]) == whole.usage.completion_tokens
    assert len(one["turn"]["prompt_token_ids"]) == whole.usage.prompt_tokens
    assert one["turn"]["finish_reason"] == whole.choices[0].finish_reason
    assert two["turn"]["request_id"] == chunks[0].id and two["turn"]["response"]["content"] == streamed_text
    assert len(two["turn"]["completion_token_ids"]) == chunks[-1].usage.completion_tokens


def test_without_a_turn_index_the_server_counts_turns_and_a_simulator_has_no_token_id(
    serving: ServingHarness, plane: StubControlPlane
) -> None:
    client = serving.openai_client(SIM_KEY)
    for _ in range(2):
        client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2,
            metadata={"session_id": "rec-2", "task_type": "chat"},
        )
    one, two = _turns_of(plane, "rec-2", 2)
    assert [one["turn"]["turn_index"], two["turn"]["turn_index"]] == [0, 1]
    assert one["token_id"] is None and one["task_type"] == "chat"


def test_an_ingest_outage_neither_fails_nor_holds_a_response_and_the_turn_arrives_later(
    serving: ServingHarness, plane: StubControlPlane
) -> None:
    plane.fail_ingest = True
    try:
        completion = serving.openai_client().chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2,
            extra_headers={"X-Session-Id": "rec-outage"},
        )
        assert completion.choices[0].message.content is not None
        time.sleep(0.5)
        assert not [t for t in plane.turns() if t["session_id"] == "rec-outage"]
    finally:
        plane.fail_ingest = False
    [event] = _turns_of(plane, "rec-outage", 1)
    assert event["turn"]["request_id"] == completion.id


def test_serving_metrics_are_reported_at_an_interval(serving: ServingHarness, plane: StubControlPlane) -> None:
    serving.openai_client().chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )

    def reported() -> list[dict[str, float]]:
        return [m["values"] for m in plane.metrics() if "serve/latency_p50_ms" in m["values"]]

    plane.wait_for(lambda: bool(reported()))
    values = reported()[-1]
    assert values["serve/requests"] >= 1 and values["serve/requests_total"] >= values["serve/requests"]
    assert values["serve/latency_p95_ms"] >= values["serve/latency_p50_ms"] > 0
    assert values["serve/tokens_per_second"] > 0 and "serve/record_failures" in values
    plane.wait_for(lambda: any(m["values"].get("serve/recorded_turns", 0) >= 1 for m in plane.metrics()))


def _turn(**overrides: Any) -> dict[str, Any]:
    turn = {
        "turn_index": 0,
        "request_id": "chatcmpl-x",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [],
        "response": {"role": "assistant", "content": "yo"},
        "prompt_token_ids": [1, 2],
        "completion_token_ids": [3, 4],
        "logprobs": [-0.1, -0.2],
        "policy_version": 0,
        "deployment_id": None,
        "arm": "",
        "latency_ms": 5.0,
        "finish_reason": "stop",
        "created_at": time.time(),
        **overrides,
    }
    return {"session_id": "s-unit", "task_type": "", "token_id": None, "turn": turn}


def test_a_turn_the_recorder_cannot_record_is_counted_and_reported(ray_local: None, plane: StubControlPlane) -> None:
    recorder = ray.remote(Recorder).remote(
        ingest_url=plane.ingest_url, token=plane.token, metrics_seconds=3600, spool=False
    )
    try:
        misaligned = _turn(request_id="chatcmpl-bad", logprobs=[-0.1])
        assert ray.get(recorder.submit.remote([_turn(), misaligned], [(5.0, 2, 2), (6.0, 2, 1)], {"http_4xx": 2})) == 1
        values = ray.get(recorder.flush_metrics.remote())
        assert values["serve/record_failures"] == 1.0 and values["serve/recorded_turns"] == 1.0
        assert values["serve/requests"] == 2.0 and values["serve/http_4xx"] == 2.0
        assert values["serve/latency_p50_ms"] == pytest.approx(5.5)
    finally:
        totals = ray.get(recorder.close.remote())
    assert totals["record_failures"] == 1
    assert [e["turn"]["request_id"] for e in plane.turns() if e["session_id"] == "s-unit"] == ["chatcmpl-x"]


def test_a_shipper_counts_the_turns_that_never_reached_the_recorder(ray_local: None) -> None:
    def unreachable() -> Any:
        raise ValueError("no recorder")

    shipper = Shipper(unreachable, interval=3600)
    shipper.turn(_turn())
    shipper.ship()
    assert shipper.failures == 1

    @ray.remote
    class Gone:
        def submit(self, *args: Any) -> int:
            raise RuntimeError("the recorder crashed")

    gone = Gone.remote()  # type: ignore[attr-defined]
    dead = Shipper(lambda: gone, interval=3600)
    dead.turn(_turn())
    dead.turn(_turn())
    dead.close(timeout=30)
    assert dead.failures == 2
