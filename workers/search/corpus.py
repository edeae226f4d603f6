"""Corpus import: documents in (JSONL, a folder or a zip of text / Markdown / HTML files), chunks out.

A corpus dataset version is stored as canonical chunk JSONL (`workers.search.types.dump_chunks_jsonl`). This
module turns what a user has into that form:

- parsers return `Document`s or raise `CorpusError` listing every problem with its line or file and the fix;
- `chunk_document` splits one document into chunks of at most `ChunkerConfig.max_words` words, breaking at
  blank lines first, then sentence ends, then line ends, then spaces, so a chunk reads as whole paragraphs or
  sentences where the text allows it;
- `build_corpus` chunks a whole corpus and reports what it did.

Chunk ids are `<doc_id>#<position>`, so a doc id may hold neither '#' nor whitespace (a model copies ids into
`prune_chunks` and its final answer, and the harness splits them at '#').
Everything here is deterministic: the same documents and config give the same chunks, byte for byte.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from workers.search import dedup
from workers.search.types import ALSO_IN, BOILERPLATE, Chunk, chunk_id_for

MAX_ERRORS = 50

DOCUMENT_MAX_BYTES = 16 * 1024 * 1024
"""The default cap on one document (a file of a zip or folder, a JSONL document's text): a single document past it
is almost always a dump (logs, a concatenated export) that would make tens of thousands of chunks under one doc
id. The control plane's `CRUCIBLE_DOCUMENT_MAX_BYTES` sets it."""


def over_document_cap(size: int, max_document_bytes: int) -> str:
    return (
        f"{size:,} bytes, over the {max_document_bytes:,}-byte limit for one document (CRUCIBLE_DOCUMENT_MAX_BYTES); "
        "split it into smaller files"
    )


MAX_DOC_ID_CHARS = 256
REPORT_EXAMPLES = 20
SUPPORTED_SUFFIXES = (".txt", ".md", ".markdown", ".html", ".htm", ".rst", ".rest", ".py")
DOCUMENT_FIELDS = ("doc_id", "id", "text", "title", "metadata")
DOCUMENT_EXAMPLE = '{"doc_id": "guide/intro", "text": "...", "title": "Intro", "metadata": {}}'
CHUNK_FIELDS = ("chunk_id", "doc_id", "position", "title", "text", "metadata")


class CorpusError(ValueError):
    """Bad corpus input. `errors` lists each problem with where it is (line, file or option) and the fix."""

    def __init__(self, errors: Sequence[str]) -> None:
        self.errors = list(errors)
        super().__init__("; ".join(self.errors))


class ChunkerOptionError(CorpusError):
    """A bad chunker option. `fields` maps each option ('' for the whole object) to its messages."""

    def __init__(self, fields: Mapping[str, Sequence[str]]) -> None:
        self.fields = {name: list(messages) for name, messages in fields.items()}
        super().__init__(
            [f"chunker.{name}: {m}" if name else f"chunker: {m}" for name, ms in self.fields.items() for m in ms]
        )


@dataclass(frozen=True)
class Document:
    doc_id: str
    text: str
    title: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class DocumentSource:
    """What a parser read: the documents in a stable order, and the files it skipped (unsupported or hidden)."""

    documents: list[Document]
    source: str
    skipped_files: list[str] = field(default_factory=list)
    # Files that could not be read as documents, one message each ("bad.txt line 2: not valid UTF-8 ..."); the
    # other files are imported.
    rejected_files: list[str] = field(default_factory=list)


class ChunkerConfig(BaseModel):
    """How documents are cut into chunks. Stored in each corpus version's report, so a version can be rebuilt."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_words: int = Field(
        default=200,
        ge=20,
        le=5000,
        strict=True,
        description="Most words (whitespace-separated) in one chunk; a shorter document is a single chunk",
    )
    overlap_words: int = Field(
        default=0,
        ge=0,
        strict=True,
        description=(
            "At most this many words of whole sentences from the end of a chunk are repeated at the start of the "
            "next. 0 by default: repeated text makes grep and the harness's seen-chunk dedup show a sentence twice"
        ),
    )
    max_chars: int = Field(
        default=3000,
        ge=200,
        le=100_000,
        strict=True,
        description="Most characters in one chunk: a guard for long tokens (URLs, code, base64) that count as one word",
    )
    split_at_headings: bool = Field(
        default=True,
        strict=True,
        description=(
            "A paragraph that begins with a Markdown heading ('# ' to '###### ') starts a new chunk, so a chunk "
            "never mixes two sections (a run of headings stays with the text under them)"
        ),
    )

    drop_boilerplate: bool = Field(
        default=True,
        strict=True,
        description="remove short paragraphs repeated across many documents (footers, copyright lines, navigation) "
        "before chunking (workers.search.dedup)",
    )
    drop_near_duplicates: bool = Field(
        default=True,
        strict=True,
        description="a chunk whose word trigrams overlap an earlier chunk's by Jaccard 0.9 or more is dropped when "
        "its document already holds that chunk, and stored once and attributed to every document when the text is "
        "identical; a near copy in another document that differs is kept (workers.search.dedup.merge_copies)",
    )

    @field_validator("overlap_words")
    @classmethod
    def _overlap_leaves_progress(cls, value: int, info: ValidationInfo) -> int:
        max_words = info.data.get("max_words")
        if isinstance(max_words, int) and value * 2 > max_words:
            raise ValueError(f"must be at most half of max_words ({max_words}), so each chunk adds new text")
        return value


def chunker_config_from(value: str | bytes | Mapping[str, Any] | None) -> ChunkerConfig:
    """A ChunkerConfig from a JSON object (text or parsed); None or blank gives the defaults.

    Raises ChunkerOptionError naming each bad option.
    """
    if isinstance(value, ChunkerConfig):
        return value
    if value is None:
        return ChunkerConfig()
    example = '{"max_words": 150}'
    if isinstance(value, bytes | str):
        try:
            text = value.decode() if isinstance(value, bytes) else value
            if not text.strip():
                return ChunkerConfig()
            value = json.loads(text)
        except ValueError as exc:
            raise ChunkerOptionError({"": [f"not valid JSON ({exc}); write an object like {example}"]})
    if not isinstance(value, Mapping):
        raise ChunkerOptionError({"": [f"expected a JSON object like {example}, got {json_kind_name(value)}"]})
    try:
        return ChunkerConfig.model_validate(dict(value))
    except ValidationError as exc:
        allowed = ", ".join(ChunkerConfig.model_fields)
        fields: dict[str, list[str]] = {}
        for err in exc.errors():
            name = ".".join(str(part) for part in err["loc"])
            if err["type"] == "extra_forbidden":
                message = f"unknown option; the options are {allowed}"
            else:
                message = err["msg"].removeprefix("Value error, ")
            fields.setdefault(name, []).append(message)
        raise ChunkerOptionError(fields)


# --- chunking ------------------------------------------------------------------------------------------------
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n(?:[ \t]*\n)*")
_LEADING_BLANK_LINES = re.compile(r"^(?:[ \t]*\n)+")
# A sentence ends at . ! or ? (optionally closed by a quote or bracket) followed by whitespace.
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"')\]])\s+")
_LINE_BREAK = re.compile(r"[ \t]*\n\s*")
_HEADING_START = re.compile(r"#{1,6}[ \t]+\S")
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class _Unit:
    """A piece that is never split further: a paragraph, a sentence, a line or a run of words."""

    sep: str  # the whitespace that preceded it in the document ("\n\n" before a paragraph)
    text: str
    words: int
    paragraph_start: bool
    paragraph_words: int  # the whole paragraph's size, set on its first unit
    paragraph_chars: int
    section_start: bool  # first unit of a paragraph that begins with a Markdown heading
    heading_only: bool  # its paragraph is a single heading line


def _split_keeping_separators(text: str, pattern: re.Pattern[str], first_sep: str) -> list[tuple[str, str]]:
    pieces: list[tuple[str, str]] = []
    sep, pos = first_sep, 0
    for match in pattern.finditer(text):
        if match.start() > pos:
            pieces.append((sep, text[pos : match.start()]))
            sep = match.group()
        pos = match.end()
    if pos < len(text):
        pieces.append((sep, text[pos:]))
    return pieces


def _fits(text: str, config: ChunkerConfig) -> bool:
    return len(text) <= config.max_chars and len(text.split()) <= config.max_words


def _split_words(sep: str, text: str, config: ChunkerConfig) -> list[tuple[str, str]]:
    """Last resort for a line with no usable break: runs of whole words, and slices of any giant token."""
    out: list[tuple[str, str]] = []
    run: list[tuple[str, str]] = []
    run_words = run_chars = 0

    def flush() -> None:
        nonlocal run, run_words, run_chars
        if run:
            out.append((run[0][0], run[0][1] + "".join(s + w for s, w in run[1:])))
        run, run_words, run_chars = [], 0, 0

    for word_sep, word in _split_keeping_separators(text, _SPACE, sep):
        while len(word) > config.max_chars:
            flush()
            out.append((word_sep, word[: config.max_chars]))
            word, word_sep = word[config.max_chars :], ""
        added = len(word) + (len(word_sep) if run else 0)
        if run and (run_words + 1 > config.max_words or run_chars + added > config.max_chars):
            flush()
            added = len(word)
        run.append((word_sep, word))
        run_words += 1
        run_chars += added
    flush()
    return out


def _paragraph_units(paragraph: str, config: ChunkerConfig) -> list[tuple[str, str]]:
    if _fits(paragraph, config):
        return [("\n\n", paragraph)]
    pieces: list[tuple[str, str]] = []
    for sep, sentence in _split_keeping_separators(paragraph, _SENTENCE_BREAK, "\n\n"):
        if _fits(sentence, config):
            pieces.append((sep, sentence))
            continue
        for line_sep, line in _split_keeping_separators(sentence, _LINE_BREAK, sep):
            if _fits(line, config):
                pieces.append((line_sep, line))
            else:
                pieces.extend(_split_words(line_sep, line, config))
    return pieces


def _units(text: str, config: ChunkerConfig) -> list[_Unit]:
    units: list[_Unit] = []
    for paragraph in _PARAGRAPH_BREAK.split(text):
        # Leading spaces stay: they are the indentation of a code example or a quoted block.
        paragraph = _LEADING_BLANK_LINES.sub("", paragraph.rstrip())
        if not paragraph.strip():
            continue
        para_words, para_chars = len(paragraph.split()), len(paragraph)
        heading = _HEADING_START.match(paragraph) is not None
        heading_only = heading and "\n" not in paragraph
        for i, (sep, piece) in enumerate(_paragraph_units(paragraph, config)):
            units.append(
                _Unit(sep, piece, len(piece.split()), i == 0, para_words, para_chars, heading and i == 0, heading_only)
            )
    return units


def _joined_chars(units: Sequence[_Unit]) -> int:
    return sum(len(u.text) for u in units) + sum(len(u.sep) for u in units[1:])


def _overlap_tail(units: Sequence[_Unit], config: ChunkerConfig) -> list[_Unit]:
    tail: list[_Unit] = []
    words = 0
    # Never the whole chunk: the next chunk must add something new.
    for unit in reversed(units[1:]):
        if words + unit.words > config.overlap_words:
            break
        tail.insert(0, unit)
        words += unit.words
    return tail


def _pack(units: Sequence[_Unit], config: ChunkerConfig) -> list[list[_Unit]]:
    groups: list[list[_Unit]] = []
    current: list[_Unit] = []
    words = chars = 0
    for unit in units:
        if current and config.split_at_headings and unit.section_start and not all(u.heading_only for u in current):
            # A new section: no overlap, the previous section's last sentence says nothing about this one.
            groups.append(current)
            current = []
        if current:
            grown_words = words + unit.words
            grown_chars = chars + len(unit.sep) + len(unit.text)
            # Start a new paragraph in a fresh chunk when it will not fit whole here and this chunk is already
            # half full: chunks then begin where the author began a thought.
            paragraph_breaks_early = (
                unit.paragraph_start
                and (
                    words + unit.paragraph_words > config.max_words
                    or chars + 2 + unit.paragraph_chars > config.max_chars
                )
                and words * 2 >= config.max_words
            )
            if paragraph_breaks_early or grown_words > config.max_words or grown_chars > config.max_chars:
                groups.append(current)
                current = _overlap_tail(current, config) if config.overlap_words else []
                if current and not _fits_with(current, unit, config):
                    current = []
        current.append(unit)
        words = sum(u.words for u in current)
        chars = _joined_chars(current)
    if current:
        groups.append(current)
    return groups


def _fits_with(current: Sequence[_Unit], unit: _Unit, config: ChunkerConfig) -> bool:
    words = sum(u.words for u in current) + unit.words
    chars = _joined_chars(current) + len(unit.sep) + len(unit.text)
    return words <= config.max_words and chars <= config.max_chars


def _normalise_newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _heading_of(unit: _Unit) -> tuple[int, str] | None:
    if not unit.section_start:
        return None
    line = unit.text.split("\n", 1)[0]
    marks = len(line) - len(line.lstrip("#"))
    return marks, line[marks:].strip(" \t#")


def chunk_document(document: Document, config: ChunkerConfig) -> list[Chunk]:
    """Split one document into chunks (positions 0, 1, ...); a blank document gives none.

    Each chunk holds at most `config.max_words` words and `config.max_chars` characters. The text keeps the
    document's own whitespace inside a paragraph; paragraphs are joined by one blank line. A chunk inside a
    section keeps the path of headings above it (`Reference > Settings`, the document title left out) as
    `metadata["section"]`: the index reads it with the title, so a chunk cut from the middle of a section still
    says what it is about.
    """
    groups = _pack(_units(_normalise_newlines(document.text), config), config)
    chunks = []
    path: list[tuple[int, str]] = []
    for position, group in enumerate(groups):
        text = group[0].text + "".join(u.sep + u.text for u in group[1:])
        first = _heading_of(group[0])
        above = [title for level, title in path if first is None or level < first[0]]
        for unit in group:
            heading = _heading_of(unit)
            if heading is not None:
                path = [entry for entry in path if entry[0] < heading[0]] + [heading]
        metadata = dict(document.metadata)
        section = " > ".join(t for t in above if t and t != document.title)
        if section:
            metadata["section"] = section
        chunks.append(
            Chunk(
                chunk_id=chunk_id_for(document.doc_id, position),
                doc_id=document.doc_id,
                position=position,
                text=text,
                title=document.title,
                metadata=metadata,
            )
        )
    return chunks


def build_corpus(
    documents: Iterable[Document],
    config: ChunkerConfig | None = None,
    *,
    skipped_files: Sequence[str] = (),
    rejected_files: Sequence[str] = (),
    source: str = "",
) -> tuple[list[Chunk], dict[str, Any]]:
    """Chunk every document, in order. Returns (chunks, report).

    The report counts documents that gave chunks, blank documents (no chunks), skipped files, chunks and words
    per chunk, what the repeated-text filters did, and records the chunker settings. Near-duplicate filtering
    never deletes a document's text (`dedup.merge_copies`): a copy within a document is dropped, a chunk that
    several documents hold word for word is stored once with the others' ids in `metadata["also_in"]`.
    """
    # One function on purpose: one pass over the documents: chunking, the repeated-text filters and the report's
    # counts advance together.
    config = config or ChunkerConfig()
    documents = list(documents)
    boilerplate = dedup.boilerplate_paragraphs([d.text for d in documents]) if config.drop_boilerplate else set()
    chunks: list[Chunk] = []
    empty: list[str] = []
    documents_with_text = 0
    paragraphs_removed = 0
    for document in documents:
        text, removed = dedup.split_paragraphs(document.text, boilerplate)
        paragraphs_removed += len(removed)
        if removed:
            document = Document(document.doc_id, text, document.title, document.metadata)
        produced = chunk_document(document, config)
        # Boilerplate is set apart, never deleted: each paragraph becomes a chunk of its own after the document's
        # text, which the merge below stores once and attributes to every document that holds it word for word.
        for paragraph in removed:
            position = len(produced)
            produced.append(
                Chunk(
                    chunk_id_for(document.doc_id, position),
                    document.doc_id,
                    position,
                    paragraph,
                    document.title,
                    {**document.metadata, BOILERPLATE: True},
                )
            )
        if produced:
            documents_with_text += 1
            chunks.extend(produced)
        else:
            empty.append(document.doc_id)
    merge = (
        dedup.merge_copies([c.text for c in chunks], [c.doc_id for c in chunks])
        if config.drop_near_duplicates
        else dedup.Merge()
    )
    if merge.dropped or merge.shared:
        # A copy in another document is attributed to the stored chunk, under the id it would have had.
        aliases: dict[int, list[str]] = {}
        for i, kept in sorted(merge.shared.items()):
            aliases.setdefault(kept, []).append(chunks[i].chunk_id)
        for kept, ids in aliases.items():
            chunk = chunks[kept]
            chunks[kept] = Chunk(
                chunk.chunk_id, chunk.doc_id, chunk.position, chunk.text, chunk.title, {**chunk.metadata, ALSO_IN: ids}
            )
        # Positions keep their gaps, so a chunk's id does not depend on whether a copy of it came first.
        chunks = [c for i, c in enumerate(chunks) if i not in merge.dropped and i not in merge.shared]
    shared_chunks = sum(1 for c in chunks if c.metadata.get(ALSO_IN))
    word_counts = [len(c.text.split()) for c in chunks]
    report: dict[str, Any] = {
        "source": source,
        "documents": documents_with_text,
        "chunks": len(chunks),
        "empty_documents": len(empty),
        "empty_document_ids": empty[:REPORT_EXAMPLES],
        "skipped_files": len(skipped_files),
        # ascii() for odd names: the report is stored in PostgreSQL JSON, which refuses NUL characters.
        "skipped_file_examples": [p if p.isprintable() else ascii(p) for p in skipped_files[:REPORT_EXAMPLES]],
        "rejected_files": len(rejected_files),
        "rejected_file_reasons": [m if m.isprintable() else ascii(m) for m in rejected_files[:MAX_ERRORS]],
        "boilerplate_paragraphs": len(boilerplate),
        # Paragraphs set apart from the documents' text, each kept as a chunk of its own (stored once when shared).
        "boilerplate_paragraphs_removed": paragraphs_removed,
        "boilerplate_chunks": sum(1 for c in chunks if c.metadata.get(BOILERPLATE)),
        # Within a document: a copy of a chunk the document already holds.
        "near_duplicate_chunks_dropped": len(merge.dropped),
        # Across documents: text held word for word by 2+ documents, stored once and attributed to each of them.
        "shared_chunks": shared_chunks,
        "shared_chunk_copies_merged": len(merge.shared),
        "near_duplicates_kept_across_documents": len(merge.kept_near),
        "mean_words_per_chunk": round(sum(word_counts) / len(word_counts), 1) if word_counts else 0.0,
        "max_words_per_chunk": max(word_counts, default=0),
        "chunker": config.model_dump(),
    }
    return chunks, report


def json_kind_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"
