"""Recorded sessions as trajectories (to score them) and as training samples (to learn from them).

- `session_to_trajectory`: a `SessionRecord` as a `Trajectory`, so every reward term and detector reads it: the
  conversation as turns (one assistant turn per tool call, as the tool-use environments record them), the C4
  length statistics, the users' feedback and the client's turn indices. The re-scoring job reads `session/v1` rows
  through it (`trajectory_from_row`).
- `session_samples`: one training sample per served turn, exactly as it was served (the prompt and completion
  token ids, the recorded log-probabilities as the behaviour policy), with its reward from the session reward
  (`workers.realtime.reward.score_session`) and an advantage from a baseline.

Baselines. Sessions have no groups of G completions of one prompt, so the GRPO group mean is not available
(docs/methods.md section 2, "Real-time RL"). The advantage of turn i is A_i = r_i − b_i with b_i:

- `batch_mean`: the mean reward of every turn trained on in this update (the whole collected batch, not each
  optimizer step's share of it);
- `task_type_mean`: the mean over the turns of sessions of the same `task_type` (the client-declared kind of
  work), or the batch mean for a type with a single turn (its own mean would zero its advantage);
- `none`: b_i = 0 (the raw reward; REINFORCE).

Advantages are not divided by a standard deviation: Composer 2 removes GRPO's std scaling (docs/methods.md C1), which
upweights small differences when rewards barely vary, and a session batch mixes kinds of work whose reward spreads
differ. The reward scale is the reward config's (±1 per verdict by default).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from workers.envs.toolcalls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from workers.realtime.reward import score_session
from workers.rewards.schema import RewardSpec, validate_reward_spec
from workers.rl.rollout import Sample
from workers.session_records import SESSION_FORMAT, SessionRecord, TurnRecord
from workers.trajectories import FeedbackSignal, LengthStats, Trajectory, Turn, describe_validation_error

Baseline = Literal["batch_mean", "task_type_mean", "none"]
BASELINES: tuple[str, ...] = ("batch_mean", "task_type_mean", "none")

TRAJECTORY_ID_MAX = 200
"""The longest trajectory id the ingest accepts (`workers.events.TrajectoryEvent`)."""

CHARS_PER_TOKEN = 4
"""Tool output is measured in characters (the policy never sampled it, so no token ids were recorded), at about
four characters per token, as `workers.trajectories.LengthStats` estimates without a tokenizer."""

MALFORMED_CALL_NOTE = "error: malformed tool call left in the reply (the server could not parse it)"


# --- sessions as trajectories ------------------------------------------------------------------------------------


def session_trajectory_id(record: SessionRecord) -> str:
    """`<session id>@<serve run id>`: a client may reuse a session id on another serving run. An id longer than
    the ingest allows keeps the session id's first characters and a hash of the whole."""
    full = f"{record.session_id}@{record.serve_run_id}"
    if len(full) <= TRAJECTORY_ID_MAX:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:16]
    return f"{full[: TRAJECTORY_ID_MAX - len(digest) - 1]}~{digest}"


def ordered_turns(record: SessionRecord) -> list[TurnRecord]:
    """The session's turns by the client's turn index (then by when they finished)."""
    return sorted(record.turns, key=lambda turn: (turn.turn_index, turn.created_at))


def _text(content: Any) -> str:
    """A message's text: a string, or the text parts of an OpenAI content-part list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", "")) for part in content if isinstance(part, dict) and part.get("type") == "text"
        )
    return str(content)


def _call_name_and_args(call: Any) -> tuple[str, dict[str, Any], str]:
    """(name, arguments, arguments as sent) of an OpenAI tool call; arguments that are no JSON object are kept
    as {"raw": text}."""
    function = call.get("function") if isinstance(call, dict) else None
    function = function if isinstance(function, dict) else {}
    name = str(function.get("name") or "")
    raw = function.get("arguments", "")
    if isinstance(raw, dict):
        return name, raw, json.dumps(raw)
    raw_text = str(raw or "")
    try:
        parsed = json.loads(raw_text) if raw_text else {}
    except json.JSONDecodeError:
        parsed = None
    return name, parsed if isinstance(parsed, dict) else {"raw": raw_text}, raw_text


def _new_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request's messages the policy had not answered yet: those after its last assistant message (the
    history before it is already in the trajectory), or all of them."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    return messages[last + 1 :]


def malformed_calls_in(content: str) -> int:
    """Tool-call blocks left in a reply's text: the server puts the calls it parsed in `tool_calls` and leaves a
    block it could not parse in the content (an unclosed tag and a stray closing tag count as one each)."""
    return max(content.count(TOOL_CALL_OPEN), content.count(TOOL_CALL_CLOSE))


def session_to_trajectory(record: SessionRecord) -> Trajectory:
    """A served session as a `Trajectory` (module docstring).

    Turns: the messages each request added since the policy's last reply (system, user, and the client's tool
    results, whose tool name comes from the call they answer), then the reply: one assistant turn for a reply
    without tool calls, one per call otherwise (the first holds the reply's text). A reply that left a tool-call
    block unparsed is followed by an "error: ..." tool turn without a tool name, which the broken_tool_calls term
    counts as malformed.

    Length statistics (C4): each reply's completion tokens are split between its text and its tool calls in
    proportion to their characters; the text of the last reply is the final message, that of the others
    thinking; tool output is estimated at `CHARS_PER_TOKEN` characters per token; `tool_calls` counts the calls
    and `turns` the replies.
    """
    # One function on purpose: one pass over a session's requests, each turn built from the state the turns before it
    # left.
    turns: list[Turn] = []
    call_names: dict[str, str] = {}
    served = ordered_turns(record)
    thinking = final = call_tokens = output_tokens = calls = 0
    for position, turn in enumerate(served):
        for message in _new_messages(turn.messages):
            role = str(message.get("role") or "user")
            text = _text(message.get("content"))
            if role == "tool":
                name = message.get("name") or call_names.get(str(message.get("tool_call_id", "")))
                turns.append(Turn(role="tool", content=text, tool=str(name) if name else None))
                output_tokens += math.ceil(len(text) / CHARS_PER_TOKEN)
            elif role != "assistant":
                turns.append(Turn(role=role, content=text))
        reply = _text(turn.response.get("content"))
        tool_calls = turn.response.get("tool_calls") or []
        if not isinstance(tool_calls, list):
            tool_calls = []
        call_chars = 0
        if not tool_calls:
            turns.append(Turn(role="assistant", content=reply))
        for index, call in enumerate(tool_calls):
            name, args, raw = _call_name_and_args(call)
            call_id = call.get("id") if isinstance(call, dict) else None
            if call_id:
                call_names[str(call_id)] = name
            turns.append(Turn(role="assistant", content=reply if index == 0 else "", tool=name or None, args=args))
            call_chars += len(TOOL_CALL_OPEN + TOOL_CALL_CLOSE) + len(json.dumps({"name": name})) + len(raw)
        for _ in range(malformed_calls_in(reply)):
            turns.append(Turn(role="tool", content=MALFORMED_CALL_NOTE))
        sampled = len(turn.completion_token_ids)
        total_chars = len(reply) + call_chars
        in_calls = round(sampled * call_chars / total_chars) if total_chars else 0
        call_tokens += in_calls
        if position == len(served) - 1:
            final += sampled - in_calls
        else:
            thinking += sampled - in_calls
        calls += len(tool_calls)
    return Trajectory(
        id=session_trajectory_id(record),
        task_id=record.task_type,
        turns=turns,
        length_stats=LengthStats(
            thinking_tokens=thinking,
            tool_call_tokens=call_tokens,
            tool_output_tokens=output_tokens,
            final_message_tokens=final,
            tool_calls=calls,
            turns=len(served),
        ),
        feedback=[FeedbackSignal.model_validate(feedback.model_dump(mode="json")) for feedback in record.feedback],
        session_turns=[turn.turn_index for turn in served],
    )


def is_session_row(row: dict[str, Any]) -> bool:
    return row.get("format") == SESSION_FORMAT


def trajectory_from_row(row: dict[str, Any]) -> Trajectory | None:
    """The trajectory a `session/v1` row stands for (validated as a `SessionRecord`); None for any other row. The
    `convert` hook of `workers.trajectories.parse_trajectories_jsonl`."""
    if not is_session_row(row):
        return None
    return session_to_trajectory(SessionRecord.model_validate(row))


# --- reading session rows ----------------------------------------------------------------------------------------


class SessionRowError(ValueError):
    """A `session/v1` row that cannot be trained on; `line` is 1-based."""

    def __init__(self, line: int, message: str) -> None:
        self.line = line
        super().__init__(f"line {line}: {message}")


def parse_sessions_jsonl(data: bytes) -> list[SessionRecord]:
    """Every `SessionRecord` of a `session/v1` dataset version (JSONL, blank lines skipped). Raises
    `SessionRowError` naming the line and the field for the first row that is not UTF-8 or JSON, not a session, or
    repeats an earlier session (same serve run and session id: one update trains on a session once)."""
    records: list[SessionRecord] = []
    first_seen: dict[tuple[int, str], int] = {}
    for index, raw in enumerate(data.split(b"\n")):
        line = index + 1
        if index == 0 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise SessionRowError(line, "not valid UTF-8") from None
        except json.JSONDecodeError as exc:
            raise SessionRowError(line, f"invalid JSON: {exc.msg} (column {exc.colno})") from None
        if not isinstance(obj, dict):
            raise SessionRowError(line, "expected a JSON object (one session per line)")
        if obj.get("format", SESSION_FORMAT) != SESSION_FORMAT:
            raise SessionRowError(line, f"field 'format': expected {SESSION_FORMAT!r}, got {obj.get('format')!r}")
        try:
            record = SessionRecord.model_validate(obj)
        except ValidationError as exc:
            raise SessionRowError(line, describe_validation_error(exc)) from None
        for turn in record.turns:
            if not turn.prompt_token_ids:
                raise SessionRowError(
                    line, f"field 'turns' (turn_index {turn.turn_index}): prompt_token_ids is empty, nothing to score"
                )
        key = (record.serve_run_id, record.session_id)
        if key in first_seen:
            raise SessionRowError(
                line,
                f"field 'session_id': session {record.session_id!r} of serve run {record.serve_run_id} repeats "
                f"line {first_seen[key]}",
            )
        first_seen[key] = line
        records.append(record)
    return records


# --- training samples --------------------------------------------------------------------------------------------


@dataclass
class SessionStats:
    """What one update trains on. `sessions` read, `used` with at least one turn trained on, `dropped` left out
    by the reward (no turn has feedback under `no_feedback="drop"`; a session whose turns were all empty or cut by
    `max_samples` is neither used nor dropped); `turns` trained on
    (`dropped_turns`: without a reward; `empty_turns`: no completion token; `cut_turns`: beyond `max_samples`);
    `tokens` and `completion_tokens` of the turns trained on; `on_policy_share`: the share of those turns served by
    the policy version being trained from (None when it is not known); `reward_mean`: their mean reward (None
    without any); `baseline` and its value per group."""

    sessions: int = 0
    used: int = 0
    dropped: int = 0
    turns: int = 0
    dropped_turns: int = 0
    empty_turns: int = 0
    cut_turns: int = 0
    tokens: int = 0
    completion_tokens: int = 0
    on_policy_share: float | None = None
    reward_mean: float | None = None
    baseline: str = "batch_mean"
    baseline_values: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Candidate:
    record_index: int
    turn: TurnRecord
    reward: float
    terms: dict[str, float]


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def baseline_values(
    rewards: Sequence[float], groups: Sequence[str], baseline: str
) -> tuple[list[float], dict[str, float]]:
    """The baseline b_i of each reward (module docstring) and its value per group ("batch" for the batch mean,
    "type:<task type>" per task type). `groups` holds each reward's task type."""
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {', '.join(BASELINES)}, got {baseline!r}")
    if not rewards or baseline == "none":
        return [0.0] * len(rewards), {}
    batch = _mean(rewards)
    if baseline == "batch_mean":
        return [batch] * len(rewards), {"batch": batch}
    by_type: dict[str, list[float]] = defaultdict(list)
    for reward, group in zip(rewards, groups, strict=True):
        by_type[group].append(reward)
    means = {group: (_mean(values) if len(values) > 1 else batch) for group, values in by_type.items()}
    values = {"batch": batch, **{f"type:{group}": mean for group, mean in sorted(means.items())}}
    return [means[group] for group in groups], values


def session_samples(
    records: Sequence[SessionRecord],
    reward_spec: RewardSpec | dict[str, Any],
    baseline: str = "batch_mean",
    *,
    policy_version: int | None = None,
    max_samples: int | None = None,
) -> tuple[list[Sample], list[float], SessionStats]:
    """One training sample per served turn of `records`, its advantage, and what was used.

    A sample's `token_ids` are the turn's `prompt_token_ids + completion_token_ids` exactly as served, its loss mask
    covers the completion and its `old_logprobs` are the recorded log-probabilities (the behaviour policy). Its
    reward is the turn's from `score_session`; a dropped turn (no feedback reaches it under "drop") and a turn
    with no completion token make no sample. With `max_samples`, the newest turns (by `created_at`) are kept.
    Advantages (reward units, one per sample, in sample order) are the reward minus the `baseline` (module
    docstring), computed over the samples returned. `policy_version` is the checkpoint id being trained from (0:
    the base model): the turns it served are on-policy.

    Samples come in the records' order, each session's turns by turn index; `Sample.group` is the session's index
    in `records` and `Sample.trajectory["id"]` is `<trajectory id>#<turn index>`.
    """
    # One function on purpose: one pass over the served turns: the sample, its advantage and the counts are decided
    # together per turn.
    spec = validate_reward_spec(reward_spec)
    stats = SessionStats(sessions=len(records), baseline=baseline)
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {', '.join(BASELINES)}, got {baseline!r}")
    candidates: list[_Candidate] = []
    trajectory_ids: list[str] = []
    for index, record in enumerate(records):
        trajectory = session_to_trajectory(record)
        trajectory_ids.append(trajectory.id)
        scored = score_session(spec, trajectory)
        stats.dropped += int(scored.dropped)
        for turn, reward in zip(ordered_turns(record), scored.turn_rewards, strict=True):
            if reward is None:
                stats.dropped_turns += 1
            elif not turn.completion_token_ids:
                stats.empty_turns += 1
            else:
                candidates.append(_Candidate(index, turn, reward, dict(scored.result.terms)))
    if max_samples is not None and len(candidates) > max_samples:
        newest = sorted(range(len(candidates)), key=lambda i: candidates[i].turn.created_at)[-max_samples:]
        keep = set(newest)
        stats.cut_turns = len(candidates) - len(keep)
        candidates = [candidate for i, candidate in enumerate(candidates) if i in keep]

    rewards = [c.reward for c in candidates]
    groups = [records[c.record_index].task_type for c in candidates]
    baselines, stats.baseline_values = baseline_values(rewards, groups, baseline)
    advantages = [reward - base for reward, base in zip(rewards, baselines, strict=True)]
    samples: list[Sample] = []
    for candidate in candidates:
        turn, record = candidate.turn, records[candidate.record_index]
        response_calls = turn.response.get("tool_calls") or []
        samples.append(
            Sample(
                task_id=record.task_type,
                group=candidate.record_index,
                token_ids=[*turn.prompt_token_ids, *turn.completion_token_ids],
                completion_start=len(turn.prompt_token_ids),
                loss_mask=[1] * len(turn.completion_token_ids),
                old_logprobs=list(turn.logprobs),
                reward=candidate.reward,
                terms=candidate.terms,
                policy_version=turn.policy_version,
                num_turns=1,
                malformed_tool_calls=malformed_calls_in(str(turn.response.get("content") or "")),
                finish_reason=turn.finish_reason,
                error=None,
                trajectory={
                    "id": f"{trajectory_ids[candidate.record_index]}#{turn.turn_index}",
                    "session_id": record.session_id,
                    "serve_run_id": record.serve_run_id,
                    "turn_index": turn.turn_index,
                    "request_id": turn.request_id,
                    "tool_calls": len(response_calls) if isinstance(response_calls, list) else 0,
                },
            )
        )
    used_sessions = {c.record_index for c in candidates}
    stats.used = len(used_sessions)
    stats.turns = len(samples)
    stats.tokens = sum(s.total_tokens for s in samples)
    stats.completion_tokens = sum(s.sampled_tokens for s in samples)
    if samples:
        stats.reward_mean = _mean(rewards)
        if policy_version is not None:
            stats.on_policy_share = sum(1 for s in samples if s.policy_version == policy_version) / len(samples)
    return samples, advantages, stats
