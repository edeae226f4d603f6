"""Reading documents and chunks from JSONL (`workers.search.corpus` chunks the documents): the doc-id rules, JSONL of
documents, and canonical chunk JSONL (a stored corpus version, or one uploaded again) with its report. Every
parser names the line and the field of each problem and the fix (`CorpusError`), and stores nothing. Folders,
zips and single files (text, Markdown, reStructuredText, Python, HTML) are read by `workers.search.corpus_files`."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from workers.search.corpus import (
    CHUNK_FIELDS,
    DOCUMENT_EXAMPLE,
    DOCUMENT_FIELDS,
    DOCUMENT_MAX_BYTES,
    MAX_DOC_ID_CHARS,
    MAX_ERRORS,
    CorpusError,
    Document,
    DocumentSource,
    json_kind_name,
    over_document_cap,
)
from workers.search.types import ALSO_IN, Chunk, also_in, chunk_doc_ids, chunk_id_for


# --- doc ids ---------------------------------------------------------------------------------------------------
def doc_id_problem(doc_id: str) -> str | None:
    """Why `doc_id` cannot be used, or None when it can."""
    if not doc_id:
        return "must not be empty"
    if len(doc_id) > MAX_DOC_ID_CHARS:
        return f"is {len(doc_id)} characters; use at most {MAX_DOC_ID_CHARS}"
    if "#" in doc_id:
        return "must not contain '#' (it separates the chunk position in chunk ids like 'guide/intro#3')"
    if any(ch.isspace() for ch in doc_id):
        return "must not contain whitespace (models copy ids into tool calls); use '-' or '_' instead"
    if not doc_id.isprintable():
        return "must not contain control characters"
    return None


def utf8_problem(data: bytes, exc: UnicodeDecodeError) -> str:
    line_start = data.rfind(b"\n", 0, exc.start) + 1
    column = exc.start - line_start + 1
    return f"not valid UTF-8 (byte 0x{data[exc.start]:02x} at column {column}); re-save the file as UTF-8"


# --- JSONL of documents ----------------------------------------------------------------------------------------
def looks_like_canonical_chunks(data: bytes) -> bool:
    """True when the first non-blank line is a chunk record (a re-upload of a stored corpus version)."""
    for line in data.splitlines():
        if line.strip():
            try:
                row = json.loads(line.decode("utf-8-sig"))
            except ValueError:
                return False
            return isinstance(row, dict) and "chunk_id" in row and "position" in row
    return False


def _document_from_row(row: Any, where: str) -> tuple[Document | None, list[str]]:
    if not isinstance(row, dict):
        return None, [f"{where}: expected a JSON object like {DOCUMENT_EXAMPLE}, got {json_kind_name(row)}"]
    errors: list[str] = []
    unknown = [key for key in row if key not in DOCUMENT_FIELDS]
    if unknown:
        names = ", ".join(repr(k) for k in unknown)
        errors.append(
            f"{where}: unknown field {names}; put extra fields under 'metadata' "
            "(the fields are doc_id or id, text, title, metadata)"
        )
    if "doc_id" in row and "id" in row:
        errors.append(f"{where}: both 'doc_id' and 'id' are set; keep one")
    raw_id = row.get("doc_id", row.get("id"))
    id_field = "doc_id" if "doc_id" in row else "id"
    doc_id = ""
    if raw_id is None:
        errors.append(f"{where}: field 'doc_id' is missing; give each document a unique 'doc_id' (or 'id')")
    elif isinstance(raw_id, bool) or not isinstance(raw_id, str | int):
        errors.append(f"{where}: field '{id_field}' must be a string or an integer, got {json_kind_name(raw_id)}")
    else:
        doc_id = str(raw_id)
        problem = doc_id_problem(doc_id)
        if problem:
            errors.append(f"{where}: field '{id_field}' {problem}")
    text = row.get("text")
    if "text" not in row:
        errors.append(f"{where}: field 'text' is missing; put the document's text in 'text'")
    elif not isinstance(text, str):
        errors.append(f"{where}: field 'text' must be a string, got {json_kind_name(text)}")
    title = row.get("title")
    if title is not None and not isinstance(title, str):
        errors.append(f"{where}: field 'title' must be a string, got {json_kind_name(title)}")
    metadata = row.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        errors.append(f"{where}: field 'metadata' must be an object, got {json_kind_name(metadata)}")
    if errors:
        return None, errors
    assert isinstance(text, str)
    return Document(doc_id=doc_id, text=text, title=title or "", metadata=dict(metadata or {})), []


def _json_lines(data: bytes, errors: list[str]) -> Iterable[tuple[int, Any]]:
    """(line number, parsed value) for each non-blank line; decoding and JSON problems go to `errors`."""
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if len(errors) >= MAX_ERRORS:
            return
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]  # a byte-order mark some editors write; harmless
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            errors.append(f"line {number}: {utf8_problem(raw, exc)}")
            continue
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except ValueError as exc:
            errors.append(f"line {number}: not valid JSON ({exc}); write one JSON object per line")


def parse_documents_jsonl(data: bytes, *, max_document_bytes: int = DOCUMENT_MAX_BYTES) -> DocumentSource:
    """Documents from JSONL, one `{"doc_id" (or "id"), "text", "title"?, "metadata"?}` object per line; a text over
    `max_document_bytes` (UTF-8) is an error naming its line."""
    errors: list[str] = []
    documents: list[Document] = []
    first_line: dict[str, int] = {}
    for number, row in _json_lines(data, errors):
        document, problems = _document_from_row(row, f"line {number}")
        errors.extend(problems)
        if document is None:
            continue
        size = len(document.text.encode())
        if size > max_document_bytes:
            errors.append(f"line {number}: the text is {over_document_cap(size, max_document_bytes)}")
            continue
        if document.doc_id in first_line:
            errors.append(
                f"line {number}: doc_id {document.doc_id!r} is already used on line {first_line[document.doc_id]}; "
                "doc ids must be unique"
            )
            continue
        first_line[document.doc_id] = number
        documents.append(document)
    if errors:
        raise CorpusError(errors[:MAX_ERRORS])
    return DocumentSource(documents=documents, source="jsonl")


def validate_canonical(data: bytes) -> list[Chunk]:
    """Re-read canonical chunk JSONL (a stored corpus version, or one uploaded again) and check every line.

    Raises CorpusError naming each bad line: fields and their types, `chunk_id == <doc_id>#<position>`,
    unique chunk ids, and `metadata.also_in` (chunk ids of other documents, each used once).
    """
    errors: list[str] = []
    chunks: list[Chunk] = []
    lines: list[int] = []
    first_line: dict[str, int] = {}
    for number, row in _json_lines(data, errors):
        where = f"line {number}"
        if not isinstance(row, dict):
            errors.append(f"{where}: expected a chunk object, got {json_kind_name(row)}")
            continue
        problems = []
        missing = [key for key in ("chunk_id", "doc_id", "position", "text") if key not in row]
        if missing:
            problems.append(f"{where}: missing field(s) {', '.join(missing)}")
        unknown = [key for key in row if key not in CHUNK_FIELDS]
        if unknown:
            problems.append(f"{where}: unknown field(s) {', '.join(unknown)}; the fields are {', '.join(CHUNK_FIELDS)}")
        for key, kind in (("chunk_id", str), ("doc_id", str), ("text", str), ("title", str), ("metadata", dict)):
            if key in row and not isinstance(row[key], kind):
                problems.append(f"{where}: field '{key}' must be {'an object' if kind is dict else 'a string'}")
        position = row.get("position")
        if "position" in row and (isinstance(position, bool) or not isinstance(position, int) or position < 0):
            problems.append(f"{where}: field 'position' must be an integer >= 0")
        if problems:
            errors.extend(problems)
            continue
        problem = doc_id_problem(row["doc_id"])
        if problem:
            errors.append(f"{where}: field 'doc_id' {problem}")
            continue
        expected = chunk_id_for(row["doc_id"], int(row["position"]))
        if row["chunk_id"] != expected:
            errors.append(f"{where}: chunk_id {row['chunk_id']!r} should be {expected!r} (<doc_id>#<position>)")
            continue
        if expected in first_line:
            errors.append(f"{where}: chunk_id {expected!r} is already used on line {first_line[expected]}")
            continue
        first_line[expected] = number
        chunks.append(Chunk.from_json(row))
        lines.append(number)
    errors.extend(_also_in_problems(chunks, lines, first_line))
    if errors:
        raise CorpusError(errors[:MAX_ERRORS])
    return chunks


def _also_in_problems(chunks: Sequence[Chunk], lines: Sequence[int], first_line: Mapping[str, int]) -> list[str]:
    """Each `metadata.also_in` must list chunk ids of other documents that no other line uses (types.py)."""
    errors: list[str] = []
    alias_line: dict[str, int] = {}
    for chunk, number in zip(chunks, lines, strict=True):
        value = chunk.metadata.get(ALSO_IN)
        if value is None:
            continue
        where = f"line {number}: metadata.{ALSO_IN}"
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            errors.append(
                f'{where} must be a list of chunk ids like ["other-doc#3"] (the copies this chunk stands for)'
            )
            continue
        for alias in value:
            doc_id, _, position = alias.partition("#")
            problem = doc_id_problem(doc_id)
            if problem or not position.isdigit() or chunk_id_for(doc_id, int(position)) != alias:
                errors.append(f"{where}: {alias!r} is not a chunk id <doc_id>#<position>")
            elif doc_id == chunk.doc_id:
                errors.append(f"{where}: {alias!r} is in this chunk's own document; list only other documents")
            elif alias in first_line:
                errors.append(f"{where}: {alias!r} is a stored chunk (line {first_line[alias]}); remove one of them")
            elif alias in alias_line:
                errors.append(f"{where}: {alias!r} is already listed on line {alias_line[alias]}")
            else:
                alias_line[alias] = number
    return errors


def canonical_report(chunks: Sequence[Chunk]) -> dict[str, Any]:
    """The report of an already-chunked upload: no chunker ran, so its settings are unknown."""
    word_counts = [len(c.text.split()) for c in chunks]
    return {
        "source": "chunks",
        "documents": len({d for c in chunks for d in chunk_doc_ids(c)}),
        "chunks": len(chunks),
        "shared_chunks": sum(1 for c in chunks if also_in(c)),
        "empty_documents": 0,
        "empty_document_ids": [],
        "skipped_files": 0,
        "skipped_file_examples": [],
        "mean_words_per_chunk": round(sum(word_counts) / len(word_counts), 1) if word_counts else 0.0,
        "max_words_per_chunk": max(word_counts, default=0),
        "chunker": None,
    }
