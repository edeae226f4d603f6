"""Reading the files a user has into documents (`workers.search.corpus` chunks them): a folder or a zip of text,
Markdown, reStructuredText, Python and HTML files, one file at a time (`document_from_file`), and telling a zip from
other archives. Every parser names the file of each problem and the fix (`CorpusError`), and stores nothing. The
doc-id rules and the JSONL readers (documents, canonical chunks) are in `workers.search.corpus_jsonl`."""

from __future__ import annotations

import io
import re
import zipfile
import zlib
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from workers.search.corpus import (
    DOCUMENT_MAX_BYTES,
    MAX_ERRORS,
    SUPPORTED_SUFFIXES,
    CorpusError,
    Document,
    DocumentSource,
    over_document_cap,
)
from workers.search.corpus_jsonl import doc_id_problem, utf8_problem
from workers.search.formats import plain_text_to_markdown, python_to_markdown, rst_to_markdown

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
        raise CorpusError([f"{name} line {line}: {utf8_problem(data, exc)}"])


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


def read_zip_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    """A member's bytes, read up to the size the zip declares plus one byte: ValueError naming the member when it is
    corrupt or holds more than it says (a zip bomb never expands past its declared size)."""
    try:
        with archive.open(info) as handle:
            content = handle.read(info.file_size + 1)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
        raise ValueError(f"file: {info.filename} cannot be read ({exc}); re-create the zip") from None
    if len(content) > info.file_size:
        raise ValueError(f"file: {info.filename} is larger than the zip says; re-create the zip")
    return content


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
