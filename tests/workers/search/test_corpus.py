from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest

from workers.search.corpus import (
    ChunkerConfig,
    ChunkerOptionError,
    CorpusError,
    Document,
    build_corpus,
    chunk_document,
    chunker_config_from,
)
from workers.search.corpus_files import html_to_text, parse_documents_folder, parse_documents_zip
from workers.search.corpus_jsonl import looks_like_canonical_chunks, parse_documents_jsonl, validate_canonical
from workers.search.stdlib_corpus import STDLIB_MODULES, stdlib_documents
from workers.search.types import dump_chunks_jsonl, iter_chunks_jsonl


def _sentences(prefix: str, count: int, words: int = 8) -> str:
    """`count` sentences of exactly `words` words each, numbered so every chunk boundary is visible."""
    filler = " ".join(["word"] * (words - 2))
    return " ".join(f"{prefix}{i} {filler} end." for i in range(count))


def _jsonl(*rows: object) -> bytes:
    return b"".join(json.dumps(row).encode() + b"\n" for row in rows)


# --- chunker ---------------------------------------------------------------------------------------------------
def test_a_document_shorter_than_the_limit_is_one_chunk_with_a_stable_id() -> None:
    doc = Document("guide/intro", "  One short paragraph.\n\nAnd another.  \n", title="Intro", metadata={"k": 1})
    (chunk,) = chunk_document(doc, ChunkerConfig())
    assert chunk.chunk_id == "guide/intro#0" and chunk.position == 0
    assert chunk.text == "  One short paragraph.\n\nAnd another."
    assert chunk.title == "Intro" and chunk.metadata == {"k": 1}


def test_chunking_is_deterministic_and_keeps_every_word_in_order_without_overlap() -> None:
    text = "\n\n".join(_sentences(f"p{p}s", 13) for p in range(9))
    doc = Document("d", text)
    config = ChunkerConfig(max_words=60)
    first, second = chunk_document(doc, config), chunk_document(doc, config)
    assert first == second
    assert [c.chunk_id for c in first] == [f"d#{i}" for i in range(len(first))]
    assert all(len(c.text.split()) <= 60 for c in first)
    assert [w for c in first for w in c.text.split()] == text.split()


def test_chunks_break_at_blank_lines_when_a_paragraph_would_not_fit_whole() -> None:
    paragraphs = [_sentences(f"p{p}s", 15) for p in range(3)]  # 120 words each
    chunks = chunk_document(Document("d", "\n\n".join(paragraphs)), ChunkerConfig(max_words=200))
    assert [c.text for c in chunks] == paragraphs


def test_a_long_paragraph_breaks_at_sentence_ends() -> None:
    chunks = chunk_document(Document("d", _sentences("s", 40)), ChunkerConfig(max_words=50))
    assert len(chunks) == 7  # 6 sentences of 8 words fit in 50
    assert all(c.text.endswith("end.") and c.text.startswith("s") for c in chunks)


def test_overlap_repeats_whole_trailing_sentences_up_to_the_limit() -> None:
    chunks = chunk_document(Document("d", _sentences("s", 30)), ChunkerConfig(max_words=40, overlap_words=20))
    for previous, current in zip(chunks, chunks[1:], strict=False):
        shared = previous.text.split()[-16:]  # two 8-word sentences fit in 20 words, three do not
        assert current.text.split()[:16] == shared
        assert len(current.text.split()) <= 40


def test_a_markdown_heading_starts_a_new_chunk_unless_disabled() -> None:
    text = "# Guide\n\n## Install\nRun pip.\n\n## Use\nImport it.\n\nThen call it."
    split = chunk_document(Document("d", text), ChunkerConfig())
    assert [c.text for c in split] == ["# Guide\n\n## Install\nRun pip.", "## Use\nImport it.\n\nThen call it."]
    packed = chunk_document(Document("d", text), ChunkerConfig(split_at_headings=False))
    assert [c.text for c in packed] == [text]


def test_a_giant_token_is_cut_by_max_chars() -> None:
    chunks = chunk_document(Document("d", "start " + "x" * 1000 + " end"), ChunkerConfig(max_chars=400))
    assert all(len(c.text) <= 400 for c in chunks)
    assert "".join(c.text.replace(" ", "") for c in chunks) == "start" + "x" * 1000 + "end"


def test_build_corpus_counts_blank_documents_and_reports_the_chunker() -> None:
    docs = [Document("a", _sentences("s", 30)), Document("blank", " \n\n\t"), Document("b", "Short.")]
    chunks, report = build_corpus(docs, ChunkerConfig(max_words=100), skipped_files=["x.png"], source="test")
    assert [c.doc_id for c in chunks] == ["a", "a", "a", "b"]
    assert report["documents"] == 2 and report["chunks"] == 4
    assert report["empty_documents"] == 1 and report["empty_document_ids"] == ["blank"]
    assert report["skipped_files"] == 1 and report["skipped_file_examples"] == ["x.png"]
    assert report["max_words_per_chunk"] == 96
    assert report["mean_words_per_chunk"] == pytest.approx((240 + 1) / 4, abs=0.1)
    assert report["chunker"] == ChunkerConfig(max_words=100).model_dump()


def test_chunker_options_are_checked_naming_each_field() -> None:
    assert chunker_config_from(None) == chunker_config_from("") == chunker_config_from("{}") == ChunkerConfig()
    assert chunker_config_from('{"max_words": 150}').max_words == 150
    with pytest.raises(ChunkerOptionError) as bad:
        chunker_config_from('{"max_words": 5, "max_word": 100, "overlap_words": "3"}')
    assert set(bad.value.fields) == {"max_words", "max_word", "overlap_words"}
    assert "unknown option" in bad.value.fields["max_word"][0]
    with pytest.raises(ChunkerOptionError) as overlap:
        chunker_config_from({"max_words": 100, "overlap_words": 60})
    assert "half of max_words" in overlap.value.fields["overlap_words"][0]
    for text in ("[1]", "{nope"):
        with pytest.raises(ChunkerOptionError) as shape:
            chunker_config_from(text)
        assert list(shape.value.fields) == [""]


# --- JSONL of documents ----------------------------------------------------------------------------------------
def test_jsonl_documents_parse_with_doc_id_or_id_title_and_metadata() -> None:
    data = b"\xef\xbb\xbf" + _jsonl(
        {"doc_id": "a", "text": "Alpha.", "title": "A", "metadata": {"url": "u"}},
        {"id": 7, "text": "Seven."},
    )
    source = parse_documents_jsonl(data + b"\n   \n")
    assert source.documents == [Document("a", "Alpha.", "A", {"url": "u"}), Document("7", "Seven.")]


def test_invalid_utf8_names_the_line_the_byte_and_the_fix() -> None:
    data = (
        _jsonl({"doc_id": "a", "text": "ok"}, {"doc_id": "b", "text": "ok"}) + b'{"doc_id": "c", "text": "caf\xe9"}\n'
    )
    with pytest.raises(CorpusError) as exc:
        parse_documents_jsonl(data)
    assert exc.value.errors == ["line 3: not valid UTF-8 (byte 0xe9 at column 29); re-save the file as UTF-8"]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b'{"doc_id": "a", ', "line 2: not valid JSON"),
        (b'["a", "b"]', "line 2: expected a JSON object"),
        (b'{"doc_id": "a"}', "line 2: field 'text' is missing"),
        (b'{"doc_id": "a", "text": 3}', "line 2: field 'text' must be a string, got a number"),
        (b'{"text": "t"}', "line 2: field 'doc_id' is missing"),
        (b'{"doc_id": true, "text": "t"}', "line 2: field 'doc_id' must be a string or an integer"),
        (b'{"doc_id": "a#1", "text": "t"}', "line 2: field 'doc_id' must not contain '#'"),
        (b'{"doc_id": "a b", "text": "t"}', "line 2: field 'doc_id' must not contain whitespace"),
        (b'{"doc_id": "", "text": "t"}', "line 2: field 'doc_id' must not be empty"),
        (b'{"doc_id": "a", "text": "t", "title": 1}', "line 2: field 'title' must be a string"),
        (b'{"doc_id": "a", "text": "t", "metadata": []}', "line 2: field 'metadata' must be an object"),
        (b'{"doc_id": "a", "text": "t", "url": "u"}', "line 2: unknown field 'url'; put extra fields under 'metadata'"),
        (b'{"doc_id": "first", "text": "again"}', "line 2: doc_id 'first' is already used on line 1"),
    ],
)
def test_each_bad_document_line_is_named_with_its_problem(line: bytes, expected: str) -> None:
    with pytest.raises(CorpusError) as exc:
        parse_documents_jsonl(_jsonl({"doc_id": "first", "text": "fine"}) + line + b"\n")
    assert len(exc.value.errors) == 1
    assert exc.value.errors[0].startswith(expected), exc.value.errors


def test_every_bad_line_is_reported_at_once() -> None:
    data = _jsonl({"doc_id": "a"}, {"doc_id": "b", "text": "ok"}, {"text": "no id"})
    with pytest.raises(CorpusError) as exc:
        parse_documents_jsonl(data)
    assert [e.split(":")[0] for e in exc.value.errors] == ["line 1", "line 3"]


# --- canonical chunk files -------------------------------------------------------------------------------------
def test_canonical_chunks_round_trip_and_are_recognised() -> None:
    chunks, _ = build_corpus([Document("a", _sentences("s", 60), title="A", metadata={"m": 1})])
    data = dump_chunks_jsonl(chunks)
    assert looks_like_canonical_chunks(data)
    assert not looks_like_canonical_chunks(_jsonl({"doc_id": "a", "text": "t"}))
    assert validate_canonical(data) == chunks == list(iter_chunks_jsonl(data))


def test_canonical_chunks_with_a_repeated_or_inconsistent_id_are_refused_by_line() -> None:
    chunks, _ = build_corpus([Document("a", "One."), Document("b", "Two.")])
    rows = [c.to_json() for c in chunks]
    with pytest.raises(CorpusError) as exc:
        validate_canonical(_jsonl(rows[0], rows[1], rows[0], {**rows[1], "chunk_id": "b#9"}))
    assert exc.value.errors[0].startswith("line 3: chunk_id 'a#0' is already used on line 1")
    assert exc.value.errors[1].startswith("line 4: chunk_id 'b#9' should be 'b#0'")


# --- folders and zips ------------------------------------------------------------------------------------------
def _write_folder(root: Path) -> None:
    (root / "sub").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "guide.md").write_text("Intro line.\n\n# The Guide\n\nBody text.\n")
    (root / "sub" / "notes.txt").write_text("Plain notes.\n")
    (root / "page.html").write_text(
        "<html><head><title>The Page</title><script>alert(1)</script><style>p{}</style></head>"
        "<body><h1>Head</h1><p>First   para\nline.</p><p>Second.</p></body></html>"
    )
    (root / "logo.png").write_bytes(b"\x89PNG")
    (root / ".git" / "HEAD").write_text("ref")


def test_a_folder_gives_one_document_per_supported_file_in_path_order(tmp_path: Path) -> None:
    _write_folder(tmp_path)
    source = parse_documents_folder(tmp_path)
    assert [d.doc_id for d in source.documents] == ["guide", "page", "sub/notes"]
    guide, page, notes = source.documents
    assert guide.title == "The Guide" and notes.title == "notes" and page.title == "The Page"
    assert page.text == "# Head\n\nFirst para line.\n\nSecond."
    assert notes.metadata == {"path": "sub/notes.txt"}
    assert sorted(source.skipped_files) == [".git/HEAD", "logo.png"]


def test_html_text_drops_scripts_and_keeps_line_breaks() -> None:
    title, text = html_to_text("<title>T</title><body><script>x()</script>a<br>b<!-- c --></body>")
    assert (title, text) == ("T", "a\nb")


def test_a_non_utf8_file_is_named_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "ok.md").write_text("fine")
    (tmp_path / "bad.txt").write_bytes(b"line one\nline two \xff\n")
    (tmp_path / "blob.txt").write_bytes(b"PK\x00\x01binary")
    source = parse_documents_folder(tmp_path)
    # The bad files are named and left out; the good one is read.
    assert [d.doc_id for d in source.documents] == ["ok"]
    assert source.rejected_files == [
        "bad.txt line 2: not valid UTF-8 (byte 0xff at column 10); re-save the file as UTF-8",
        "blob.txt: a binary file (it holds NUL bytes), not text; leave it out",
    ]
    chunks, report = build_corpus(source.documents, rejected_files=source.rejected_files)
    assert report["rejected_files"] == 2 and report["rejected_file_reasons"] == source.rejected_files


def test_two_files_with_the_same_doc_id_are_both_named(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("one")
    (tmp_path / "a.txt").write_text("two")
    source = parse_documents_folder(tmp_path)
    assert [d.metadata["path"] for d in source.documents] == ["a.md"]
    assert source.rejected_files == ["a.txt: gives doc_id 'a', as does a.md; rename one of them"]


def _zip(entries: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def test_a_zip_of_a_folder_gives_the_ids_the_folder_gives(tmp_path: Path) -> None:
    _write_folder(tmp_path / "docs")
    entries = {
        f"docs/{p.relative_to(tmp_path / 'docs').as_posix()}": p.read_bytes()
        for p in (tmp_path / "docs").rglob("*")
        if p.is_file()
    }
    from_zip = parse_documents_zip(_zip(entries), max_bytes=10_000)
    from_folder = parse_documents_folder(tmp_path / "docs")
    assert from_zip.documents == from_folder.documents
    assert sorted(from_zip.skipped_files) == [".git/HEAD", "logo.png"]


@pytest.mark.parametrize("name", ["../evil.txt", "docs/../../evil.md", "/etc/evil.txt", "C:/evil.txt"])
def test_a_zip_entry_outside_the_archive_is_refused(name: str) -> None:
    with pytest.raises(CorpusError, match="zip entry .* (climbs out|is an absolute path)"):
        parse_documents_zip(_zip({"ok.txt": b"fine", name: b"x"}), max_bytes=10_000)


def test_a_zip_over_the_size_cap_is_refused_before_it_is_inflated() -> None:
    bomb = _zip({"a.txt": b"a" * 50_000, "b.txt": b"b" * 50_000})
    assert len(bomb) < 1_000
    with pytest.raises(CorpusError, match="more than 60000 bytes uncompressed"):
        parse_documents_zip(bomb, max_bytes=60_000)


def test_a_zip_whose_header_understates_its_size_is_still_capped() -> None:
    data = bytearray(_zip({"a.txt": b"a" * 50_000}))
    # Rewrite the declared uncompressed size (local header and central directory) to 10 bytes.
    for offset, field in ((22, b"\x50\xc3\x00\x00"), (data.rfind(b"PK\x01\x02") + 24, b"\x50\xc3\x00\x00")):
        assert bytes(data[offset : offset + 4]) == field
        data[offset : offset + 4] = (10).to_bytes(4, "little")
    with pytest.raises(CorpusError):
        parse_documents_zip(bytes(data), max_bytes=1_000)


def test_bytes_that_are_not_a_zip_are_refused() -> None:
    with pytest.raises(CorpusError, match="not a readable zip archive"):
        parse_documents_zip(b"PK\x03\x04 truncated", max_bytes=1_000)


# --- the built-in corpus ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def stdlib_chunks() -> tuple[list[Document], bytes, dict[str, object]]:
    documents = stdlib_documents()
    chunks, report = build_corpus(documents)
    return documents, dump_chunks_jsonl(chunks), report


def test_the_stdlib_corpus_has_thousands_of_unique_chunks(stdlib_chunks) -> None:  # type: ignore[no-untyped-def]
    documents, data, report = stdlib_chunks
    chunks = list(iter_chunks_jsonl(data))
    assert report["chunks"] == len(chunks) >= 3000
    assert len({c.chunk_id for c in chunks}) == len(chunks)
    ids = {d.doc_id for d in documents}
    assert {"topic:assert", "py:os.path", "py:json", "py:builtins"} <= ids
    assert all(i.startswith(("py:", "topic:")) for i in ids)
    assert len([i for i in ids if i.startswith("py:")]) >= len(STDLIB_MODULES) - 10
    assert any(c.text.startswith("## os.path.join(") for c in chunks if c.doc_id == "py:os.path")


def test_the_stdlib_corpus_is_the_same_every_time(stdlib_chunks) -> None:  # type: ignore[no-untyped-def]
    _, data, _ = stdlib_chunks
    chunks, _ = build_corpus(stdlib_documents())
    assert dump_chunks_jsonl(chunks) == data
    assert b" at 0x" not in data


def test_a_document_over_the_cap_is_refused_by_name_in_a_folder_and_a_zip(tmp_path: Path) -> None:
    (tmp_path / "small.md").write_text("# Small\n\nFits.")
    (tmp_path / "large.txt").write_text("word " * 400)
    (tmp_path / "large.bin").write_bytes(b"\x00" * 4000)  # unsupported: skipped, not refused
    expected = [
        "large.txt: 2,000 bytes, over the 1,000-byte limit for one document (CRUCIBLE_DOCUMENT_MAX_BYTES); "
        "split it into smaller files"
    ]
    folder = parse_documents_folder(tmp_path, max_document_bytes=1000)
    assert [d.doc_id for d in folder.documents] == ["small"] and folder.rejected_files == expected
    assert folder.skipped_files == ["large.bin"]
    entries = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    zipped = parse_documents_zip(_zip(entries), max_bytes=100_000, max_document_bytes=1000)
    assert [d.doc_id for d in zipped.documents] == ["small"] and zipped.rejected_files == expected
