"""The detector interface: pure, versioned checks for reward hacking, one module per detector.

A detector is a class in its own module of this package (the registry finds it by the module name) with
- `name`: the registry key, equal to the module's name (`workers/detectors/repetition.py` -> "repetition");
- `version`: a short string, bumped whenever what it flags changes, so a flag can be traced to the logic that
  raised it;
- `scope`: "trajectory" (it reads one trajectory record) or "run" (it reads a run's per-step metric series);
- `Params`: a frozen pydantic model (`DetectorParams`) of its thresholds, every field with a default and a
  description naming its unit and what crossing it means;
- `detect(...)`: trajectory scope takes a record (`workers.trajectories` JSON, as `Environment.trajectory`
  writes it or as uploads hold it) and its params; run scope takes `RunSeries` and its params. It returns at most
  one `Finding` (a flag is unique per trajectory and detector), never raises on an odd record and does no I/O.
- optionally `suggest(spec)`: the reward change that would make its hack cost reward (a proposed reward spec and
  a one-line reason), offered to the reviewer who confirms one of its flags; without it the generic turn penalty
  (`suggest_turn_penalty`) is offered, which fits any hack that spends turns the task did not need.

Evidence is a JSON-able dict with the same core keys for every detector, so the review page can highlight it:
`message` (one sentence), `turn` (index into the record's `turns`, or None), `span` ([start, end) character
offsets into that turn's `content`, or None), `excerpt` (the text of the span, cut to `EXCERPT_CHARS`), and
`measure`, `value`, `threshold` (what was measured, its value and the threshold it crossed). Detectors add their
own keys beside these.
"""

from __future__ import annotations

import abc
import copy
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from workers.findings import Finding, Severity

Scope = Literal["trajectory", "run"]

RunSeries = Mapping[str, Sequence[tuple[float, float]]]
"""A run's metric series by metric name: (step, value) points in step order (a run-scope detector's input)."""

EXCERPT_CHARS = 240
"""Longest excerpt a finding carries; the review page opens the whole turn from the stored trajectory."""

ASSISTANT = "assistant"


class DetectorParams(BaseModel):
    """Base of every detector's thresholds: frozen, and an unknown setting is an error rather than ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


ParamsT = TypeVar("ParamsT", bound=DetectorParams)


class Detector(abc.ABC, Generic[ParamsT]):
    """What every detector declares; subclass `TrajectoryDetector` or `RunDetector`, not this."""

    name: ClassVar[str]
    version: ClassVar[str]
    scope: ClassVar[Scope]
    description: ClassVar[str]
    Params: type[ParamsT]

    def suggest(self, spec: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
        """(proposed reward spec, one-line reason) for a confirmed hack of this detector's kind, or None when the
        generic turn penalty fits. Pure: `spec` (a reward spec's JSON) is not modified, and a proposal always
        differs from it, so confirming a flag never suggests a no-op."""
        return None

    def finding(self, trajectory_id: str | None, severity: Severity, evidence: Mapping[str, Any]) -> Finding:
        return Finding(
            detector=self.name,
            version=self.version,
            severity=severity,
            evidence=dict(evidence),
            trajectory_id=trajectory_id,
        )


class TrajectoryDetector(Detector[ParamsT]):
    """A detector over one trajectory record, run on every scored episode and every re-scored trajectory."""

    scope: ClassVar[Scope] = "trajectory"

    @abc.abstractmethod
    def detect(self, record: Mapping[str, Any], params: ParamsT) -> list[Finding]:
        """At most one finding about `record`; [] when it looks clean."""


class RunDetector(Detector[ParamsT]):
    """A detector over a run's per-step metric series (reward, eval metrics), run by whoever holds them."""

    scope: ClassVar[Scope] = "run"

    @abc.abstractmethod
    def detect(self, series: RunSeries, params: ParamsT) -> list[Finding]:
        """At most one finding about the run; [] when it looks healthy or the series are too short to judge."""


# --- reading records ------------------------------------------------------------------------------------------
# Records come from environments (with `counts` and `env`) and from uploads (often without them), so every reader
# tolerates missing or oddly typed fields instead of raising.


def record_id(record: Mapping[str, Any]) -> str:
    return str(record.get("id") or "")


def turns_of(record: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The record's turns that are objects (anything else is skipped, keeping the indices of the rest)."""
    raw = record.get("turns")
    if not isinstance(raw, list):
        return []
    return [turn if isinstance(turn, Mapping) else {} for turn in raw]


def content_of(turn: Mapping[str, Any]) -> str:
    content = turn.get("content")
    return content if isinstance(content, str) else ""


def is_assistant(turn: Mapping[str, Any]) -> bool:
    return turn.get("role") == ASSISTANT


def count_of(record: Mapping[str, Any], key: str) -> int | None:
    """`record["counts"][key]` when the environment wrote it (a non-negative integer), else None."""
    counts = record.get("counts")
    if not isinstance(counts, Mapping):
        return None
    value = counts.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def reply_count(record: Mapping[str, Any]) -> int:
    """Replies of the policy (the environment's `counts.turns`). Without counts: runs of consecutive assistant
    turns, since a reply with k tool calls is stored as k assistant turns in a row."""
    counted = count_of(record, "turns")
    if counted is not None:
        return counted
    replies, previous_assistant = 0, False
    for turn in turns_of(record):
        assistant = is_assistant(turn)
        if assistant and not previous_assistant:
            replies += 1
        previous_assistant = assistant
    return replies


def excerpt(text: str, start: int, end: int, limit: int = EXCERPT_CHARS) -> str:
    """`text[start:end]`, cut to `limit` characters (the cut marked with an ellipsis)."""
    piece = text[max(0, start) : max(0, end)]
    return piece if len(piece) <= limit else piece[: limit - 1] + "…"


def rounded(value: float, digits: int = 4) -> float:
    """A finite float for evidence (JSON has no NaN or infinity)."""
    return round(value, digits) if math.isfinite(value) else 0.0


# --- suggested reward changes -----------------------------------------------------------------------------------
# The reward schema's only penalty terms are turn_penalty (docs/methods.md X5) and prune_penalty (X4), so a suggestion
# adds or tightens one of those, or reweights a gain term that pays for the behaviour the hack skipped.

TIGHTEN = 1.5
"""How much a suggestion scales an existing penalty's size or a gain term's weight."""

DEFAULT_TURN_PENALTY: dict[str, Any] = {"type": "turn_penalty", "start": 8, "ramp": 16, "max_penalty": 0.5}


def proposal(spec: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A deep copy of `spec` to edit and its term list (created when missing): suggestions never touch `spec`."""
    proposed = copy.deepcopy(spec)
    terms: list[dict[str, Any]] = proposed.setdefault("terms", [])
    return proposed, terms


def term_of_type(terms: list[dict[str, Any]], term_type: str) -> dict[str, Any] | None:
    """The first term of `term_type`: the one a suggestion tightens rather than adding another."""
    return next((term for term in terms if term.get("type") == term_type), None)


def suggest_turn_penalty(spec: dict[str, Any], detector: str) -> tuple[dict[str, Any], str]:
    """The generic suggestion: add a turn_penalty, or halve an existing one's start and raise its maximum, so the
    long episodes most hacks produce (loops, padding, broken tool calls retried) cost reward."""
    proposed, terms = proposal(spec)
    term = term_of_type(terms, "turn_penalty")
    if term is None:
        terms.append(dict(DEFAULT_TURN_PENALTY))
        return proposed, (
            f"{detector}: add a turn_penalty (from {DEFAULT_TURN_PENALTY['start']} turns, up to "
            f"{DEFAULT_TURN_PENALTY['max_penalty']} over {DEFAULT_TURN_PENALTY['ramp']} more) so the long episodes "
            "this hack produces cost reward"
        )
    old_start, old_max = int(term.get("start", 64)), float(term.get("max_penalty", 0.5))
    term["start"] = old_start // 2
    term["max_penalty"] = round(old_max * TIGHTEN, 4) if old_max > 0 else DEFAULT_TURN_PENALTY["max_penalty"]
    return proposed, (
        f"{detector}: tighten {term.get('name') or 'turn_penalty'}: start {old_start} -> {term['start']} turns, "
        f"max_penalty {old_max:g} -> {term['max_penalty']:g}"
    )
