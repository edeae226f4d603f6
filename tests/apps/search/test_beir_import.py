"""BEIR imports (`POST /api/v1/beir-imports/`, `manage.py import_beir`): a published zip becomes a corpus version and
a tasks version of its judged queries, and `manage.py retrieval_eval` scores them at the document level. Malformed,
unauthorised, duplicated and oversized uploads are refused naming the problem, with nothing stored."""

from __future__ import annotations

import io
import json
import zipfile

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.core.management.base import CommandError

from apps.datasets.models import Dataset, DatasetVersion

pytestmark = pytest.mark.django_db

TOPICS = {
    "copper": "Copper is a metal that conducts heat and electricity; wires and pipes are made of copper.",
    "granite": "Granite is a coarse igneous rock of quartz and feldspar, quarried for kitchen counters.",
    "falcon": "The peregrine falcon dives faster than any other bird when it hunts pigeons.",
    "orchard": "An orchard of apple trees needs pruning in winter and bees to pollinate in spring.",
    "harbor": "A harbor shelters ships from storms; cranes unload containers onto the quay.",
    "violin": "The violin has four strings tuned in fifths and is played with a horsehair bow.",
    "glacier": "A glacier is a slow river of ice that carves valleys as it flows downhill.",
    "yeast": "Yeast ferments sugar into alcohol and carbon dioxide, which makes bread dough rise.",
}
QUERIES = {
    "q-metal": ("which metal conducts electricity in wires", {"copper": 2, "harbor": 0}),
    "q-rock": ("igneous rock with quartz and feldspar", {"granite": 1}),
    "q-bird": ("fastest diving bird hunting pigeons", {"falcon": 2}),
    "q-ice": ("river of ice carving valleys", {"glacier": 1, "harbor": 0}),
    "q-bread": ("what makes bread dough rise", {"yeast": 2}),
}


def beir_zip(*, qrels: str | None = None, corpus: str | None = None) -> bytes:
    corpus_lines = corpus or "".join(
        json.dumps({"_id": doc, "title": doc.title(), "text": text}) + "\n" for doc, text in TOPICS.items()
    )
    queries = "".join(json.dumps({"_id": q, "text": text}) + "\n" for q, (text, _) in QUERIES.items())
    qrels = qrels or "query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{doc}\t{score}\n" for q, (_, judged) in QUERIES.items() for doc, score in judged.items()
    )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("tiny/corpus.jsonl", corpus_lines)
        archive.writestr("tiny/queries.jsonl", queries)
        archive.writestr("tiny/qrels/test.tsv", qrels)
    return buffer.getvalue()


def post(client, data: bytes, **fields):  # type: ignore[no-untyped-def]
    body = {"corpus_dataset": "tiny-corpus", "tasks_dataset": "tiny-queries", **fields}
    return client.post(
        "/api/v1/beir-imports/", {"file": SimpleUploadedFile("tiny.zip", data), **body}, format="multipart"
    )


def stored() -> tuple[int, int]:
    return Dataset.objects.count(), DatasetVersion.objects.count()


def test_an_import_stores_the_corpus_and_the_judged_queries_and_evaluates_per_query_set(client_for, tmp_path) -> None:  # type: ignore[no-untyped-def]
    response = post(client_for("operator"), beir_zip())
    assert response.status_code == 201, response.json()
    body = response.json()
    corpus = DatasetVersion.objects.get(pk=body["corpus_version"]["id"])
    tasks = DatasetVersion.objects.get(pk=body["tasks_version"]["id"])
    assert corpus.dataset.kind == "corpus" and tasks.dataset.kind == "tasks"
    assert tasks.row_count == 5 and body["report"]["splits"] == {
        "test": {"queries": 5, "without_relevant_documents": 0}
    }
    assert body["report"]["documents"] == 8 and body["report"]["corpus_version"] == corpus.pk
    with tasks.file.open("rb") as handle:
        rows = {json.loads(line)["id"]: json.loads(line) for line in handle.read().splitlines()}
    assert rows["q-metal"]["relevance"] == {"copper": 2, "harbor": 0} and rows["q-metal"]["gold_doc_ids"] == ["copper"]

    out, report = io.StringIO(), tmp_path / "r.json"
    call_command("retrieval_eval", str(corpus.pk), "--tasks-version", str(tasks.pk), "--json", str(report), stdout=out)
    text = out.getvalue()
    assert "test (documents)" in text and "all (documents)" in text and "ndcg@10" in text
    result = json.loads(report.read_text())
    assert result["level"] == "document" and result["absent_documents"] == []
    bm25 = result["metrics"]["bm25"]["test"]
    assert bm25["queries"] == 5
    # Each query shares its words with its one relevant document only: BM25 ranks it first every time.
    assert bm25["ndcg@10"]["mean"] == pytest.approx(1.0) and bm25["recall@1"]["mean"] == pytest.approx(1.0)
    assert 0.0 <= result["metrics"]["dense"]["all"]["ndcg@10"]["mean"] <= 1.0


def test_malformed_archives_are_a_400_naming_the_line_and_store_nothing(client_for) -> None:  # type: ignore[no-untyped-def]
    client = client_for("operator")
    before = stored()
    bad_score = beir_zip(qrels="q-metal\tcopper\tvery\n")
    response = post(client, bad_score)
    assert response.status_code == 400
    assert any(
        "qrels/test.tsv line 1: column 'score' must be an integer" in e for e in response.json()["fields"]["file"]
    )
    unknown_doc = beir_zip(qrels="q-metal\tnickel\t1\n")
    response = post(client, unknown_doc)
    assert (
        response.status_code == 400 and "'nickel', which is not in corpus.jsonl" in response.json()["fields"]["file"][0]
    )
    response = post(client, beir_zip(corpus='{"_id": "copper", "text": 1}\n'))
    assert (
        response.status_code == 400
        and "corpus.jsonl line 1: field 'text' must be a string" in response.json()["fields"]["file"][0]
    )
    response = post(client, beir_zip(), splits="train")
    assert response.status_code == 400 and "it has qrels for test" in response.json()["fields"]["splits"][0]
    response = post(client, b"not a zip")
    assert response.status_code == 400 and "not a readable zip" in response.json()["fields"]["file"][0]
    response = post(client, beir_zip(), tasks_dataset="tiny-corpus")
    assert response.status_code == 400 and "tasks_dataset" in response.json()["fields"]
    assert stored() == before


def test_a_viewer_cannot_import_and_a_dataset_of_another_kind_is_refused(client_for, users) -> None:  # type: ignore[no-untyped-def]
    before = stored()
    assert post(client_for("viewer"), beir_zip()).status_code == 403
    assert stored() == before
    Dataset.objects.create(name="tiny-queries", kind="trajectories", owner=users["operator"])
    response = post(client_for("operator"), beir_zip())
    assert (
        response.status_code == 400 and "holds trajectories, not tasks" in response.json()["fields"]["tasks_dataset"][0]
    )
    assert DatasetVersion.objects.count() == before[1] and not Dataset.objects.filter(name="tiny-corpus").exists()


def test_the_same_archive_twice_is_refused_and_new_qrels_reuse_the_corpus(client_for, settings) -> None:  # type: ignore[no-untyped-def]
    client = client_for("operator")
    first = post(client, beir_zip())
    assert first.status_code == 201 and first.json()["corpus_reused"] is False
    before = stored()
    again = post(client, beir_zip())
    assert again.status_code == 400 and "identical content is already" in again.json()["fields"]["file"][0]
    assert stored() == before
    fewer = beir_zip(qrels="q-bird\tfalcon\t2\n")
    second = post(client, fewer)
    assert second.status_code == 201 and second.json()["corpus_reused"] is True
    assert second.json()["corpus_version"]["id"] == first.json()["corpus_version"]["id"]
    assert second.json()["tasks_version"]["number"] == 2
    settings.DATASET_MAX_BYTES = 200
    before = stored()
    response = post(client, beir_zip())
    assert response.status_code in (400, 413) and stored() == before


def test_the_command_imports_and_refuses_with_the_messages(users, tmp_path) -> None:  # type: ignore[no-untyped-def]
    users["admin"]  # the default --owner
    archive = tmp_path / "tiny.zip"
    archive.write_bytes(beir_zip())
    out = io.StringIO()
    call_command(
        "import_beir", str(archive), "--corpus", "c", "--tasks", "t", "--owner", users["operator"].username, stdout=out
    )
    assert "5 queries" in out.getvalue() and "retrieval_eval" in out.getvalue()
    archive.write_bytes(beir_zip(qrels="q-metal\tcopper\n"))
    with pytest.raises(CommandError, match="qrels/test.tsv line 1: expected 3 tab-separated columns"):
        call_command(
            "import_beir", str(archive), "--corpus", "c2", "--tasks", "t2", "--owner", users["operator"].username
        )
    assert not Dataset.objects.filter(name__in=["c2", "t2"]).exists()


def test_imported_queries_are_search_tasks_whose_documents_the_launch_checks(client_for) -> None:  # type: ignore[no-untyped-def]
    from apps.search.services.envs import corpus_missing_chunks
    from workers.search.environment import SearchEnv

    body = post(client_for("operator"), beir_zip()).json()
    corpus = DatasetVersion.objects.get(pk=body["corpus_version"]["id"])
    tasks = DatasetVersion.objects.get(pk=body["tasks_version"]["id"])
    with tasks.file.open("rb") as handle:
        rows = [json.loads(line) for line in handle.read().splitlines()]
    assert all(SearchEnv.validate_task_row(row, index=i).id for i, row in enumerate(rows, 1))
    assert corpus_missing_chunks(rows, corpus, environment="search") == []
    stray = [{**rows[0], "gold_doc_ids": ["copper", "nickel"]}]
    [problem] = corpus_missing_chunks(stray, corpus, environment="search")
    assert "task row 1 names document(s) not in" in problem and "nickel" in problem
