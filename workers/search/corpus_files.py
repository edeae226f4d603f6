"""Reading what a user has into documents (`workers.search.corpus` chunks them): doc-id rules, JSONL of documents
and canonical chunk JSONL, a folder or a zip of text, Markdown, reStructuredText, Python and HTML files. Every
parser names the line or file and the field of each problem and the fix (`CorpusError`), and stores nothing."""

from __future__ import annotations

import io
import json
import re
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from workers.search.corpus import (
    CHUNK_FIELDS,
    DOCUMENT_EXAMPLE,
    DOCUMENT_FIELDS,
    DOCUMENT_MAX_BYTES,
    MAX_DOC_ID_CHARS,
    MAX_ERRORS,
    SUPPORTED_SUFFIXES,
    CorpusError,
    Document,
    DocumentSource,
    json_kind_name,
    over_document_cap,
)
from workers.search.formats import plain_text_to_markdown, python_to_markdown, rst_to_markdown
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


def _utf8_problem(data: bytes, exc: UnicodeDecodeError) -> str:
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
            errors.append(f"line {number}: {_utf8_problem(raw, exc)}")
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


# --- files: a folder or a zip ----------------------------------------------------------------------------------
_MARKDOWN_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.MULTILINE)
# Tags whose content reads as its own paragraph once the markup is gone.
_HTML_BLOCKS = (
    "address article aside blockquote dd div dl dt figcaption figure footer form h1 h2 h3 h4 h5 h6 header hr li "
    "main nav ol p pre section table tbody thead tfoot tr td th ul"
).split()
_HTML_DROPPED = ("script", "style", "noscript", "template", "svg", "head", "title", "nav", "header", "footer", "aside")
# Page furniture marked by role (Sphinx themes mark their sidebars and footers so): dropped with its content.
_HTML_FURNITURE_ROLES = ("navigation", "banner", "contentinfo", "search", "complementary")


def html_to_text(html: str) -> tuple[str, str]:
    """(title, text) of an HTML page: <title>, then the visible text with blocks as paragraphs."""
    from bs4 import BeautifulSoup
    from bs4.element import Comment, NavigableString

    soup = BeautifulSoup(html, "html.parser")
    title_tag = soup.find("title")
    title = " ".join(title_tag.get_text().split()) if title_tag else ""
    for tag in soup.find_all(_HTML_DROPPED):
        tag.decompose()
    for tag in soup.find_all(lambda tag: tag.get("role") in _HTML_FURNITURE_ROLES):
        tag.decompose()
    for comment in soup.find_all(string=lambda s: isinstance(s, Comment)):
        comment.extract()
    # Browsers collapse whitespace in running text (pre keeps its lines); block elements start new paragraphs.
    for string in soup.find_all(string=True):
        if type(string) is NavigableString and string.find_parent("pre") is None:
            string.replace_with(NavigableString(re.sub(r"[ \t\r\n\f]+", " ", str(string))))
    for br in soup.find_all("br"):
        br.replace_with(NavigableString("\n"))
    # Headings become Markdown headings, so the chunker's split_at_headings sees HTML sections too.
    for heading in soup.find_all(["h1", "h2", "h3", "h4", "h5", "h6"]):
        heading.insert(0, NavigableString("#" * int(heading.name[1]) + " "))
    # A definition term (an API entry's signature in Sphinx and pydoc pages, a glossary term) heads what follows.
    for term in soup.find_all("dt"):
        if term.get_text(strip=True):
            term.insert(0, NavigableString("###### "))
    for block in soup.find_all(_HTML_BLOCKS):
        block.insert_before(NavigableString("\n\n"))
        block.insert_after(NavigableString("\n\n"))
    text = soup.get_text()
    lines = [line.strip() for line in text.split("\n")]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    return title, text


def _decode_file(name: str, data: bytes) -> str:
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise CorpusError([f"{name} line {line}: {_utf8_problem(data, exc)}"])


def document_from_file(relative_path: str, data: bytes) -> Document | None:
    """A document from one file's bytes, or None for an unsupported extension.

    doc_id is the path without its extension ('/' separators, whitespace and '#' replaced by '_'); the title is
    the first Markdown heading, the HTML <title>, or the file name.
    """
    path = PurePosixPath(relative_path)
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        return None
    if b"\x00" in data[:65536]:
        raise CorpusError([f"{relative_path}: a binary file (it holds NUL bytes), not text; leave it out"])
    text = _decode_file(relative_path, data)
    title = ""
    if suffix in (".html", ".htm"):
        title, text = html_to_text(text)
    elif suffix == ".py":
        # The module's dotted name titles it, so the task generator knows what the document is about.
        title = ".".join(path.with_suffix("").parts).removesuffix(".__init__")
        try:
            text = python_to_markdown(text, title)
        except SyntaxError as exc:
            raise CorpusError([f"{relative_path} line {exc.lineno}: not valid Python ({exc.msg}); fix or remove it"])
    elif suffix in (".rst", ".rest"):
        text = rst_to_markdown(text)
    elif suffix == ".txt":
        text = plain_text_to_markdown(text)
    if suffix in (".md", ".markdown", ".rst", ".rest", ".txt"):
        heading = _MARKDOWN_HEADING.search(text)
        title = heading.group(1).strip() if heading else ""
    doc_id = re.sub(r"[\s#]+", "_", str(path.with_suffix("")))
    return Document(
        doc_id=doc_id,
        text=text,
        title=title or path.stem,
        metadata={"path": relative_path},
    )


def _hidden(relative_path: str) -> bool:
    return any(part.startswith(".") or part == "__MACOSX" for part in PurePosixPath(relative_path).parts)


def _documents_from_files(
    files: Iterable[tuple[str, bytes, int]], source: str, max_document_bytes: int = DOCUMENT_MAX_BYTES
) -> DocumentSource:
    """Documents from (relative path, bytes, size) in path order (`size` is the file's own: a file over
    `max_document_bytes` need not be read whole). A file that cannot be a document (not UTF-8,
    binary, Python that does not parse, a doc id taken by another file, over `max_document_bytes`) is rejected
    with a message naming it, and the others are read: one bad file in a large archive does not cost the rest."""
    errors: list[str] = []
    documents: list[Document] = []
    skipped: list[str] = []
    first_path: dict[str, str] = {}
    for relative_path, data, size in files:
        if _hidden(relative_path):
            skipped.append(relative_path)
            continue
        if max(size, len(data)) > max_document_bytes:
            if PurePosixPath(relative_path).suffix.lower() in SUPPORTED_SUFFIXES:
                errors.append(f"{relative_path}: {over_document_cap(max(size, len(data)), max_document_bytes)}")
            else:
                skipped.append(relative_path)
            continue
        try:
            document = document_from_file(relative_path, data)
        except CorpusError as exc:
            errors.extend(exc.errors)
            continue
        if document is None:
            skipped.append(relative_path)
            continue
        problem = doc_id_problem(document.doc_id)
        if problem:
            errors.append(f"{relative_path}: its doc_id {document.doc_id!r} {problem}; rename the file")
        elif document.doc_id in first_path:
            errors.append(
                f"{relative_path}: gives doc_id {document.doc_id!r}, as does {first_path[document.doc_id]}; "
                "rename one of them"
            )
        else:
            first_path[document.doc_id] = relative_path
            documents.append(document)
    return DocumentSource(documents=documents, source=source, skipped_files=skipped, rejected_files=errors)


def _too_big(max_bytes: int) -> CorpusError:
    return CorpusError(
        [f"the files hold more than {max_bytes} bytes uncompressed (the dataset size limit); split the corpus"]
    )


def parse_documents_folder(
    folder: str | Path, *, max_bytes: int | None = None, max_document_bytes: int = DOCUMENT_MAX_BYTES
) -> DocumentSource:
    """Documents from every .txt/.md/.markdown/.html/.htm file under `folder`, recursively, in path order.

    Hidden files and folders (a leading '.') are skipped, as are other extensions; both are counted.
    """
    root = Path(folder)
    if not root.is_dir():
        raise CorpusError([f"{folder}: not a folder; pass the folder that holds the documents"])
    paths = sorted((p for p in root.rglob("*") if p.is_file()), key=lambda p: p.relative_to(root).as_posix())

    def files() -> Iterable[tuple[str, bytes, int]]:
        total = 0
        for path in paths:
            relative = path.relative_to(root).as_posix()
            if path.suffix.lower() not in SUPPORTED_SUFFIXES or _hidden(relative):
                yield relative, b"", 0  # skipped below, without reading it
                continue
            size = path.stat().st_size
            if size > max_document_bytes:
                yield relative, b"", size  # refused by its size below, without reading it
                continue
            data = path.read_bytes()
            total += len(data)
            if max_bytes is not None and total > max_bytes:
                raise _too_big(max_bytes)
            yield relative, data, len(data)

    return _documents_from_files(files(), source="folder", max_document_bytes=max_document_bytes)


def _archive_path_problem(name: str) -> str | None:
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        return "is an absolute path"
    if ".." in re.split(r"[\\/]", name):
        return "climbs out of the archive with '..'"
    return None


def parse_documents_zip(data: bytes, *, max_bytes: int, max_document_bytes: int = DOCUMENT_MAX_BYTES) -> DocumentSource:
    """Documents from a zip of a folder (as `parse_documents_folder` reads it).

    When every file sits under one top-level folder, that folder is dropped from the doc ids, so zipping a
    folder gives the ids that importing it directly does. Total uncompressed bytes are capped at `max_bytes`
    (read, not trusted from the archive's header), and absolute or '..' paths are refused.
    """
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError) as exc:
        raise CorpusError([f"file: not a readable zip archive ({exc}); re-create it with a zip tool"])
    with archive:
        entries = [info for info in archive.infolist() if not info.is_dir()]
        bad = [
            f"zip entry {info.filename!r} {problem}; zip the folder's contents with relative paths"
            for info in entries
            if (problem := _archive_path_problem(info.filename))
        ]
        if bad:
            raise CorpusError(bad[:MAX_ERRORS])
        if sum(info.file_size for info in entries) > max_bytes:
            raise _too_big(max_bytes)
        names = sorted(info.filename.replace("\\", "/") for info in entries)
        by_name = {info.filename.replace("\\", "/"): info for info in entries}
        visible = [n for n in names if not _hidden(n)]
        tops = {n.split("/", 1)[0] for n in visible}
        prefix = f"{next(iter(tops))}/" if len(tops) == 1 and all("/" in n for n in visible) else ""

        def files() -> Iterable[tuple[str, bytes, int]]:
            remaining = max_bytes
            for name in names:
                relative = name[len(prefix) :] if prefix and name.startswith(prefix) else name
                if PurePosixPath(name).suffix.lower() not in SUPPORTED_SUFFIXES or _hidden(name):
                    yield relative, b"", 0
                    continue
                if by_name[name].file_size > max_document_bytes:
                    yield relative, b"", by_name[name].file_size  # refused by its size, not read
                    continue
                try:
                    with archive.open(by_name[name]) as handle:
                        # A header can understate the size: read no further than the caps allow.
                        content = handle.read(min(remaining, max_document_bytes) + 1)
                except (zipfile.BadZipFile, NotImplementedError, RuntimeError, OSError) as exc:
                    raise CorpusError([f"zip entry {name!r}: cannot be read ({exc}); re-create the archive"])
                remaining -= len(content)
                if remaining < 0:
                    raise _too_big(max_bytes)
                yield relative, content, len(content)

        return _documents_from_files(files(), source="zip", max_document_bytes=max_document_bytes)


def is_zip(data: bytes) -> bool:
    return data[:4] in (b"PK\x03\x04", b"PK\x05\x06")


_ARCHIVE_MAGIC = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"(\xb5/\xfd", "zstd"),
    (b"7z\xbc\xaf'\x1c", "7z"),
    (b"Rar!\x1a\x07", "rar"),
)


def other_archive(data: bytes) -> str | None:
    """The kind of a compressed file or archive that is not a zip (gzip, bzip2, xz, zstd, 7z, rar, tar), or None."""
    for magic, kind in _ARCHIVE_MAGIC:
        if data.startswith(magic):
            return kind
    if data[257:262] == b"ustar":
        return "tar"
    return None
