"""One simulated session: a user asks the served agent to do a repository task, through the `openai` client.

The coding harness runs client-side (`CodingAgentEnv`, as an editor plug-in runs tools on the user's machine): each
completion's tool calls run in the environment's workspace and sandbox, their results go back as `tool` messages,
until the agent finishes, replies without a tool call, or reaches `max_turns`. The environment then runs the task's
hidden tests on the final workspace, and the user posts feedback derived from them (`workers.simulator.users`).

Every request carries `X-Session-Id` (a fresh uuid4 per session), `X-Turn-Index` (0, 1, ...) and `X-Task-Type` (the
task's family, else "repo_task"). A serving error (a 4xx or 5xx answer, a timeout, no connection) ends the session
with its error and no feedback; 401 and 403 raise `ServingRefused`, which stops the whole simulation.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import openai

from workers.coding.environment import CodingAgentEnv
from workers.envs.base import Task
from workers.session_records import FeedbackIn
from workers.simulator.feedback import FeedbackFailed, FeedbackPoster
from workers.simulator.harness import WireCall, encode_reply, observation_messages, openai_tools, request_messages
from workers.simulator.users import asks_question, verdict

TASK_TYPE_DEFAULT = "repo_task"


class ServingRefused(RuntimeError):
    """The serving endpoint refused the simulator's key (401/403): every session would fail the same way."""


@dataclass(frozen=True)
class SessionPlan:
    """Everything decided about a session before it starts (seeded: `workers.simulator.users`)."""

    index: int
    task: Task
    task_type: str
    user: int
    tolerates_questions: bool
    flipped: bool
    session_id: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass
class FeedbackPosted:
    event_id: str
    signal: str
    value: float | None
    turn_index: int | None
    status: str  # created | duplicate | failed: <why>


@dataclass
class SessionResult:
    """A played session: one row of the simulation's table (`row()`), and the environment's record of it."""

    index: int
    session_id: str
    task_id: str
    task_type: str
    user: int
    tolerates_questions: bool
    flipped: bool
    turns: int = 0
    finish_reason: str | None = None
    tests_passed: float | None = None
    resolved: bool | None = None
    edited_files: list[str] = field(default_factory=list)
    asked_question: bool = False
    signal: str | None = None
    tolerated_question: bool = False
    feedback: list[FeedbackPosted] = field(default_factory=list)
    policy_versions: list[int] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)
    error: str | None = None
    stopped: bool = False
    started_at: float = 0.0
    ended_at: float = 0.0
    trajectory: dict[str, Any] | None = None

    @property
    def latency_ms_p50(self) -> float | None:
        return float(statistics.median(self.latency_ms)) if self.latency_ms else None

    def row(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("trajectory")
        data["latency_ms"] = [round(ms, 2) for ms in self.latency_ms]
        data["latency_ms_p50"] = None if self.latency_ms_p50 is None else round(self.latency_ms_p50, 2)
        return data


def task_type_of(task: Task) -> str:
    """The task's family tag (`X-Task-Type`), else "repo_task"."""
    family = task.metadata.get("family")
    return family[:100] if isinstance(family, str) and family.strip() else TASK_TYPE_DEFAULT


@dataclass(frozen=True)
class Settings:
    """What a session needs of the simulation's spec."""

    model_name: str
    max_turns: int
    max_tokens: int
    temperature: float
    env_params: Mapping[str, Any] = field(default_factory=dict)


def make_env(settings: Settings) -> CodingAgentEnv:
    return CodingAgentEnv(**{**settings.env_params, "max_turns": settings.max_turns})


def _wire_calls(message: Any, turn: int) -> list[WireCall]:
    calls: list[WireCall] = []
    for k, call in enumerate(getattr(message, "tool_calls", None) or []):
        function = getattr(call, "function", None)
        name = str(getattr(function, "name", "") or getattr(call, "name", "") or "")
        arguments = getattr(function, "arguments", None)
        if arguments is None:
            arguments = getattr(call, "input", "")  # a custom tool call: passed on, the environment refuses it
        calls.append(
            WireCall(id=str(getattr(call, "id", "") or f"call_{turn}_{k}"), name=name, arguments=str(arguments or ""))
        )
    return calls


def _serving_error(exc: openai.APIStatusError) -> str:
    body = exc.body
    detail: Any = body
    if isinstance(body, dict):
        error = body.get("error", body)
        detail = error.get("message", error) if isinstance(error, dict) else error
    return f"serving answered {exc.status_code}: {str(detail)[:300]}"


def play_session(
    plan: SessionPlan,
    *,
    client: openai.OpenAI,
    settings: Settings,
    feedback: FeedbackPoster,
    stop: threading.Event,
) -> SessionResult:
    """Play one session and post its feedback. Raises `ServingRefused` on a 401/403 from the serving endpoint and
    `workers.simulator.feedback.FeedbackRefused` on one from the control plane; every other failure is the
    result's `error`."""
    result = SessionResult(
        index=plan.index,
        session_id=plan.session_id,
        task_id=plan.task.id,
        task_type=plan.task_type,
        user=plan.user,
        tolerates_questions=plan.tolerates_questions,
        flipped=plan.flipped,
        started_at=time.time(),
    )
    try:
        _converse(plan, result, client=client, settings=settings, stop=stop)
        if result.error is None and result.trajectory is not None:
            _give_feedback(plan, result, feedback)
    finally:
        result.ended_at = time.time()
    return result


def _converse(
    plan: SessionPlan, result: SessionResult, *, client: openai.OpenAI, settings: Settings, stop: threading.Event
) -> None:
    # One function on purpose: one simulated conversation, turn by turn, with the state each turn leaves for the next.
    env = make_env(settings)
    tools = openai_tools(env.tools)
    messages = request_messages(env.reset(plan.task), env.tools)
    headers = {"X-Session-Id": plan.session_id, "X-Task-Type": plan.task_type}
    while True:
        if stop.is_set():
            result.error, result.stopped = "stopped before it ended: the simulation was stopped", True
            return
        started = time.monotonic()
        try:
            completion = client.chat.completions.create(
                model=settings.model_name,
                messages=messages,  # type: ignore[arg-type]
                tools=tools,  # type: ignore[arg-type]
                max_tokens=settings.max_tokens,
                temperature=settings.temperature,
                extra_headers={**headers, "X-Turn-Index": str(result.turns)},
            )
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            raise ServingRefused(
                f"the serving endpoint refused the simulator's key ({_serving_error(exc)}); the simulate run's "
                "ingest token must be accepted by the serving run it targets (base_url)"
            ) from None
        except openai.APITimeoutError:
            result.error = f"serving timed out after {time.monotonic() - started:.1f} s (turn {result.turns})"
            return
        except openai.APIStatusError as exc:
            result.error = f"{_serving_error(exc)} (turn {result.turns})"
            return
        except openai.APIConnectionError as exc:
            result.error = f"serving unreachable: {exc} (turn {result.turns})"
            return
        result.latency_ms.append((time.monotonic() - started) * 1000.0)
        version = getattr(completion, "policy_version", None)
        if isinstance(version, int) and version not in result.policy_versions:
            result.policy_versions.append(version)
        if not completion.choices:
            result.error = f"serving answered without a choice (turn {result.turns})"
            return
        message = completion.choices[0].message
        reply = encode_reply(
            message.content,
            _wire_calls(message, result.turns),
            env.tools,
            max_calls_per_turn=env.max_calls_per_turn,
            turn=result.turns,
        )
        result.turns += 1
        step = env.step(reply.action_text)
        messages.append(reply.assistant_message)
        if step.done:
            break
        if env.view_changed:  # a self-summary rewrote the conversation: continue from the rewritten one
            messages = request_messages(env.messages, env.tools)
        elif step.observation is not None:
            messages.extend(observation_messages(step.observation.messages, reply.result_ids))
    record = env.trajectory(plan.session_id)
    record["session_id"] = plan.session_id
    result.trajectory = record
    result.finish_reason = record.get("finish_reason")
    result.edited_files = list(record.get("edited_files") or [])
    hidden = record.get("hidden_tests")
    if not isinstance(hidden, Mapping):
        result.error = str(record.get("error") or "the hidden tests did not run")
        return
    result.tests_passed = float(hidden.get("fraction", 0.0))
    result.resolved = bool(hidden.get("resolved"))
    final = record.get("answer") if result.finish_reason in ("finish", "final_reply") else None
    result.asked_question = asks_question(final, edited=bool(record.get("diff")))


def _give_feedback(plan: SessionPlan, result: SessionResult, poster: FeedbackPoster) -> None:
    assert result.resolved is not None and result.tests_passed is not None
    decided = verdict(
        resolved=result.resolved,
        fraction=result.tests_passed,
        asked=result.asked_question,
        flipped=plan.flipped,
        tolerates=plan.tolerates_questions,
    )
    result.signal = decided.signal.value
    result.tolerated_question = decided.tolerated_question
    last_turn = max(0, result.turns - 1)
    events = [
        FeedbackIn(
            event_id=f"sim-{plan.session_id}-tests",
            signal=decided.tests_signal,
            value=decided.tests_value,
            turn_index=last_turn,
        ),
        FeedbackIn(event_id=f"sim-{plan.session_id}-verdict", signal=decided.signal, turn_index=last_turn),
    ]
    for event in events:
        status: str
        try:
            status = poster.post(plan.session_id, event)
        except FeedbackFailed as exc:
            status = f"failed: {exc}"
            result.error = result.error or f"feedback: {exc}"
        result.feedback.append(
            FeedbackPosted(
                event_id=event.event_id,
                signal=event.signal.value,
                value=event.value,
                turn_index=event.turn_index,
                status=status,
            )
        )
