"""Length blow-up: replies that grow far past what the task needs, a common way to game a length-insensitive or
sum-over-tokens reward (and the first symptom of a policy drifting into degenerate text).

Lengths are in characters of the assistant turns' `content` (tool-call arguments included, since the policy wrote
them; tool results excluded). A trajectory is flagged when one assistant turn is longer than `max_turn_chars`, or
all assistant turns together are longer than `max_total_chars`. The evidence is the span past the limit: the tail
of the longest turn, or the turn where the running total crossed the limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import Field

from workers.detectors.base import (
    DetectorParams,
    TrajectoryDetector,
    content_of,
    excerpt,
    is_assistant,
    record_id,
    rounded,
    turns_of,
)
from workers.findings import Finding, Severity


class LengthBlowupParams(DetectorParams):
    max_turn_chars: int = Field(
        default=8_000,
        ge=1,
        description="Flag an assistant turn longer than this many characters (about 2,000 tokens of English)",
    )
    max_total_chars: int = Field(
        default=32_000,
        ge=1,
        description="Flag when the assistant turns together are longer than this many characters",
    )
    high_factor: float = Field(
        default=2.0,
        ge=1.0,
        description="Severity is high when the length is at least this multiple of the threshold it crossed",
    )


class LengthBlowup(TrajectoryDetector[LengthBlowupParams]):
    name: ClassVar[str] = "length_blowup"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = "An assistant turn, or all of them together, longer than a character threshold"
    Params = LengthBlowupParams

    def detect(self, record: Mapping[str, Any], params: LengthBlowupParams) -> list[Finding]:
        turns = turns_of(record)
        lengths = [(i, len(content_of(turn))) for i, turn in enumerate(turns) if is_assistant(turn)]
        if not lengths:
            return []
        longest_turn, longest = max(lengths, key=lambda item: (item[1], -item[0]))
        total = sum(length for _, length in lengths)
        turn_ratio = longest / params.max_turn_chars
        total_ratio = total / params.max_total_chars
        if longest <= params.max_turn_chars and total <= params.max_total_chars:
            return []

        if longest > params.max_turn_chars and turn_ratio >= total_ratio:
            measure, value, threshold, ratio = "turn_chars", longest, params.max_turn_chars, turn_ratio
            turn_index, start = longest_turn, params.max_turn_chars
            message = f"assistant turn {turn_index} has {longest:,} characters (threshold {threshold:,})"
        else:
            measure, value, threshold, ratio = "total_chars", total, params.max_total_chars, total_ratio
            running, turn_index, start = 0, lengths[-1][0], 0
            for index, length in lengths:
                if running + length > threshold:
                    turn_index, start = index, threshold - running
                    break
                running += length
            message = (
                f"assistant turns total {total:,} characters (threshold {threshold:,}), crossed in turn {turn_index}"
            )
        text = content_of(turns[turn_index])
        severity: Severity = "high" if ratio >= params.high_factor else "medium"
        evidence = {
            "message": message,
            "turn": turn_index,
            "span": [start, len(text)],
            "excerpt": excerpt(text, start, len(text)),
            "measure": measure,
            "value": value,
            "threshold": threshold,
            "ratio": rounded(ratio),
            "longest_turn": longest_turn,
            "longest_turn_chars": longest,
            "total_chars": total,
        }
        return [self.finding(record_id(record), severity, evidence)]
