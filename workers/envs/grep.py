"""`grep_corpus`: a regular expression over every chunk's text, with one deadline for the whole scan.

The corpus is scanned as one text, chunks joined by newlines, with the `regex` package's `timeout=`: a pattern
that backtracks catastrophically (`(a+)+$` on a long run of a's) raises GrepError after `timeout_s` instead of
holding a rollout. Semantics, as a grep user expects them: `^` and `$` match at line starts and ends (MULTILINE),
matching is case-sensitive unless the pattern says `(?i)`, a match belongs to the chunk it starts in, and at most
`max_chunks` chunks come back, in corpus order (the scan stops there, so a common word is cheap).
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_right
from collections.abc import Collection, Sequence
from typing import Any

import regex

MAX_PATTERN_CHARS = 200


class GrepError(ValueError):
    """A pattern the scan refused or gave up on; the message is shown to the model as the tool's observation."""


def compile_pattern(pattern: str) -> Any:
    if not pattern:
        raise GrepError("the pattern is empty; give a regular expression such as 'error code \\d+'")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise GrepError(f"the pattern is {len(pattern)} characters long; at most {MAX_PATTERN_CHARS} are allowed")
    try:
        return regex.compile(pattern, regex.MULTILINE)
    except regex.error as exc:
        raise GrepError(f"invalid regular expression: {exc}") from None
    except (OverflowError, RecursionError, ValueError) as exc:  # e.g. a repeat count too large to represent
        raise GrepError(f"invalid regular expression: {exc}") from None


class GrepScanner:
    """The corpus as one searchable text. Built on first use (it costs one copy of the corpus text in memory)."""

    def __init__(self, texts: Sequence[str]) -> None:
        self._texts = texts
        self._lock = threading.Lock()
        self._joined: str | None = None
        self._starts: list[int] = []

    def _ensure(self) -> tuple[str, list[int]]:
        with self._lock:
            if self._joined is None:
                starts, offset = [], 0
                for text in self._texts:
                    starts.append(offset)
                    offset += len(text) + 1  # the joining newline
                self._starts = starts
                self._joined = "\n".join(self._texts)
            return self._joined, self._starts

    def scan(
        self, pattern: str, *, max_chunks: int = 5, timeout_s: float = 0.5, exclude: Collection[int] = ()
    ) -> list[int]:
        """Rows (corpus order) of the first `max_chunks` chunks with a match, skipping rows in `exclude`.
        Raises GrepError for an empty, too long or invalid pattern, or when the scan passes `timeout_s`."""
        compiled = compile_pattern(pattern)
        if max_chunks <= 0:
            return []
        text, starts = self._ensure()
        deadline = time.monotonic() + timeout_s
        rows: list[int] = []
        pos = 0
        while len(rows) < max_chunks and pos <= len(text):
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise TimeoutError
                match = compiled.search(text, pos, timeout=remaining)
            except TimeoutError:
                raise GrepError(
                    f"the pattern took longer than {timeout_s:g} s; use a simpler pattern "
                    "(nested repetition such as (a+)+ backtracks without end)"
                ) from None
            if match is None:
                break
            row = bisect_right(starts, match.start()) - 1
            if row not in exclude:
                rows.append(row)
            # One hit per chunk: continue at the next chunk's first character.
            pos = starts[row + 1] if row + 1 < len(starts) else len(text) + 1
        return rows
