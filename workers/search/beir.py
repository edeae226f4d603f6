"""BEIR datasets as they are published: a zip holding `corpus.jsonl`, `queries.jsonl` and `qrels/<split>.tsv`
(usually under one top folder, e.g. `scifact/`), read into a corpus's documents and one retrieval task row per
judged query.

- `corpus.jsonl`: one `{"_id", "title", "text", "metadata"?}` object per line. The document's text is `text`
  (its `title` alone when the text is blank); the title is kept as the document's title.
- `queries.jsonl`: one `{"_id", "text", "metadata"?}` object per line; only the queries a chosen split judges are
  kept.
- `qrels/<split>.tsv`: `query-id<TAB>corpus-id<TAB>score` per line, an optional header line first; `score` is the
  graded relevance (an integer; 0 is judged not relevant). Every query and document it names must be in the other
  two files.

A task row (`tasks` dataset) per query with at least one relevant document (score >= 1, BEIR's relevance level):
`{"id": query id, "prompt": query text, "gold_doc_ids": [...], "relevance": {doc id: score}, "query_set": split,
"source": "beir"}`; `gold_doc_ids` lists the relevant documents, highest score first. The retrieval harness scores
such rows at the document level (`workers.search.retrieval_docs`).

Every problem is named with its file, line and field (`BeirError`, at most `MAX_ERRORS`), and nothing is returned
when there is one.
"""

from __future__ import annotations

import io
import json
import posixpath
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from workers.search.corpus import MAX_ERRORS, Document, DocumentSource, json_kind_name, over_document_cap
from workers.search.corpus_files import read_zip_member
from workers.search.corpus_jsonl import doc_id_problem, utf8_problem

SOURCE = "beir"
RELEVANT = 1  # BEIR's relevance level: a judged score at or above it is relevant (pytrec_eval's default)
QRELS_HEADER = ("query-id", "corpus-id", "score")


class BeirError(ValueError):
    """Problems of a BEIR upload, each naming its file, line and field."""

    def __init__(self, errors: Sequence[str]) -> None:
        self.errors = list(errors)[:MAX_ERRORS]
        super().__init__("; ".join(self.errors))


@dataclass(frozen=True)
class BeirDataset:
    """What an archive held: the documents (a corpus), the task rows of the chosen splits, and counts."""

    documents: DocumentSource
    tasks: list[dict[str, Any]]
    report: dict[str, Any]


def _lines(data: bytes, name: str, errors: list[str]) -> Iterable[tuple[int, str]]:
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if len(errors) >= MAX_ERRORS:
            return
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        try:
            line = raw.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as exc:
            errors.append(f"{name} line {number}: {utf8_problem(raw, exc)}")
            continue
        if line.strip():
            yield number, line


def _objects(data: bytes, name: str, example: str, errors: list[str]) -> Iterable[tuple[int, dict[str, Any]]]:
    for number, line in _lines(data, name, errors):
        try:
            row = json.loads(line)
        except ValueError as exc:
            errors.append(f"{name} line {number}: not valid JSON ({exc}); write one JSON object per line")
            continue
        if not isinstance(row, dict):
            errors.append(f"{name} line {number}: expected an object like {example}, got {json_kind_name(row)}")
            continue
        yield number, row


def _id_of(row: dict[str, Any], where: str, errors: list[str]) -> str | None:
    raw = row.get("_id")
    if raw is None:
        errors.append(f"{where}: field '_id' is missing")
        return None
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        errors.append(f"{where}: field '_id' must be a string or an integer, got {json_kind_name(raw)}")
        return None
    ident = str(raw)
    problem = doc_id_problem(ident)
    if problem:
        errors.append(f"{where}: field '_id' {problem}")
        return None
    return ident


def _text_field(row: dict[str, Any], field: str, where: str, errors: list[str]) -> str | None:
    value = row.get(field, "")
    if not isinstance(value, str):
        errors.append(f"{where}: field '{field}' must be a string, got {json_kind_name(value)}")
        return None
    return value


def parse_corpus(data: bytes, *, name: str = "corpus.jsonl", max_document_bytes: int) -> list[Document]:
    """The documents of a BEIR `corpus.jsonl`; raises `BeirError` naming each bad line and field."""
    errors: list[str] = []
    documents: list[Document] = []
    first_line: dict[str, int] = {}
    example = '{"_id": "d1", "title": "...", "text": "..."}'
    for number, row in _objects(data, name, example, errors):
        where = f"{name} line {number}"
        ident = _id_of(row, where, errors)
        title = _text_field(row, "title", where, errors)
        if "text" not in row:
            errors.append(f"{where}: field 'text' is missing; BEIR documents hold their text in 'text'")
            continue
        text = _text_field(row, "text", where, errors)
        metadata = row.get("metadata", {})
        if not isinstance(metadata, dict):
            errors.append(f"{where}: field 'metadata' must be an object, got {json_kind_name(metadata)}")
            continue
        if ident is None or title is None or text is None:
            continue
        if not text.strip() and not title.strip():
            errors.append(f"{where}: document {ident!r} has neither 'text' nor 'title'")
            continue
        if ident in first_line:
            errors.append(f"{where}: field '_id' {ident!r} is already used on line {first_line[ident]}")
            continue
        body = text if text.strip() else title
        size = len(body.encode())
        if size > max_document_bytes:
            errors.append(f"{where}: field 'text' is {over_document_cap(size, max_document_bytes)}")
            continue
        first_line[ident] = number
        documents.append(Document(doc_id=ident, text=body, title=title.strip(), metadata=dict(metadata)))
    if not documents and not errors:
        errors.append(f"{name}: no documents")
    if errors:
        raise BeirError(errors)
    return documents


def parse_queries(data: bytes, *, name: str = "queries.jsonl") -> dict[str, str]:
    """{query id: text} of a BEIR `queries.jsonl`; raises `BeirError` naming each bad line and field."""
    errors: list[str] = []
    queries: dict[str, str] = {}
    first_line: dict[str, int] = {}
    for number, row in _objects(data, name, '{"_id": "q1", "text": "..."}', errors):
        where = f"{name} line {number}"
        ident = _id_of(row, where, errors)
        if "text" not in row:
            errors.append(f"{where}: field 'text' is missing; BEIR queries hold their question in 'text'")
            continue
        text = _text_field(row, "text", where, errors)
        if ident is None or text is None:
            continue
        if not text.strip():
            errors.append(f"{where}: field 'text' is blank")
            continue
        if ident in first_line:
            errors.append(f"{where}: field '_id' {ident!r} is already used on line {first_line[ident]}")
            continue
        first_line[ident] = number
        queries[ident] = text.strip()
    if errors:
        raise BeirError(errors)
    return queries


def parse_qrels(data: bytes, *, name: str) -> dict[str, dict[str, int]]:
    """{query id: {corpus id: score}} of one BEIR qrels TSV; raises `BeirError` naming each bad line and column."""
    errors: list[str] = []
    qrels: dict[str, dict[str, int]] = {}
    seen: dict[tuple[str, str], int] = {}
    for number, line in _lines(data, name, errors):
        cells = line.split("\t")
        if number == 1 and tuple(c.strip().lower() for c in cells[:3]) == QRELS_HEADER:
            continue
        where = f"{name} line {number}"
        if len(cells) == 4:  # TREC's layout: query-id, iteration (ignored), corpus-id, score
            cells = [cells[0], cells[2], cells[3]]
        if len(cells) != 3:
            errors.append(f"{where}: expected 3 tab-separated columns (query-id, corpus-id, score), got {len(cells)}")
            continue
        query_id, doc_id, score_text = (c.strip() for c in cells)
        if not query_id:
            errors.append(f"{where}: column 'query-id' is empty")
            continue
        if not doc_id:
            errors.append(f"{where}: column 'corpus-id' is empty")
            continue
        try:
            score = int(score_text)
        except ValueError:
            errors.append(f"{where}: column 'score' must be an integer relevance grade, got {score_text!r}")
            continue
        if (query_id, doc_id) in seen:
            errors.append(
                f"{where}: query {query_id!r} judges corpus-id {doc_id!r} again (first on line "
                f"{seen[(query_id, doc_id)]})"
            )
            continue
        seen[(query_id, doc_id)] = number
        qrels.setdefault(query_id, {})[doc_id] = score
    if not qrels and not errors:
        errors.append(f"{name}: no judgements")
    if errors:
        raise BeirError(errors)
    return qrels


def task_rows(
    queries: dict[str, str], qrels_by_split: dict[str, dict[str, dict[str, int]]], doc_ids: set[str]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One task row per judged query with a relevant document (module docstring), and the counts per split.
    Raises `BeirError` for a qrel naming a query or a document the other files lack, and for a query two splits
    both judge."""
    errors: list[str] = []
    rows: list[dict[str, Any]] = []
    counts: dict[str, Any] = {}
    owner: dict[str, str] = {}
    for split, qrels in qrels_by_split.items():
        name = f"qrels/{split}.tsv"
        kept = judged_only = 0
        for query_id, judged in qrels.items():
            if query_id not in queries:
                errors.append(f"{name}: query-id {query_id!r} is not in queries.jsonl")
                continue
            missing = [doc for doc in judged if doc not in doc_ids]
            if missing:
                errors.append(
                    f"{name}: query {query_id!r} judges corpus-id {missing[0]!r}, which is not in corpus.jsonl"
                    + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
                )
                continue
            if query_id in owner:
                errors.append(
                    f"{name}: query {query_id!r} is also judged in qrels/{owner[query_id]}.tsv; import one split "
                    "at a time (splits=...)"
                )
                continue
            owner[query_id] = split
            gold = sorted((doc for doc, score in judged.items() if score >= RELEVANT), key=lambda d: -judged[d])
            if not gold:
                judged_only += 1
                continue
            kept += 1
            rows.append(
                {
                    "id": query_id,
                    "prompt": queries[query_id],
                    "gold_doc_ids": gold,
                    "relevance": dict(judged),
                    "query_set": split,
                    "source": SOURCE,
                }
            )
            if len(errors) >= MAX_ERRORS:
                break
        counts[split] = {"queries": kept, "without_relevant_documents": judged_only}
    if errors:
        raise BeirError(errors)
    if not rows:
        raise BeirError(["qrels: no query has a relevant document (a score of 1 or more)"])
    return rows, counts


def _members(data: bytes, max_bytes: int) -> dict[str, bytes]:
    """{path without the top folder: bytes} of the archive's corpus, queries and qrels files."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise BeirError([f"file: not a readable zip ({exc}); upload the BEIR dataset's zip as published"]) from None
    wanted: dict[str, zipfile.ZipInfo] = {}
    for info in archive.infolist():
        if info.is_dir():
            continue
        path = posixpath.normpath(info.filename.replace("\\", "/"))
        parts = [p for p in path.split("/") if p not in ("", ".")]
        if any(p == ".." for p in parts) or any(p.startswith(".") or p == "__MACOSX" for p in parts):
            continue
        for start in range(min(2, len(parts))):  # the files at the top, or under one top folder
            rest = "/".join(parts[start:])
            if rest in ("corpus.jsonl", "queries.jsonl") or (
                rest.startswith("qrels/") and rest.endswith(".tsv") and rest.count("/") == 1
            ):
                if rest in wanted:
                    raise BeirError([f"file: the zip holds {rest} twice ({wanted[rest].filename}, {info.filename})"])
                wanted[rest] = info
                break
    total = sum(info.file_size for info in wanted.values())
    if total > max_bytes:
        raise BeirError([f"file: the BEIR files unpack to {total} bytes; the limit is {max_bytes}"])
    out: dict[str, bytes] = {}
    for rest, info in wanted.items():
        try:
            out[rest] = read_zip_member(archive, info)
        except ValueError as exc:
            raise BeirError([str(exc)]) from None
    return out


def read_beir_zip(data: bytes, *, splits: Sequence[str] = (), max_bytes: int, max_document_bytes: int) -> BeirDataset:
    """A published BEIR zip as documents and task rows (module docstring). `splits` picks qrels files by name
    (`test`, `dev`, `train`); empty: every one the archive holds."""
    members = _members(data, max_bytes)
    missing = [name for name in ("corpus.jsonl", "queries.jsonl") if name not in members]
    available = sorted(name[len("qrels/") : -len(".tsv")] for name in members if name.startswith("qrels/"))
    if not available:
        missing.append("qrels/<split>.tsv")
    if missing:
        raise BeirError(
            [
                f"file: the zip has no {', '.join(missing)}; a BEIR dataset holds corpus.jsonl, queries.jsonl and "
                "qrels/<split>.tsv (at the top or under one folder)"
            ]
        )
    chosen = list(dict.fromkeys(s.strip() for s in splits if s.strip())) or available
    unknown = [s for s in chosen if s not in available]
    if unknown:
        raise BeirError([f"split: {', '.join(unknown)} not in the zip; it has qrels for {', '.join(available)}"])
    errors: list[str] = []
    documents: list[Document] = []
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, dict[str, int]]] = {}
    try:
        documents = parse_corpus(members["corpus.jsonl"], max_document_bytes=max_document_bytes)
    except BeirError as exc:
        errors.extend(exc.errors)
    try:
        queries = parse_queries(members["queries.jsonl"])
    except BeirError as exc:
        errors.extend(exc.errors)
    for split in chosen:
        try:
            qrels[split] = parse_qrels(members[f"qrels/{split}.tsv"], name=f"qrels/{split}.tsv")
        except BeirError as exc:
            errors.extend(exc.errors)
    if errors:
        raise BeirError(errors)
    rows, counts = task_rows(queries, qrels, {d.doc_id for d in documents})
    report = {
        "source": SOURCE,
        "documents": len(documents),
        "queries_in_file": len(queries),
        "splits": counts,
        "tasks": len(rows),
    }
    return BeirDataset(documents=DocumentSource(documents=documents, source=SOURCE), tasks=rows, report=report)
