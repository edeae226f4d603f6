"""Session records for the real-time RL tests, built as the serving job records them."""

from __future__ import annotations

from typing import Any

from workers.session_records import FeedbackRecord, SessionRecord, TurnRecord


def turn(
    index: int,
    *,
    messages: list[dict[str, Any]] | None = None,
    content: str = "done",
    tool_calls: list[dict[str, Any]] | None = None,
    prompt: list[int] | None = None,
    completion: list[int] | None = None,
    logprobs: list[float] | None = None,
    policy_version: int = 0,
    created_at: float | None = None,
    finish_reason: str = "stop",
) -> TurnRecord:
    completion = [11, 12, 13] if completion is None else completion
    response: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        response["tool_calls"] = tool_calls
    return TurnRecord(
        turn_index=index,
        request_id=f"chatcmpl-{index}",
        messages=messages if messages is not None else [{"role": "user", "content": f"request {index}"}],
        response=response,
        prompt_token_ids=[1, 2, 3, 4] if prompt is None else prompt,
        completion_token_ids=completion,
        logprobs=[-1.0] * len(completion) if logprobs is None else logprobs,
        policy_version=policy_version,
        latency_ms=10.0,
        finish_reason=finish_reason,  # type: ignore[arg-type]
        created_at=1000.0 + index if created_at is None else created_at,
    )


def feedback(signal: str, *, value: float | None = None, turn_index: int | None = None, n: int = 0) -> FeedbackRecord:
    return FeedbackRecord(
        event_id=f"{signal}-{turn_index}-{n}",
        signal=signal,  # type: ignore[arg-type]
        value=value,
        turn_index=turn_index,
        text="a note" if signal == "text" else "",
        created_at=2000.0,
    )


def session(
    session_id: str = "s1",
    *,
    turns: list[TurnRecord] | None = None,
    signals: list[FeedbackRecord] | None = None,
    task_type: str = "",
    serve_run_id: int = 7,
) -> SessionRecord:
    return SessionRecord(
        session_id=session_id,
        serve_run_id=serve_run_id,
        task_type=task_type,
        turns=turns if turns is not None else [turn(0)],
        feedback=signals or [],
        started_at=1000.0,
        ended_at=1100.0,
    )
