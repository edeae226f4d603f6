from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.test import APIClient

from apps.datasets.models import Dataset, DatasetVersion
from apps.web.demo import load_demo
from workers.search.types import iter_chunks_jsonl

pytestmark = pytest.mark.django_db


def _documents(count: int = 5) -> bytes:
    rows = [
        {
            "doc_id": f"doc-{i}",
            "title": f"Document {i}",
            "text": " ".join(f"Sentence {i}.{k} says something about topic {i}." for k in range(30)),
            "metadata": {"n": i},
        }
        for i in range(count)
    ]
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def _zip(entries: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in entries.items():
            archive.writestr(name, text)
    return buffer.getvalue()


def _corpus(client: APIClient, name: str = "docs") -> int:
    response = client.post("/api/v1/datasets/", {"name": name, "kind": "corpus"}, format="json")
    assert response.status_code == 201, response.json()
    return int(response.json()["id"])


def _upload(client: APIClient, dataset_id: int, data: bytes, name: str = "docs.jsonl", **fields: str):  # type: ignore[no-untyped-def]
    return client.post(
        f"/api/v1/datasets/{dataset_id}/versions/",
        {"file": SimpleUploadedFile(name, data), **fields},
        format="multipart",
    )


def _stored_chunks(version: DatasetVersion):  # type: ignore[no-untyped-def]
    with version.file.open("rb") as handle:
        return list(iter_chunks_jsonl(handle.read()))


def test_a_documents_jsonl_upload_is_stored_as_canonical_chunks(client_for) -> None:  # type: ignore[no-untyped-def]
    client = client_for("operator")
    response = _upload(client, _corpus(client), _documents(), chunker='{"max_words": 100}')
    assert response.status_code == 201, response.json()
    body = response.json()
    version = DatasetVersion.objects.get()
    chunks = _stored_chunks(version)
    assert body["row_count"] == version.row_count == len(chunks) == 15  # 240 words a document, 100 a chunk
    assert [c.chunk_id for c in chunks[:3]] == ["doc-0#0", "doc-0#1", "doc-0#2"]
    assert chunks[0].title == "Document 0" and chunks[0].metadata == {"n": 0}
    report = body["validation_report"]
    assert report["documents"] == 5 and report["chunks"] == 15 and report["chunker"]["max_words"] == 100
    assert version.file.name.endswith(".chunks.jsonl")
    assert version.size_bytes == version.file.size


def test_a_zip_upload_is_chunked_and_its_unsupported_files_counted(client_for) -> None:  # type: ignore[no-untyped-def]
    client = client_for("operator")
    data = _zip(
        {
            "site/index.html": "<title>Home</title><p>Welcome home.</p>",
            "site/guide/setup.md": "# Setup\n\nInstall it.",
            "site/logo.svg": "<svg/>",
        }
    )
    response = _upload(client, _corpus(client), data, name="site.zip")
    assert response.status_code == 201, response.json()
    chunks = _stored_chunks(DatasetVersion.objects.get())
    assert [(c.chunk_id, c.title) for c in chunks] == [("guide/setup#0", "Setup"), ("index#0", "Home")]
    assert response.json()["validation_report"]["skipped_files"] == 1


def test_the_same_documents_and_chunker_are_refused_as_a_duplicate(client_for) -> None:  # type: ignore[no-untyped-def]
    client = client_for("operator")
    dataset_id = _corpus(client)
    assert _upload(client, dataset_id, _documents()).status_code == 201
    again = _upload(client, dataset_id, _documents(), chunker="{}")
    assert again.status_code == 400
    assert "already docs@v1" in again.json()["detail"]
    rechunked = _upload(client, dataset_id, _documents(), chunker='{"max_words": 50}')
    assert rechunked.status_code == 201 and rechunked.json()["number"] == 2


def test_a_re_uploaded_chunk_file_is_kept_as_it_is(client_for) -> None:  # type: ignore[no-untyped-def]
    client = client_for("operator")
    assert _upload(client, _corpus(client), _documents(), chunker='{"max_words": 100}').status_code == 201
    with DatasetVersion.objects.get().file.open("rb") as handle:
        stored = handle.read()
    copy = _upload(client, _corpus(client, "copy"), stored, name="export.jsonl")
    assert copy.status_code == 201, copy.json()
    assert copy.json()["content_hash"] == DatasetVersion.objects.get(dataset__name="docs").content_hash
    assert copy.json()["validation_report"]["chunker"] is None


@pytest.mark.parametrize(
    ("chunker", "field"),
    [
        ('{"max_words": 5}', "chunker.max_words"),
        ('{"maxwords": 100}', "chunker.maxwords"),
        ('{"max_words": 100, "overlap_words": 80}', "chunker.overlap_words"),
        ("not json", "chunker"),
    ],
)
def test_a_bad_chunker_option_is_a_400_naming_the_field(client_for, chunker: str, field: str) -> None:  # type: ignore[no-untyped-def]
    client = client_for("operator")
    response = _upload(client, _corpus(client), _documents(), chunker=chunker)
    assert response.status_code == 400
    assert response.json()["detail"].startswith(f"{field}: ")
    assert DatasetVersion.objects.count() == 0


def test_a_zip_with_bad_files_imports_the_rest_and_names_each_bad_file(client_for) -> None:  # type: ignore[no-untyped-def]
    client = client_for("operator")
    big = "\n\n".join(f"Paragraph {n} of the long manual covers option number {n} in depth." for n in range(60_000))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("docs/guide.rst", "Guide\n=====\n\nCall `connect()` first.\n")
        archive.writestr("docs/manual.txt", big)  # one document of several megabytes
        archive.writestr("docs/empty.md", "  \n\n")
        archive.writestr("docs/latin1.txt", "caf\xe9".encode("latin-1"))
        archive.writestr("docs/image.html", b"\x89PNG\r\n\x1a\n\x00\x00binary")
        archive.writestr("docs/broken.py", "def (:\n")
        archive.writestr("docs/tool.exe", b"MZ\x00")
        archive.writestr("docs/data.parquet", b"PAR1")
    response = _upload(client, _corpus(client), buffer.getvalue(), name="docs.zip")
    assert response.status_code == 201, response.json()
    report = response.json()["validation_report"]
    assert report["rejected_files"] == 3
    reasons = report["rejected_file_reasons"]
    assert reasons[0].startswith("broken.py line 1: not valid Python")
    assert reasons[1] == "image.html: a binary file (it holds NUL bytes), not text; leave it out"
    assert reasons[2].startswith("latin1.txt line 1: not valid UTF-8")
    assert report["skipped_files"] == 2 and report["empty_documents"] == 1
    chunks = _stored_chunks(DatasetVersion.objects.get())
    assert {c.doc_id for c in chunks} == {"guide", "manual"}
    assert sum(1 for c in chunks if c.doc_id == "manual") > 100


def test_a_zip_whose_every_file_is_bad_is_a_400_naming_them_and_stores_nothing(client_for) -> None:  # type: ignore[no-untyped-def]
    client = client_for("operator")
    response = _upload(client, _corpus(client), _zip({"a.txt": "ok", "a.md": "same id"}), name="x.zip")
    assert response.status_code == 201  # one of the two is kept
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("bad.txt", b"\xff\xfe")
    dataset_id = _corpus(client, "second")
    refused = _upload(client, dataset_id, buffer.getvalue(), name="bad.zip")
    assert refused.status_code == 400
    body = json.dumps(refused.json())
    assert "1 rejected" in body and "bad.txt line 1: not valid UTF-8" in body
    assert DatasetVersion.objects.filter(dataset_id=dataset_id).count() == 0


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"doc_id": "a", "text": "ok"}\n{"doc_id": "b", "text": "caf\xe9"}\n', "file: line 2: not valid UTF-8"),
        (b'{"doc_id": "a", "text": "  "}\n{"id": "b", "text": ""}\n', "file: the corpus holds no text (2 blank"),
        (b'{"doc_id": "a#1", "text": "x"}\n', "file: line 1: field 'doc_id' must not contain '#'"),
        (b'{"doc_id": "a", "text": "x"}\n{"doc_id": "a", "text": "y"}\n', "already used on line 1"),
    ],
)
def test_bad_corpus_uploads_are_refused_with_the_line_and_store_nothing(client_for, data: bytes, message: str) -> None:  # type: ignore[no-untyped-def]
    client = client_for("operator")
    response = _upload(client, _corpus(client), data)
    assert response.status_code == 400
    assert message in response.json()["detail"]
    assert DatasetVersion.objects.count() == 0


def test_a_zip_with_a_parent_path_or_over_the_size_limit_is_refused(client_for, settings) -> None:  # type: ignore[no-untyped-def]
    client = client_for("operator")
    dataset_id = _corpus(client)
    escape = _upload(client, dataset_id, _zip({"ok.md": "fine", "../../etc/x.md": "bad"}), name="x.zip")
    assert escape.status_code == 400 and "climbs out of the archive" in escape.json()["detail"]
    settings.DATASET_MAX_BYTES = 20_000
    bomb = _upload(client, dataset_id, _zip({"big.txt": "word " * 10_000}), name="bomb.zip")
    assert bomb.status_code == 400 and "uncompressed" in bomb.json()["detail"]
    assert DatasetVersion.objects.count() == 0


def test_a_chunker_option_on_a_dataset_of_another_kind_is_refused(client_for, trajectories_jsonl) -> None:  # type: ignore[no-untyped-def]
    client = client_for("operator")
    dataset_id = client.post("/api/v1/datasets/", {"name": "t", "kind": "trajectories"}, format="json").json()["id"]
    response = _upload(client, dataset_id, trajectories_jsonl, chunker='{"max_words": 100}')
    assert response.status_code == 400 and "chunker" in response.json()["fields"]
    assert _upload(client, dataset_id, trajectories_jsonl).status_code == 201


def test_a_viewer_or_an_anonymous_caller_cannot_upload_a_corpus(client_for) -> None:  # type: ignore[no-untyped-def]
    dataset_id = _corpus(client_for("operator"))
    media_before = {p for p in Path(DatasetVersion.file.field.storage.location).rglob("*docs-v*")}
    viewer = _upload(client_for("viewer"), dataset_id, _documents())
    anonymous = _upload(APIClient(), dataset_id, _documents())
    assert viewer.status_code == 403
    assert anonymous.status_code in (401, 403)
    assert DatasetVersion.objects.count() == 0
    assert {p for p in Path(DatasetVersion.file.field.storage.location).rglob("*docs-v*")} == media_before


def test_the_corpus_page_shows_the_report_and_the_first_chunks_and_takes_uploads(users, client) -> None:  # type: ignore[no-untyped-def]
    client.force_login(users["operator"])
    dataset = Dataset.objects.create(name="pages", kind="corpus", owner=users["operator"])
    form = {"file": SimpleUploadedFile("docs.jsonl", _documents(30)), "chunker": '{"max_words": 300}'}
    response = client.post(f"/datasets/{dataset.pk}/", form)
    assert response.status_code == 302
    page = client.get(f"/datasets/{dataset.pk}/").content.decode()
    assert "30 documents, 30 chunks" in page
    assert "max_words=300" in page
    assert "doc-19#0" in page and "doc-20#0" not in page  # the first 20 chunks only
    bad = client.post(
        f"/datasets/{dataset.pk}/", {"file": SimpleUploadedFile("d.jsonl", _documents()), "chunker": "[]"}
    )
    assert bad.status_code == 200 and "chunker: expected a JSON object" in bad.content.decode()


def test_import_corpus_reads_a_jsonl_a_zip_a_folder_and_the_builtin_docs(users, tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "docs.jsonl").write_bytes(_documents())
    (tmp_path / "site.zip").write_bytes(_zip({"a.md": "# A\n\nAlpha.", "b.txt": "Beta."}))
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "one.md").write_text("# One\n\nFirst note.")
    (folder / "two.html").write_text("<title>Two</title><p>Second note.</p>")
    out = io.StringIO()
    admin = users["admin"].username
    call_command("import_corpus", "kb", "--jsonl", str(tmp_path / "docs.jsonl"), "--user", admin, stdout=out)
    call_command("import_corpus", "kb", "--zip", str(tmp_path / "site.zip"), "--user", admin, stdout=out)
    call_command("import_corpus", "kb", "--folder", str(folder), "--chunker", '{"max_words": 50}', "--user", admin)
    call_command("import_corpus", "pydocs", "--builtin", "python-docs", "--user", admin, stdout=out)
    assert "kb@v1: 5 documents, 10 chunks" in out.getvalue()  # 240 words a document
    versions = {str(v): v for v in DatasetVersion.objects.select_related("dataset")}
    assert set(versions) == {"kb@v1", "kb@v2", "kb@v3", "pydocs@v1"}
    assert [c.chunk_id for c in _stored_chunks(versions["kb@v3"])] == ["one#0", "two#0"]
    assert versions["kb@v3"].validation_report["chunker"]["max_words"] == 50
    assert versions["pydocs@v1"].row_count >= 3000
    assert Dataset.objects.get(name="kb").kind == "corpus"


def test_import_corpus_exits_with_the_error_on_bad_input(users, tmp_path) -> None:  # type: ignore[no-untyped-def]
    admin = users["admin"].username
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"doc_id": "a", "text": "ok"}\n{"doc_id": "b"}\n')
    with pytest.raises(CommandError, match="file: line 2: field 'text' is missing"):
        call_command("import_corpus", "kb", "--jsonl", str(bad), "--user", admin)
    with pytest.raises(CommandError, match="chunker.max_words"):
        call_command(
            "import_corpus", "kb", "--builtin", "python-docs", "--chunker", '{"max_words": 1}', "--user", admin
        )
    with pytest.raises(CommandError, match="cannot read"):
        call_command("import_corpus", "kb", "--jsonl", str(tmp_path / "missing.jsonl"), "--user", admin)
    with pytest.raises(CommandError, match="not a folder"):
        call_command("import_corpus", "kb", "--folder", str(tmp_path / "missing"), "--user", admin)
    Dataset.objects.create(name="trajs", kind="trajectories", owner=users["admin"])
    with pytest.raises(CommandError, match="trajs holds trajectories, not a corpus"):
        call_command("import_corpus", "trajs", "--jsonl", str(bad), "--user", admin)
    assert DatasetVersion.objects.count() == 0


def test_the_demo_loader_adds_the_python_docs_corpus_once() -> None:
    load_demo()
    load_demo()
    version = DatasetVersion.objects.get(dataset__name="demo-pydocs")
    assert version.row_count >= 3000
    assert version.validation_report["source"] == "builtin:python-docs"


def test_a_50_mb_document_is_refused_by_name_and_the_rest_of_the_zip_imported(client_for) -> None:  # type: ignore[no-untyped-def]
    client = client_for("operator")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("docs/guide.md", "# Guide\n\nCall `connect()` first, then `send()`.\n")
        archive.writestr("docs/dump.txt", "log line with words\n" * (50 * 1024 * 1024 // 20))
    response = _upload(client, _corpus(client), buffer.getvalue(), name="docs.zip")
    assert response.status_code == 201, response.json()
    report = response.json()["validation_report"]
    assert report["rejected_file_reasons"] == [
        "dump.txt: 52,428,800 bytes, over the 16,777,216-byte limit for one document (CRUCIBLE_DOCUMENT_MAX_BYTES); "
        "split it into smaller files"
    ]
    assert {c.doc_id for c in _stored_chunks(DatasetVersion.objects.get())} == {"guide"}


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (b"\x1f\x8b\x08\x00" + b"\x00" * 40, "gzip"),
        (b"BZh91AY&SY" + b"\x00" * 40, "bzip2"),
        (b"7z\xbc\xaf'\x1c\x00\x04" + b"\x00" * 40, "7z"),
        (b"docs/a.md".ljust(257, b"\x00") + b"ustar\x0000" + b"\x00" * 200, "tar"),
    ],
)
def test_an_archive_in_another_format_is_a_400_naming_it_and_stores_nothing(client_for, data: bytes, kind: str) -> None:  # type: ignore[no-untyped-def]
    client = client_for("operator")
    response = _upload(client, _corpus(client), data, name=f"docs.{kind}")
    assert response.status_code == 400
    assert f"file: a {kind} archive" in response.json()["detail"] and "re-pack it as a zip" in response.json()["detail"]
    assert DatasetVersion.objects.count() == 0


def test_a_jsonl_document_over_the_cap_names_its_line(client_for, settings) -> None:  # type: ignore[no-untyped-def]
    settings.DOCUMENT_MAX_BYTES = 1000
    client = client_for("operator")
    data = _documents(1) + (json.dumps({"doc_id": "big", "text": "x " * 600}) + "\n").encode()
    response = _upload(client, _corpus(client), data)
    assert response.status_code == 400
    assert "line 2: the text is 1,200 bytes, over the 1,000-byte limit for one document" in response.json()["detail"]
    assert DatasetVersion.objects.count() == 0


def test_a_section_several_documents_share_is_stored_once_for_each_and_the_report_counts_it(
    users, client, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    closing = "## Support\n\n" + " ".join(f"Support rule {k} applies to every product in the family." for k in range(8))
    rows = [
        {"doc_id": f"product-{i}", "text": f"# Product {i}\n\nThis product {job}.\n\n{closing}"}
        for i, job in enumerate(("sorts the mail", "paints fences quickly", "tunes old pianos"))
    ]
    (tmp_path / "family.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = io.StringIO()
    admin = users["admin"].username
    call_command("import_corpus", "family", "--jsonl", str(tmp_path / "family.jsonl"), "--user", admin, stdout=out)
    assert "3 documents, 4 chunks" in out.getvalue() and "merged 1 chunks shared by 2+ documents" in out.getvalue()
    version = DatasetVersion.objects.get(dataset__name="family")
    stored = _stored_chunks(version)
    assert [(c.chunk_id, c.metadata.get("also_in")) for c in stored] == [
        ("product-0#0", None), ("product-0#1", ["product-1#1", "product-2#1"]), ("product-1#0", None),
        ("product-2#0", None),
    ]  # fmt: skip
    client.force_login(users["operator"])
    page = client.get(f"/datasets/{version.dataset.pk}/").content.decode()
    assert "merged 1 chunk shared by 2+ documents (2 copies stored once, attributed to each document)" in page
