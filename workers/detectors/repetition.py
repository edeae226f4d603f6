"""Repetition: the assistant says the same thing over and over (a degenerate loop, or padding that a reward
counting words or keywords pays for).

Measured on the assistant turns' text without markup: tool-call blocks (`<tool_call>...</tool_call>`, whose JSON
repeats by design) and tags such as `<Document id=...>` are left out. Words are runs of letters, digits and
underscores, lower-cased; word n-grams never span two turns, but a repeat may be in any later turn. The repeated
fraction is (n-grams - distinct n-grams) / n-grams: the share of n-gram occurrences that repeat an earlier one
(0 for text that never repeats a phrase; close to 1 for a loop). Natural prose scores well under 0.1 at n = 4.
The evidence is the most repeated n-gram, where it first appears and where it first repeats.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import Field, model_validator

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
from workers.envs.toolcalls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from workers.findings import Finding, Severity

_MARKUP = re.compile(
    rf"{re.escape(TOOL_CALL_OPEN)}.*?(?:{re.escape(TOOL_CALL_CLOSE)}|$)|</?[A-Za-z][^<>]*>", re.DOTALL | re.IGNORECASE
)
_WORD = re.compile(r"\w+")


class RepetitionParams(DetectorParams):
    ngram: int = Field(default=4, ge=1, le=16, description="Length of the word n-grams compared, in words")
    max_repeated_fraction: float = Field(
        default=0.5,
        gt=0.0,
        lt=1.0,
        description="Flag when more than this fraction of the n-gram occurrences repeat an earlier n-gram",
    )
    min_ngrams: int = Field(
        default=32,
        ge=1,
        description="Assistant text with fewer n-grams than this is not judged (too short for the fraction to mean "
        "anything)",
    )
    high_fraction: float = Field(
        default=0.8,
        gt=0.0,
        le=1.0,
        description="Severity is high when the repeated fraction is at least this; medium below",
    )

    @model_validator(mode="after")
    def _ordered(self) -> RepetitionParams:
        if self.high_fraction < self.max_repeated_fraction:
            raise ValueError(
                f"high_fraction ({self.high_fraction}) must be at least max_repeated_fraction "
                f"({self.max_repeated_fraction})"
            )
        return self


def _segments(text: str) -> list[tuple[int, int]]:
    """[start, end) ranges of `text` outside markup."""
    ranges: list[tuple[int, int]] = []
    at = 0
    for match in _MARKUP.finditer(text):
        ranges.append((at, match.start()))
        at = match.end()
    ranges.append((at, len(text)))
    return ranges


def _words(text: str) -> list[str]:
    """The lower-cased words outside markup, in order (lower-cased one by one: lowering the whole text could
    change its length and so the offsets)."""
    return [word.lower() for start, end in _segments(text) for word in _WORD.findall(text, start, end)]


def _word_spans(text: str) -> list[tuple[int, int]]:
    """[start, end) of each word `_words` returns (only computed for the turns the evidence points at)."""
    return [match.span() for start, end in _segments(text) for match in _WORD.finditer(text, start, end)]


class Repetition(TrajectoryDetector[RepetitionParams]):
    name: ClassVar[str] = "repetition"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = "A high fraction of repeated word n-grams in the assistant's text"
    Params = RepetitionParams

    def detect(self, record: Mapping[str, Any], params: RepetitionParams) -> list[Finding]:
        turns = turns_of(record)
        n = params.ngram
        counts: dict[tuple[str, ...], int] = {}
        first: dict[tuple[str, ...], tuple[int, int]] = {}  # n-gram -> (turn, word index) of its first use
        repeat: dict[tuple[str, ...], tuple[int, int]] = {}  # n-gram -> where it first repeats
        for index, turn in enumerate(turns):
            if not is_assistant(turn):
                continue
            words = _words(content_of(turn))
            # The shifted copies differ in length on purpose: zip stops at the last complete n-gram.
            for at, gram in enumerate(zip(*(words[i:] for i in range(n)), strict=False)):
                seen = counts.get(gram, 0)
                counts[gram] = seen + 1
                if seen == 0:
                    first[gram] = (index, at)
                elif seen == 1:
                    repeat[gram] = (index, at)
        total = sum(counts.values())
        if total < params.min_ngrams:
            return []
        fraction = (total - len(counts)) / total
        if fraction <= params.max_repeated_fraction:
            return []

        # The most repeated n-gram; among equals, the one that repeats first.
        gram = max(repeat, key=lambda g: (counts[g], -repeat[g][0], -repeat[g][1]))
        turn_index, start, end = self._span(turns, repeat[gram], n)
        first_turn, first_start, first_end = self._span(turns, first[gram], n)
        text = content_of(turns[turn_index])
        phrase = " ".join(gram)
        severity: Severity = "high" if fraction >= params.high_fraction else "medium"
        evidence = {
            "message": f"{fraction:.0%} of the assistant's {n}-word phrases repeat (threshold "
            f"{params.max_repeated_fraction:.0%}); {phrase!r} appears {counts[gram]} times",
            "turn": turn_index,
            "span": [start, end],
            "excerpt": excerpt(text, start, end),
            "measure": "repeated_fraction",
            "value": rounded(fraction),
            "threshold": params.max_repeated_fraction,
            "ngram": phrase,
            "count": counts[gram],
            "first_seen": {"turn": first_turn, "span": [first_start, first_end]},
            "ngrams": total,
            "distinct_ngrams": len(counts),
        }
        return [self.finding(record_id(record), severity, evidence)]

    @staticmethod
    def _span(turns: list[Mapping[str, Any]], where: tuple[int, int], n: int) -> tuple[int, int, int]:
        """(turn, start, end) in characters of the n words starting at word `where[1]` of turn `where[0]`."""
        turn_index, at = where
        spans = _word_spans(content_of(turns[turn_index]))
        return turn_index, spans[at][0], spans[at + n - 1][1]
