"""BEIR archives read as published (workers.search.beir), and document-level retrieval metrics
(workers.search.retrieval_docs) against hand-computed values."""

from __future__ import annotations

import io
import json
import math
import struct
import zipfile

import pytest

from workers.search.beir import BeirError, parse_qrels, read_beir_zip
from workers.search.retrieval_docs import doc_metrics, doc_queries, fold_to_documents
from workers.search.types import Chunk

LIMITS = {"max_bytes": 10_000_000, "max_document_bytes": 1_000_000}


def jsonl(rows: list[dict]) -> str:  # type: ignore[type-arg]
    return "".join(json.dumps(r) + "\n" for r in rows)


def beir_zip(files: dict[str, str | bytes], top: str = "tiny/") -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in files.items():
            archive.writestr(top + name, content)
    return buffer.getvalue()


CORPUS = [
    {"_id": "d1", "title": "Copper", "text": "Copper conducts heat and electricity well."},
    {"_id": "d2", "title": "Granite", "text": "Granite is an igneous rock.", "metadata": {"url": "x"}},
    {"_id": 3, "title": "Only a title", "text": ""},
]
QUERIES = [
    {"_id": "q1", "text": "what conducts heat"},
    {"_id": "q2", "text": "igneous rock"},
    {"_id": "q3", "text": "x"},
]
QRELS = "query-id\tcorpus-id\tscore\nq1\td1\t2\nq1\t3\t1\nq2\td2\t1\nq2\td1\t0\n"


def good_files() -> dict[str, str | bytes]:
    return {"corpus.jsonl": jsonl(CORPUS), "queries.jsonl": jsonl(QUERIES), "qrels/test.tsv": QRELS}


def test_a_published_zip_gives_documents_and_one_row_per_judged_query() -> None:
    beir = read_beir_zip(beir_zip(good_files()), **LIMITS)
    docs = {d.doc_id: d for d in beir.documents.documents}
    assert sorted(docs) == ["3", "d1", "d2"]
    assert docs["3"].text == "Only a title"  # a blank text falls back to the title
    assert docs["d2"].metadata == {"url": "x"} and docs["d1"].title == "Copper"
    rows = {r["id"]: r for r in beir.tasks}
    assert sorted(rows) == ["q1", "q2"]  # q3 is judged nowhere
    assert rows["q1"]["gold_doc_ids"] == ["d1", "3"]  # highest grade first
    assert rows["q1"]["relevance"] == {"d1": 2, "3": 1}
    assert rows["q2"]["gold_doc_ids"] == ["d2"] and rows["q2"]["relevance"] == {"d2": 1, "d1": 0}
    assert {r["query_set"] for r in beir.tasks} == {"test"} and rows["q1"]["prompt"] == "what conducts heat"
    assert beir.report["splits"] == {"test": {"queries": 2, "without_relevant_documents": 0}}


def test_files_at_the_top_and_trec_four_column_qrels_are_read() -> None:
    files = good_files()
    files["qrels/dev.tsv"] = "q3\t0\td1\t1\n"
    beir = read_beir_zip(beir_zip(files, top=""), splits=["dev"], **LIMITS)
    assert [(r["id"], r["gold_doc_ids"], r["query_set"]) for r in beir.tasks] == [("q3", ["d1"], "dev")]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"corpus.jsonl": jsonl(CORPUS) + "{not json\n"}, "corpus.jsonl line 4: not valid JSON"),
        ({"corpus.jsonl": jsonl([{"title": "t", "text": "x"}])}, "corpus.jsonl line 1: field '_id' is missing"),
        ({"corpus.jsonl": jsonl([{"_id": "a b", "text": "x"}])}, "corpus.jsonl line 1: field '_id' must not contain"),
        (
            {"corpus.jsonl": jsonl([*CORPUS, CORPUS[0]])},
            "corpus.jsonl line 4: field '_id' 'd1' is already used on line 1",
        ),
        ({"corpus.jsonl": jsonl([{"_id": "d", "text": 5}])}, "corpus.jsonl line 1: field 'text' must be a string"),
        ({"queries.jsonl": jsonl([{"_id": "q1"}])}, "queries.jsonl line 1: field 'text' is missing"),
        ({"qrels/test.tsv": "q1\td1\thigh\n"}, "qrels/test.tsv line 1: column 'score' must be an integer"),
        ({"qrels/test.tsv": "q1 d1 1\n"}, "qrels/test.tsv line 1: expected 3 tab-separated columns"),
        ({"qrels/test.tsv": "q1\td1\t1\nq1\td1\t2\n"}, "qrels/test.tsv line 2: query 'q1' judges corpus-id 'd1' again"),
        ({"qrels/test.tsv": "q1\tnope\t1\n"}, "qrels/test.tsv: query 'q1' judges corpus-id 'nope', which is not in"),
        ({"qrels/test.tsv": "q9\td1\t1\n"}, "qrels/test.tsv: query-id 'q9' is not in queries.jsonl"),
        ({"qrels/test.tsv": "q1\td1\t0\n"}, "no query has a relevant document"),
        ({"corpus.jsonl": b"\xff\xfe\n"}, "corpus.jsonl line 1: not valid UTF-8"),
    ],
)
def test_malformed_files_are_refused_naming_file_line_and_field(change: dict, expected: str) -> None:  # type: ignore[type-arg]
    files = {**good_files(), **change}
    with pytest.raises(BeirError) as caught:
        read_beir_zip(beir_zip(files), **LIMITS)
    assert any(expected in e for e in caught.value.errors), caught.value.errors


def test_archive_problems_name_what_is_missing() -> None:
    with pytest.raises(BeirError, match="not a readable zip"):
        read_beir_zip(b"corpus", **LIMITS)
    files = good_files()
    del files["queries.jsonl"]
    with pytest.raises(BeirError, match="the zip has no queries.jsonl"):
        read_beir_zip(beir_zip(files), **LIMITS)
    with pytest.raises(BeirError, match="split: train not in the zip; it has qrels for test"):
        read_beir_zip(beir_zip(good_files()), splits=["train"], **LIMITS)
    with pytest.raises(BeirError, match="unpack to"):
        read_beir_zip(beir_zip(good_files()), max_bytes=100, max_document_bytes=100)
    both = {**good_files(), "qrels/dev.tsv": "q1\td1\t1\n"}
    with pytest.raises(BeirError, match=r"query 'q1' is also judged in qrels/\w+.tsv; import one split at a time"):
        read_beir_zip(beir_zip(both), **LIMITS)


def test_a_header_line_is_skipped_only_on_the_first_line() -> None:
    assert parse_qrels(b"query-id\tcorpus-id\tscore\nq\td\t1\n", name="q.tsv") == {"q": {"d": 1}}
    with pytest.raises(BeirError, match="line 2: column 'score'"):
        parse_qrels(b"q\td\t1\nquery-id\tcorpus-id\tscore\n", name="q.tsv")


def test_graded_ndcg_recall_and_mrr_by_hand() -> None:
    relevance = {"a": 3, "b": 1, "c": 0, "z": 2}  # z is never retrieved
    row = doc_metrics(["c", "a", "x", "b"], relevance)
    dcg = 3 / math.log2(3) + 1 / math.log2(5)
    ideal = 3 / math.log2(2) + 2 / math.log2(3) + 1 / math.log2(4)
    assert row["ndcg@10"] == pytest.approx(dcg / ideal)
    assert (
        row["recall@1"] == 0.0 and row["recall@5"] == pytest.approx(2 / 3) and row["recall@100"] == pytest.approx(2 / 3)
    )
    assert row["mrr"] == pytest.approx(1 / 2)
    perfect = doc_metrics(["a", "z", "b"], relevance)
    assert perfect["ndcg@10"] == pytest.approx(1.0) and perfect["recall@5"] == 1.0 and perfect["mrr"] == 1.0
    assert doc_metrics([], relevance) == {
        "recall@1": 0.0,
        "recall@5": 0.0,
        "recall@10": 0.0,
        "recall@100": 0.0,
        "mrr": 0.0,
        "ndcg@10": 0.0,
    }


def test_rankings_fold_to_documents_at_their_first_chunk_and_shared_chunks_count_for_each() -> None:
    chunks = {
        "a#0": Chunk("a#0", "a", 0, "x"),
        "a#1": Chunk("a#1", "a", 1, "y"),
        "b#0": Chunk("b#0", "b", 0, "z", metadata={"also_in": ["c#4"]}),
    }
    assert fold_to_documents(["a#1", "b#0", "a#0", "gone#2"], chunks) == ["a", "b", "c", "gone"]


def test_rows_with_gold_doc_ids_only_are_binary_relevance() -> None:
    rows = [
        {"id": 1, "prompt": "p", "gold_doc_ids": ["a", "b"]},
        {"id": 2, "prompt": "p", "gold_chunk_ids": ["a#0"], "gold_doc_ids": ["a"]},  # chunk gold: not this scorer
        {"id": 3, "prompt": "p", "relevance": {"a": 2}, "query_set": "dev"},
    ]
    queries = doc_queries(rows)
    assert [(q.qid, q.relevance, q.query_set) for q in queries] == [
        ("1", {"a": 1, "b": 1}, "tasks"),
        ("3", {"a": 2}, "dev"),
    ]


def lying_size(data: bytes) -> bytes:
    """The zip with its first central-directory entry claiming 10 bytes fewer than the member holds."""
    out = bytearray(data)
    at = out.find(b"PK\x01\x02")
    size = struct.unpack_from("<I", out, at + 24)[0]
    struct.pack_into("<I", out, at + 24, max(size - 10, 1))
    return bytes(out)


def test_a_member_that_lies_about_its_size_is_a_named_error_not_a_crash() -> None:
    with pytest.raises(BeirError, match="tiny/corpus.jsonl cannot be read"):
        read_beir_zip(lying_size(beir_zip(good_files())), **LIMITS)
