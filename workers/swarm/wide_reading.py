"""What a wide task asks for, read from the task itself (issue 40 part 2): the scripted orchestrator's reading of a
question written by anyone, not only by Crucible's generator.

A wide task's row gives its columns in `table.columns` (the key columns first) and may give the rows to fill in
`entities`. The environment states both in the question when the question does not (`task_brief`), so a model and
the scripted teacher read the same text. `read_wide_task` then takes from that text:
- the columns: the header the environment states ("the columns: name | version | section"), or a list after
  "give (me) (its|the|their)" when no table is given;
- the items (rows): names in backticks, or quoted; else a bulleted or numbered list; else the longest list of
  names in the question ("these 4 packages: curl, wget, rsync and tar", "for each of A, B and C"), leaving out a
  list of the columns themselves;
- or what to enumerate: "every API item ... that document `D` documents" (Crucible's generator), or "every
  document/package/... that (whose, which, maintained by, mentioning) CONDITION", whose matches the orchestrator
  finds by grep (`condition_terms`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workers.search.extract import GENERIC_WORDS, column_words, normalise, stem

_COLUMNS = re.compile(r"columns:\s*([^\n]+)$", re.IGNORECASE | re.MULTILINE)
_DOCUMENT = re.compile(r"that document `([^`]+)` documents")
_EVERY = re.compile(
    r"\b(?:every|all(?: the)?|any)\s+(?:[\w-]+\s+){0,2}?"
    r"(?:that|which|whose|where|in which|who|\w+(?:ed|en)\s+(?:by|in|on|at|from|under|with|for)|\w+ing)\s+"
    r"([^\n]+?)(?:[.?!](?:\s|$)|\n|$)",
    re.IGNORECASE,
)
_BULLET = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+(.+?)\s*$", re.MULTILINE)
_GIVE = re.compile(r"\b(?:give|list|report|state|find)\s+(?:me\s+)?(?:its|the|their|each one's)?\s*([^.\n:]+)", re.I)
_COUNT = re.compile(r"\b(?:these|the following|those)\s+(\d+)\b", re.IGNORECASE)
_LEAD = re.compile(r"^(?:(?:for|of|each|every|these|the|following|\d+)\s+)+", re.IGNORECASE)
_VERB = re.compile(
    r"^(?:give|list|report|state|show|find|what|which|with|tell|include|compare|tabulate|build|make|create|"
    r"collect|gather|look up|i need|please|and)\b(?:\s+(?:are|is|me|us|up|a table of|a table for))*\s*",
    re.IGNORECASE,
)
_PREAMBLE = re.compile(r"^.*\b(?:of|for|about|on|among|between)\s+", re.IGNORECASE)
_WORDS = {"one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"}


@dataclass
class WideShape:
    """What one wide task asks: its rows (or what to enumerate), its key column and the columns to fill."""

    items: list[str] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    key: str = "name"
    document: str | None = None
    condition: str | None = None

    @property
    def wide(self) -> bool:
        return bool(self.columns)

    @property
    def asked(self) -> list[str]:
        return [c for c in self.columns if c != self.key]


def task_brief(prompt: str, table: Mapping[str, Any] | None, entities: Sequence[str] | None) -> str:
    """What the environment adds to a wide task's question so that it states its rows and columns: the header of
    the table to answer with (key columns first), unless a `columns:` line already names every column, and the
    rows the task gives (`entities`) that the question does not name. "" when nothing is missing."""
    parts: list[str] = []
    if table:
        keys = [str(k) for k in table.get("key_columns") or []]
        columns = keys + [str(c) for c in table.get("columns") or [] if c not in keys]
        stated = _COLUMNS.search(prompt)
        named = {normalise(c) for c in stated.group(1).split("|")} if stated else set()
        if columns and not all(normalise(c) in named for c in columns):
            parts.append("Answer with one Markdown table with the columns: " + " | ".join(columns))
    missing = [str(e) for e in entities or [] if str(e).lower() not in prompt.lower()]
    if missing:
        parts.insert(0, "The rows: " + ", ".join(f"`{e}`" for e in missing) + ".")
    return "\n\n".join(parts)


def _segments(clause: str) -> list[str]:
    return [p.strip().strip("`\"'*").strip() for p in re.split(r"\s*,\s*(?:and|or|&)?\s*|\s+(?:and|or|&)\s+", clause)]


def _runs(clause: str, columns: Sequence[str]) -> list[list[str]]:
    """Runs of names in one clause of a question, split at its separators (commas, "and", "or"): a segment that
    leads in ("the version of X", "Compare X") starts a run with X; a column name, a long phrase or a verb ends one."""
    runs: list[list[str]] = []
    current: list[str] = []
    for segment in _segments(clause):
        lead = _PREAMBLE.match(segment) or _VERB.match(segment)
        if lead:
            runs.append(current)
            current = []
        while lead and lead.end() > 0:  # "Please compare X" -> X
            segment = segment[lead.end() :].strip()
            lead = _VERB.match(segment)
        segment = _LEAD.sub("", segment).strip()
        if not segment or len(segment.split()) > 5 or _VERB.match(segment) or _is_columns([segment], columns):
            runs.append(current)
            current = []
            continue
        if segment.lower() not in _WORDS:
            current.append(segment)
    runs.append(current)
    return [run for run in runs if run]


def _is_columns(names: Sequence[str], columns: Sequence[str]) -> bool:
    """Whether a list in the question is the columns themselves ("give the version, section and homepage")."""
    wanted = [_stems(c) for c in columns]
    hits = sum(
        bool(have) and any(have <= want or want <= have for want in wanted if want) for have in map(_stems, names)
    )
    return bool(columns) and hits * 2 >= len(names)


def _stems(name: str) -> set[str]:
    """The stems of a name's specific words ("founding date" -> {found}), to meet a column however it is worded."""
    words = column_words(name)
    return {stem(w) for w in words if w not in GENERIC_WORDS} or {stem(w) for w in words}


def listed_items(question: str, columns: Sequence[str] = ()) -> list[str]:
    """The rows a question names (see the module docstring), in its order, each once; [] when it names none (an
    enumeration's condition is not read for names)."""
    head = question.split("Answer with one Markdown table", 1)[0]
    every = _EVERY.search(head)
    if every:
        head = head[: every.start()] + head[every.end() :]
    for pattern in (r"`([^`\n]+)`", r"\"([^\"\n]{1,80})\"", r"\u201c([^\u201d\n]{1,80})\u201d"):
        found = [n.strip() for n in re.findall(pattern, head) if n.strip()]
        found = [n for n in found if not _is_columns([n], columns)]
        if found:
            return list(dict.fromkeys(found))
    bullets = [b.strip("`\"' ") for b in _BULLET.findall(head)]
    if len(bullets) >= 2 and not _is_columns(bullets, columns):
        return list(dict.fromkeys(bullets))
    count = _COUNT.search(head)
    want = int(count.group(1)) if count else None
    best: list[str] = []
    for clause in re.split(r"[.;:?!\n](?:\s|$)|:\s*", head):
        for names in _runs(clause, columns):
            if len(names) < 2:
                continue
            if want is not None and len(names) == want:
                return list(dict.fromkeys(names))
            if len(names) > len(best):
                best = names
    return list(dict.fromkeys(best))


def asked_columns(question: str) -> list[str]:
    """Columns from the wording when the task states no header: "give its version, section and homepage"."""
    match = _GIVE.search(question)
    if not match:
        return []
    phrase = re.split(r"\b(?:for|of)\s+(?:each|every|these|the following|all)\b", match.group(1))[0]
    names = [_LEAD.sub("", c).strip() for c in _segments(phrase)]
    return [c.replace(" ", "_") for c in names if c and not _VERB.match(c)]


def read_wide_task(question: str) -> WideShape:
    """What a wide task's question asks (module docstring). `columns` is [] for a question that is not a table."""
    stated = _COLUMNS.search(question)
    columns = [c.strip() for c in stated.group(1).split("|") if c.strip()] if stated else []
    shape = WideShape(columns=columns, key=columns[0] if columns else "name")
    document = _DOCUMENT.search(question)
    if document:
        shape.document = document.group(1)
        return shape
    if not columns:
        return shape
    head = question.split("Answer with one Markdown table", 1)[0]
    shape.items = listed_items(head, shape.asked)
    if not shape.items:
        every = _EVERY.search(head)
        if every:
            shape.condition = every.group(1).strip()
    return shape


def condition_terms(condition: str) -> list[str]:
    """What a document must contain to match an enumeration's condition: its quoted or backticked values when it
    has any, else its longest words (the ones a grep can find)."""
    quoted = re.findall(r"`([^`]+)`|\"([^\"]+)\"|'([^']+)'", condition)
    values = [next(v for v in group if v) for group in quoted]
    if values:
        return values
    words = [w for w in re.findall(r"[\w.+-]+", condition) if len(w) > 3 and w.lower() not in _COMMON]
    return sorted(words, key=len, reverse=True)[:2]


_COMMON = {
    "that", "which", "whose", "where", "with", "have", "has", "their", "there", "them", "they", "this", "these",
    "those", "from", "into", "than", "then", "also", "mention", "mentions", "mentioned", "contain", "contains",
    "document", "documents", "section", "value", "name", "named", "called", "about", "give", "list",
}  # fmt: skip
