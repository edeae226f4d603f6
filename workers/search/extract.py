"""Reading a table cell out of any text: what the scripted sub-agent and single agent do on a wide task whose
corpus was not written for them (issue 40 part 2).

`workers.search.wide.read_attributes` reads the attributes of an API heading (`## class csv.Sniffer()`); this module
reads `column` of `entity` from plain text, in the forms documents state facts in, tried in this order:

1. a field line: `Version: 7.88.1`, `- maintainer = Jane Doe`, `Homepage | https://curl.se` (the label is the column,
   or holds its words);
2. a table: a Markdown or pipe table whose header names the column and one of whose rows names the entity;
3. a sentence: the column's words (each matched by its stem, so "maintainer" finds "maintained by" and "founding
   year" finds "founded in") followed by the value: linking words (is, was, of, by, in, ...) are skipped and the
   value runs to the end of the clause (a comma, a semicolon, a full stop, "and", a bracket).

The entity decides which text is read, not which line: `entity_score` ranks passages by how strongly they are
about the entity (its name as the document's title or first line, then a field naming it, then any mention), and the
caller reads the best one's document. Nothing here knows a corpus: no heading syntax, no field list.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_FIELD = re.compile(r"^\s*(?:[-*\u2022]\s+)?([A-Za-z][\w .'/()-]{0,60}?)\s*(?::|=|\|)\s*(\S.*?)\s*\|?\s*$")
_NEXT_FIELD = re.compile(r"\s+(?=[A-Z][\w-]*(?: [A-Za-z][\w-]*){0,2}:\s)")
"""Where a field's value ends when the text runs fields together on one line ("Population: 25,000 Mayor: ...")."""
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])|\n\s*\n|\n(?=\s*[-*\u2022]\s)")
_LINKING = {
    "is", "are", "was", "were", "be", "been", "being", "of", "by", "in", "on", "at", "to", "from", "as", "the", "a",
    "an", "its", "their", "his", "her", "has", "have", "had", "equals", "equal", "reads", "called", "named", "set",
    "given", "listed", "currently", "which", "that", "value", "it", "this", "under", "for", "with", "about",
    "around", "approximately", "roughly", "some", "exactly", "=", ":", "-", "\u2014", "\u2013",
}  # fmt: skip
_CLAUSE_END = re.compile(
    r"\s*(?:,(?!\d{3}\b)|;|\.(?=\s|$)|\s\(|\)|\s(?:and|but|by|while|whereas|which|who|where|when|since|because)\s|$)"
)
GENERIC_WORDS = {"year", "date", "name", "count", "value", "type", "kind", "number", "total", "amount"}
"""Words of a column name that say what form its value takes, not what it is ("founding year"): a sentence may
state the value without them ("founded in 1850"), so the other words are also tried alone."""
_WORD = re.compile(r"[A-Za-z0-9]+")
_STOP = {"the", "a", "an", "of", "its", "their", "in", "for", "to", "and", "or", "each", "what", "which", "number"}


def normalise(text: str) -> str:
    return " ".join(_WORD.findall(text.lower()))


def column_words(column: str) -> list[str]:
    """The words of a column name (`first_release_year` -> first, release, year), stop words dropped."""
    words = [w for w in _WORD.findall(column.replace("_", " ").lower())]
    return [w for w in words if w not in _STOP] or words


def stem(word: str) -> str:
    """A crude stem, enough to meet a column word in a sentence: maintainer / maintained / maintains -> maint."""
    word = word.lower()
    for suffix in ("ations", "ation", "ings", "ing", "ers", "ies", "ied", "er", "ed", "es", "or", "s", "y"):
        if len(word) - len(suffix) >= 4 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def _label_matches(label: str, column: str) -> bool:
    want = [stem(w) for w in column_words(column)]
    have = [stem(w) for w in _WORD.findall(label.lower())]
    if not want or not have:
        return False
    return want == have or (len(have) <= len(want) + 2 and all(w in have for w in want))


def _clean(value: str) -> str:
    value = value.strip().strip("`*_\"'").strip()
    return value.rstrip(".,;:").strip()


def field_value(text: str, column: str) -> str | None:
    """The value of a `label: value` line whose label is the column (form 1)."""
    for line in text.splitlines():
        match = _FIELD.match(line)
        if match and _label_matches(match.group(1), column):
            value = _clean(_NEXT_FIELD.split(match.group(2), maxsplit=1)[0])
            if value:
                return value
    return None


def table_value(text: str, entity: str, column: str) -> str | None:
    """The cell under the column's header in the row that names the entity (form 2)."""
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.count("|") >= 2 and not re.fullmatch(r"[\s|:-]+", line)
    ]
    if len(rows) < 2:
        return None
    header = rows[0]
    at = next((i for i, h in enumerate(header) if _label_matches(h, column)), None)
    if at is None:
        return None
    key = normalise(entity)
    for row in rows[1:]:
        if len(row) == len(header) and any(normalise(cell) == key for cell in row):
            value = _clean(row[at])
            return value or None
    return None


def _mention(words: Sequence[str]) -> re.Pattern[str]:
    """A column's words in a sentence, each by its stem, at most two other words between them."""
    parts = [rf"\b{re.escape(stem(w))}\w*" for w in words]
    return re.compile(r"(?:\W+\w+){0,2}?\W+".join(parts), re.IGNORECASE)


def sentence_value(text: str, column: str, *, entity: str = "") -> str | None:
    """The value that follows the column's words in a sentence (form 3), or a single word right before them ("the
    web section"); sentences naming the entity first. A column of several words is tried whole, then by its
    specific words alone (`GENERIC_WORDS`)."""
    words = column_words(column)
    if not words:
        return None
    tries = [words]
    specific = [w for w in words if w not in GENERIC_WORDS]
    if specific and specific != words:
        tries.append(specific)
    sentences = [s.strip() for s in _SENTENCE_END.split(text) if s and s.strip()]
    if entity:
        key = entity.lower()
        sentences.sort(key=lambda s: key not in s.lower())  # stable: those naming the entity first
    for attempt in tries:
        pattern = _mention(attempt)
        before = re.compile(rf"\b(?:the|a|an|its|their)\s+([\w.+/-]+)\s+{pattern.pattern}\b", re.IGNORECASE)
        for sentence in sentences:
            for match in pattern.finditer(sentence):
                value = _typed(_after(sentence[match.end() :]), words)
                if value and normalise(value) != normalise(entity):
                    return value
            found = before.search(sentence)
            if found and found.group(1).lower() not in _LINKING:
                return _clean(found.group(1))
    return None


def _typed(value: str, words: Sequence[str]) -> str:
    """A year column keeps the year of a longer phrase ("1850 by settlers" -> 1850)."""
    if "year" in words:
        match = re.search(r"\b\d{4}\b", value)
        return match.group(0) if match else ""
    return value


def _after(rest: str) -> str:
    tokens = rest.lstrip().split(" ")
    while tokens and tokens[0].lower().strip(":=,") in _LINKING | {""}:
        tokens.pop(0)
    rest = _NEXT_FIELD.split(" ".join(tokens), maxsplit=1)[0]
    end = _CLAUSE_END.search(rest)
    return _clean(rest[: end.start()] if end else rest)


def extract_cell(text: str, entity: str, column: str) -> str | None:
    """The value of `column` for `entity` in `text` (the entity's document), or None; see the module docstring."""
    return field_value(text, column) or table_value(text, entity, column) or sentence_value(text, column, entity=entity)


def extract_cells(text: str, entity: str, columns: Sequence[str]) -> dict[str, str]:
    """Every column `extract_cell` finds a value for."""
    out: dict[str, str] = {}
    for column in columns:
        value = extract_cell(text, entity, column)
        if value:
            out[column] = value
    return out


def entity_score(text: str, entity: str, *, title: str = "", doc_id: str = "") -> float:
    """How strongly a passage is about `entity`: 0 when it never names it; its document's title or id being the
    entity, or its first line naming it as a field or a heading, beats a mention in passing."""
    key = normalise(entity)
    if not key:
        return 0.0
    word = re.compile(rf"(?<![\w-]){re.escape(entity)}(?![\w-])", re.IGNORECASE)
    if normalise(title) == key or normalise(doc_id.rsplit("/", 1)[-1]) == key:
        return 4.0
    lines = [line for line in text.splitlines() if line.strip()]
    first = lines[0] if lines else ""
    field = _FIELD.match(first)
    if normalise(first) == key or (field and normalise(field.group(2)) == key):
        return 3.0
    if word.search(first):
        return 2.0
    hits = len(word.findall(text))
    return 1.0 + min(hits, 50) / 100 if hits else 0.0


def name_pattern(item: str) -> str:
    """A grep for where `item` is documented: an API heading naming it (Crucible's corpora) or the name itself as a
    word, in any case (any text)."""
    tail = re.escape(item.rsplit(".", 1)[-1])
    pattern = rf"^#+ (class |def )?[\w.]*\b{tail}\b|(?i:(?<![\w-]){re.escape(item)}(?![\w-]))"
    return pattern if len(pattern) <= 200 else rf"(?i:(?<![\w-]){re.escape(item)[:150]})"
