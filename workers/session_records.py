"""Served sessions and their feedback, as every side of the real-time loop reads and writes them.

- `TurnRecord`: one chat completion the serving endpoint produced: the request's messages, the reply (with its
  tool calls), the exact prompt and completion token ids the policy saw and sampled with their log-probabilities,
  the policy version (the checkpoint id; 0 for a base model), latency and the client's session id and turn index.
- `FeedbackRecord`: one typed signal a client posted about a session (`POST /api/v1/sessions/{id}/feedback`),
  idempotent by the client's `event_id`.
- `SessionRecord`: a session frozen into a dataset version by a cycle's collect phase: one JSON object per line,
  `"format": "session/v1"`.

Signals (`Signal`), and the value each carries:

| signal | value | meaning |
| --- | --- | --- |
| edit_kept | none | the user kept the agent's edit |
| edit_reverted | none | the user reverted it |
| dissatisfied_followup | none | the next message shows the user was not satisfied (Cursor's "dissatisfied follow-up") |
| accepted / rejected | none | the user accepted or rejected a proposed change |
| thumbs | +1 or -1 | explicit rating |
| tests_passed / tests_failed | optional fraction in [0, 1] that passed / that failed | the tests after the edit |
| text | none (`text` holds it) | free text; no reward of its own |
"""

from __future__ import annotations

import enum
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SESSION_FORMAT: Final = "session/v1"
SESSION_ID_MAX = 200
EVENT_ID_MAX = 200


class Signal(enum.StrEnum):
    EDIT_KEPT = "edit_kept"
    EDIT_REVERTED = "edit_reverted"
    DISSATISFIED_FOLLOWUP = "dissatisfied_followup"
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    THUMBS = "thumbs"
    TESTS_PASSED = "tests_passed"
    TESTS_FAILED = "tests_failed"
    TEXT = "text"


SIGNALS: tuple[str, ...] = tuple(s.value for s in Signal)


class FeedbackIn(BaseModel):
    """The body of `POST /api/v1/sessions/{session_id}/feedback` (one signal per request)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    event_id: str = Field(
        min_length=1, max_length=EVENT_ID_MAX, description="The client's id for this event: a repeat is a no-op"
    )
    signal: Signal
    value: float | None = Field(
        default=None, description="thumbs: +1 or -1 (required); tests_passed/tests_failed: optional fraction in [0, 1]"
    )
    turn_index: int | None = Field(default=None, ge=0, description="The turn it is about; left out: the session")
    text: str = Field(default="", max_length=10_000, description="Free text (required for signal=text)")

    @model_validator(mode="after")
    def _value_fits_signal(self) -> FeedbackIn:
        if self.signal == Signal.THUMBS:
            if self.value not in (1.0, -1.0):
                raise ValueError("value: thumbs takes value +1 (up) or -1 (down)")
        elif self.signal in (Signal.TESTS_PASSED, Signal.TESTS_FAILED):
            if self.value is not None and not 0.0 <= self.value <= 1.0:
                raise ValueError(f"value: {self.signal.value} takes an optional fraction of tests in [0, 1]")
        elif self.value is not None:
            raise ValueError(f"value: {self.signal.value} carries no value; leave it out")
        if self.signal == Signal.TEXT and not self.text.strip():
            raise ValueError("text: signal=text needs the text")
        return self


class FeedbackRecord(FeedbackIn):
    created_at: float = Field(description="Unix seconds when the control plane accepted it")


class TurnRecord(BaseModel):
    """One completion. `prompt_token_ids + completion_token_ids` is exactly what the policy scored and sampled."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    turn_index: int = Field(ge=0)
    request_id: str = Field(min_length=1, max_length=100, description="The completion's id (chatcmpl-...)")
    messages: list[dict[str, Any]] = Field(description="The request's messages, as the client sent them")
    tools: list[dict[str, Any]] = Field(default_factory=list, description="The request's tools (OpenAI schema)")
    response: dict[str, Any] = Field(description="The assistant message returned: role, content, tool_calls")
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float]
    policy_version: int = Field(ge=0, description="Checkpoint id of the weights that sampled it; 0: the base model")
    deployment_id: int | None = None
    arm: str = Field(default="", max_length=16, description="A/B arm that served it ('' when one deployment)")
    latency_ms: float = Field(ge=0)
    finish_reason: Literal["stop", "length", "tool_calls"]
    created_at: float = Field(description="Unix seconds when the completion finished")

    @model_validator(mode="after")
    def _aligned(self) -> TurnRecord:
        if len(self.logprobs) != len(self.completion_token_ids):
            raise ValueError(
                f"logprobs has {len(self.logprobs)} values for {len(self.completion_token_ids)} completion tokens"
            )
        return self


class SessionRecord(BaseModel):
    """A session as a cycle's collect phase froze it (one line of a `session/v1` dataset version)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    format: Literal["session/v1"] = "session/v1"
    session_id: str = Field(min_length=1, max_length=SESSION_ID_MAX)
    serve_run_id: int
    task_type: str = Field(default="", max_length=100, description="Client-declared kind of work (baseline groups)")
    turns: list[TurnRecord] = Field(min_length=1)
    feedback: list[FeedbackRecord] = Field(default_factory=list)
    started_at: float
    ended_at: float
