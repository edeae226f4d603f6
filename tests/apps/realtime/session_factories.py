"""Serving runs, session turns and feedback for the real-time tests, made through the services and the ingest path
the serving job uses."""

from __future__ import annotations

import itertools
import time
from typing import Any

from apps.accounts.models import User
from apps.realtime.services.serving import serve_launch
from apps.runs.models import Run
from apps.runs.services import ingest_batch
from workers.events import EVENTS_LIST

TINY = "tiny-llama-smollm2-tokenizer"
_seq = itertools.count(1)


def serve_run(owner: User, **kwargs: Any) -> Run:
    """A serving run of the tiny model (its dispatch waits for a commit that never comes in these tests)."""
    return serve_launch(
        user=owner,
        model_name=kwargs.pop("model_name", "crucible-tiny"),
        base_model=kwargs.pop("base_model", TINY),
        **kwargs,
    )


def turn_event(
    session_id: str,
    turn_index: int = 0,
    *,
    seq: int | None = None,
    request_id: str | None = None,
    policy_version: int = 0,
    latency_ms: float = 100.0,
    arm: str = "",
    deployment_id: int | None = None,
    created_at: float | None = None,
    task_type: str = "",
    token_id: int | None = None,
    completion: list[int] | None = None,
    content: str = "ok",
    tool_calls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    completion = completion if completion is not None else [5, 6, 7]
    response: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        response["tool_calls"] = tool_calls
    return {
        "seq": seq if seq is not None else next(_seq),
        "kind": "session_turn",
        "session_id": session_id,
        "task_type": task_type,
        "token_id": token_id,
        "turn": {
            "turn_index": turn_index,
            "request_id": request_id or f"chatcmpl-{session_id}-{turn_index}",
            "messages": [{"role": "user", "content": f"turn {turn_index} of {session_id}"}],
            "tools": [],
            "response": response,
            "prompt_token_ids": [1, 2, 3, 4],
            "completion_token_ids": completion,
            "logprobs": [-0.5] * len(completion),
            "policy_version": policy_version,
            "deployment_id": deployment_id,
            "arm": arm,
            "latency_ms": latency_ms,
            "finish_reason": "stop",
            "created_at": created_at if created_at is not None else time.time(),
        },
    }


def ingest(run: Run, events: list[dict[str, Any]]) -> Any:
    """Store events as the ingest endpoint would (in this thread, inside the test's transaction)."""
    return ingest_batch(run_id=run.pk, events=EVENTS_LIST.validate_python(events), publish=False)
