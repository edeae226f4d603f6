"""Stored agent trajectories: the JSONL record format and a line-accurate parser for uploads.

One trajectory is one JSON object on one line. The fields carry what the Context-1 rewards (docs/methods.md
section 3) need: the final answer and output doc ids, the gold references, every doc id seen anywhere in the
full unpruned trajectory (pruning hides chunks from the model but not from the reward) and the turns, whose
tool sequence feeds the prune and turn penalties.

Coding-agent episodes (the `coding_agent` environment, issue 17) add optional fields for Composer 2's rewards
(docs/methods.md section 2): the hidden-test report, the final diff and which files changed and how, the length
statistics the C4 penalty weighs, and the self-summarisation chain (C3): each summary and the tokens of each
segment. Records of other environments leave them out.

Served sessions (real-time RL, `workers.realtime.samples.session_to_trajectory`) add the users' `feedback` and
`session_turns`, the client's turn index of each served completion in order, which the `session_feedback` reward
term reads; other records leave them empty.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from workers.session_records import SIGNALS

ASSISTANT_ROLE = "assistant"


class Turn(BaseModel):
    """One message of a trajectory.

    A tool call is an assistant turn with `tool` set (and its arguments in `args`); the tool's result is a
    separate turn (role "tool" by convention) and is not counted as a call, so logging the result with the
    same `tool` name does not double-count it.
    """

    model_config = ConfigDict(extra="ignore")

    role: str = Field(min_length=1)
    content: str = ""
    tool: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    continues: bool = Field(
        default=False,
        description="An assistant turn that is the 2nd, 3rd, ... tool call of the same reply (the environments "
        "write one assistant turn per call); it is not another turn of the model",
    )


class HiddenTestReport(BaseModel):
    """The hidden tests' verdict on a coding episode's final workspace (run after `finish`, never shown to the
    policy). `outcomes` maps each test id to "passed", "failed", "error" or "missing"; `fraction` is the share of
    every hidden test (fail_to_pass and pass_to_pass) that passed, and `resolved` whether all did."""

    model_config = ConfigDict(extra="ignore")

    outcomes: dict[str, str] = Field(default_factory=dict)
    fail_to_pass_passed: int = Field(default=0, ge=0)
    fail_to_pass_total: int = Field(default=0, ge=0)
    pass_to_pass_passed: int = Field(default=0, ge=0)
    pass_to_pass_total: int = Field(default=0, ge=0)
    fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    resolved: bool = False
    detail: str = ""
    seconds: float | None = Field(default=None, ge=0.0)


class LengthStats(BaseModel):
    """What a coding episode spent, in tokens of the policy's tokenizer (a 4-characters-per-token estimate when
    none was bound) and in counts: the inputs of the C4 length penalty (docs/methods.md C4).

    `thinking_tokens`: reply text outside tool-call blocks, in every reply but the final one (and not in
    summaries); `tool_call_tokens`: the tool-call blocks; `tool_output_tokens`: the environment's tool messages;
    `final_message_tokens`: the final reply's text (and the `finish` message); `summary_tokens`: the replies
    given as self-summaries (C3); `tool_calls`: well-formed calls run; `turns`: replies, summaries included."""

    model_config = ConfigDict(extra="ignore")

    thinking_tokens: int = Field(default=0, ge=0)
    tool_call_tokens: int = Field(default=0, ge=0)
    tool_output_tokens: int = Field(default=0, ge=0)
    final_message_tokens: int = Field(default=0, ge=0)
    summary_tokens: int = Field(default=0, ge=0)
    tool_calls: int = Field(default=0, ge=0)
    turns: int = Field(default=0, ge=0)


class Summary(BaseModel):
    """One self-summary (docs/methods.md C3): the reply index (`turn`, 1-based, as `counts.turns` counts replies),
    its text and its length in tokens."""

    model_config = ConfigDict(extra="ignore")

    turn: int = Field(ge=0)
    text: str = ""
    tokens: int = Field(default=0, ge=0)


class FeedbackSignal(BaseModel):
    """One signal a user gave about a served session (`workers.session_records.FeedbackRecord`, read leniently:
    only what the reward needs is required). `turn_index` is the client's index of the turn it is about; None: the
    whole session. `value`: thumbs +1 or -1; tests_passed / tests_failed the fraction of tests that passed / that
    failed (optional); none for the other signals."""

    model_config = ConfigDict(extra="ignore")

    signal: str
    value: float | None = None
    turn_index: int | None = Field(default=None, ge=0)
    event_id: str = ""
    text: str = ""
    created_at: float | None = None

    @field_validator("signal")
    @classmethod
    def _known_signal(cls, value: str) -> str:
        if value not in SIGNALS:
            raise ValueError(f"unknown signal {value!r}; use one of: {', '.join(SIGNALS)}")
        return value

    @model_validator(mode="after")
    def _value_fits_signal(self) -> FeedbackSignal:
        if self.value is not None and not math.isfinite(self.value):
            raise ValueError("value must be a finite number")
        if self.signal == "thumbs" and self.value not in (1.0, -1.0):
            raise ValueError("value: thumbs takes value +1 (up) or -1 (down)")
        if self.signal in ("tests_passed", "tests_failed") and self.value is not None and not 0 <= self.value <= 1:
            raise ValueError(f"value: {self.signal} takes an optional fraction of tests in [0, 1]")
        return self


class Trajectory(BaseModel):
    """One stored trajectory (one JSONL line). Unknown fields are ignored so producers may add their own."""

    model_config = ConfigDict(extra="ignore")

    id: str = Field(min_length=1, description="Unique within an upload")
    task_id: str = ""
    answer: str | None = Field(default=None, description="Final answer text")
    gold_answers: list[str] = Field(default_factory=list)
    output_doc_ids: list[str] = Field(default_factory=list, description="Doc/chunk ids in the final output")
    gold_doc_ids: list[str] = Field(default_factory=list, description="Target docs")
    seen_doc_ids: list[str] = Field(
        default_factory=list, description="Every doc id encountered anywhere in the full, unpruned trajectory"
    )
    answer_doc_ids: list[str] = Field(default_factory=list, description="Chunks that directly contain the answer")
    tests_passed: float | None = Field(
        default=None, ge=0.0, le=1.0, description="Coding: fraction of the task's tests the final code passed"
    )
    hidden_tests: HiddenTestReport | None = Field(
        default=None, description="Coding agent: the hidden tests' report on the final workspace"
    )
    diff: str | None = Field(default=None, description="Coding agent: the final workspace's unified diff")
    edited_files: list[str] = Field(
        default_factory=list, description="Coding agent: paths the final diff changes, created or deletes"
    )
    files_edited_by_run: list[str] = Field(
        default_factory=list,
        description="Coding agent: paths changed by `run` commands (sed -i, echo >, ...) rather than the edit tool",
    )
    length_stats: LengthStats | None = Field(default=None, description="Coding agent: the C4 penalty's inputs")
    summaries: list[Summary] = Field(default_factory=list, description="Self-summaries of the chain (C3)")
    segments: list[int] = Field(
        default_factory=list, description="Tokens of each segment of a self-summarised chain (one when none)"
    )
    turns: list[Turn] = Field(default_factory=list)
    error: str | None = Field(default=None, description="Set when the trajectory did not complete")
    feedback: list[FeedbackSignal] = Field(
        default_factory=list, description="Served sessions: the users' feedback signals (session_feedback term)"
    )
    gold_table: dict[str, Any] | None = Field(
        default=None, description="Wide-search tasks: the reference table (workers.rewards.table.GoldTable's JSON)"
    )
    swarm: dict[str, Any] | None = Field(
        default=None,
        description="Agent swarm episodes: agents, sub-agent runs with their conversations, stages, critical steps",
    )
    judgements: dict[str, Any] = Field(
        default_factory=dict,
        description="Rubric judgements by reward term name (workers.rewards.judge): scores, the judge's text, key",
    )
    session_turns: list[int] = Field(
        default_factory=list,
        description="Served sessions: the client's turn index of each served completion, in order (feedback names "
        "its turn by this index)",
    )

    @field_validator("error")
    @classmethod
    def _blank_error_is_none(cls, value: str | None) -> str | None:
        # Writers often emit "error": "" for success; only a non-blank message marks a failed trajectory,
        # because that flag decides whether the reward floor applies (docs/methods.md X2).
        if value is None or not value.strip():
            return None
        return value

    @property
    def num_turns(self) -> int:
        """The model's turns: its replies, counted as `max_turns` and the `env/turns` metric count them (the
        `turns` of docs/methods.md X5). A reply that made k tool calls is one turn, though it is stored as k assistant
        turns (the 2nd to k-th marked `continues`)."""
        return sum(1 for turn in self.turns if turn.role == ASSISTANT_ROLE and not turn.continues)

    @property
    def tool_calls(self) -> list[str]:
        """Tool names of the assistant's tool calls, in call order."""
        return [turn.tool for turn in self.turns if turn.role == ASSISTANT_ROLE and turn.tool]


@dataclass(frozen=True)
class LineError:
    """A rejected JSONL line: `line` is 1-based, `message` names the offending field where there is one."""

    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass
class ParseResult:
    """Outcome of parsing a JSONL upload.

    `row_count` counts non-blank lines; `errors` holds at most `max_errors` entries while `error_count` counts
    every bad line, so a report can say "showing 50 of 1,203 errors".
    """

    trajectories: list[Trajectory] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)
    row_count: int = 0
    error_count: int = 0

    @property
    def ok(self) -> bool:
        return self.error_count == 0


def _loc_to_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def describe_validation_error(exc: ValidationError) -> str:
    """A pydantic error as one line naming each offending field ("field 'turns[0].role': ...; ...")."""
    return _describe_validation_error(exc)


def _describe_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        path = _loc_to_path(tuple(err["loc"]))
        parts.append(f"field '{path}': {err['msg']}" if path else str(err["msg"]))
    return "; ".join(parts)


def _json_type_name(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "null"


def parse_trajectories_jsonl(
    data: bytes,
    *,
    max_errors: int = 50,
    convert: Callable[[dict[str, Any]], Trajectory | None] | None = None,
) -> ParseResult:
    """Parse JSONL bytes (one trajectory object per line, UTF-8) into validated trajectories.

    Blank lines are skipped. A line that is not UTF-8, not valid JSON, not a JSON object, fails the
    `Trajectory` schema or repeats an earlier `id` is reported with its 1-based line number and left out;
    the remaining lines are still parsed. Only the first `max_errors` errors are kept (`error_count` has the
    total). Lines may end in "\\n" or "\\r\\n"; a UTF-8 byte-order mark on the first line is ignored.

    `convert` reads rows of another format: given each JSON object it returns the trajectory the row stands for,
    or None for a plain trajectory row. A `ValidationError` or `ValueError` it raises is that line's error (the
    re-scoring job reads served sessions, `"format": "session/v1"`, this way).
    """
    result = ParseResult()
    first_seen: dict[str, int] = {}

    def fail(line_no: int, message: str) -> None:
        result.error_count += 1
        if len(result.errors) < max_errors:
            result.errors.append(LineError(line_no, message))

    for index, raw in enumerate(data.split(b"\n")):
        line_no = index + 1
        if index == 0 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        if not raw.strip():
            continue
        result.row_count += 1
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            fail(line_no, f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); save as UTF-8")
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            fail(line_no, f"invalid JSON: {exc.msg} (column {exc.colno})")
            continue
        if not isinstance(obj, dict):
            fail(line_no, f"expected a JSON object, got {_json_type_name(obj)}")
            continue
        try:
            converted = convert(obj) if convert is not None else None
            trajectory = converted if converted is not None else Trajectory.model_validate(obj)
        except ValidationError as exc:
            fail(line_no, _describe_validation_error(exc))
            continue
        except ValueError as exc:
            fail(line_no, str(exc))
            continue
        if trajectory.id in first_seen:
            fail(line_no, f"field 'id': duplicate id {trajectory.id!r} (first on line {first_seen[trajectory.id]})")
            continue
        first_seen[trajectory.id] = line_no
        result.trajectories.append(trajectory)
    return result


def trajectory_jsonl_example() -> str:
    """Two example JSONL lines: a completed Context-1 search and one that failed (`error` set)."""
    completed = {
        "id": "traj-0001",
        "task_id": "web-0042",
        "answer": "Ada Lovelace",
        "gold_answers": ["Ada Lovelace", "Augusta Ada King"],
        "output_doc_ids": ["doc-7#3", "doc-9#1"],
        "gold_doc_ids": ["doc-7#3", "doc-12#0"],
        "seen_doc_ids": ["doc-7#3", "doc-9#1", "doc-12#0", "doc-15#2"],
        "answer_doc_ids": ["doc-7#3"],
        "turns": [
            {"role": "user", "content": "Who wrote the first published algorithm for the Analytical Engine?"},
            {"role": "assistant", "tool": "search_corpus", "args": {"query": "first algorithm Analytical Engine"}},
            {"role": "tool", "tool": "search_corpus", "content": "[doc-7#3] ... [doc-12#0] ..."},
            {"role": "assistant", "tool": "prune_chunks", "args": {"chunk_ids": ["doc-15#2"]}},
            {"role": "tool", "tool": "prune_chunks", "content": "pruned 1 chunk"},
            {"role": "assistant", "content": "<Document id=doc-7#3><Justification>...</Justification></Document>"},
        ],
    }
    failed = {
        "id": "traj-0002",
        "task_id": "web-0042",
        "turns": [{"role": "assistant", "tool": "grep_corpus", "args": {"pattern": "Lovelace"}}],
        "error": "environment timeout after 120 s",
    }
    return json.dumps(completed) + "\n" + json.dumps(failed) + "\n"
