"""Retrieval (workers.search.index): RRF math, hybrid search with exclusion, reranking, grep with its deadline,
save/load, object storage caching, and the index build job's build function.

The MiniLM model takes ~11 s to load, so every test that embeds shares one module-scoped index."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import Stemmer
from pydantic import ValidationError

from workers.jobs.build_index import BuildIndexError, BuildIndexSpec, build
from workers.search import embed
from workers.search import index as search_index
from workers.search import index_store as index_module
from workers.search.index import GrepError, IndexConfig, SearchIndex, rrf_fuse
from workers.search.index_store import load_index, save_index
from workers.search.types import Chunk, dump_chunks_jsonl

DOCS = {
    "eiffel": [
        "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris.",
        "Gustave Eiffel's company designed and built the tower for the 1889 World's Fair.",
        "The tower is 330 metres tall, about the same height as an 81-storey building.",
    ],
    "photosynthesis": [
        "Photosynthesis is the process by which chlorophyll-bearing organisms capture energy.",
        "Chlorophyll absorbs sunlight, and carbon dioxide plus water are turned into glucose and oxygen.",
    ],
    "pasta": [
        "Bring a large pot of salted water to a rolling boil before adding the spaghetti.",
        "Cook the noodles until al dente, then drain and toss them with the sauce.",
    ],
    "volcano": [
        "A volcano is a rupture in the crust of a planetary-mass object.",
        "Magma, ash and gases escape from a magma chamber below the surface during an eruption.",
    ],
    "python-dict": [
        "A dictionary maps hashable keys to arbitrary values; keys are unique.",
        "dict.get returns the value for key if key is in the dictionary, else default.",
    ],
    "bicycle": [
        "A bicycle is a human-powered, pedal-driven vehicle with two wheels attached to a frame.",
        "Riders balance by steering into the direction of a fall.",
    ],
    "coffee": [
        "Coffee is brewed from roasted seeds of the Coffea plant.",
        "Espresso forces hot water through finely ground coffee under pressure.",
    ],
    "moon": [
        "The Moon orbits Earth once every 27.3 days and always shows the same face.",
        "Tides on Earth are raised mostly by the Moon's gravity.",
    ],
    "errors": [
        "error code 404 means the page was not found",
        "error code 500 is an internal server failure",
        "error code 503 means the service is unavailable",
        "error code 418 is a teapot joke",
        "error code 401 asks for authentication",
        "error code 403 forbids the request",
        "error code 429 means too many requests",
    ],
}


LEGACY = IndexConfig(stemmer="english", alpha=0.5, dense_weight=1.0, dense_windows=False)


def make_chunks() -> list[Chunk]:
    return [
        Chunk(chunk_id=f"{doc}#{i}", doc_id=doc, position=i, text=text, title=doc.replace("-", " "))
        for doc, texts in DOCS.items()
        for i, text in enumerate(texts)
    ]


@pytest.fixture(scope="module")
def hybrid() -> SearchIndex:
    # The fusion oracles below are written for one vector per chunk, equal RRF weights and alpha 0.5 with the
    # English stemmer: the pre-harness settings, spelled out.
    return SearchIndex.build(make_chunks(), LEGACY)


@pytest.fixture(scope="module")
def lexical() -> SearchIndex:
    return SearchIndex.build(make_chunks(), LEGACY.model_copy(update={"dense": False}))


def ids(hits: list) -> list[str]:  # type: ignore[type-arg]
    return [h.chunk.chunk_id for h in hits]


# --- RRF (docs/methods.md R1) -----------------------------------------------------------------------------------------
def test_rrf_matches_hand_computed_values():
    fused = dict(rrf_fuse({"bm25": ["a", "b", "c"], "dense": ["b", "d"]}, k=60))
    assert fused["a"] == pytest.approx(1 / 61)
    assert fused["b"] == pytest.approx(1 / 62 + 1 / 61)
    assert fused["c"] == pytest.approx(1 / 63)
    assert fused["d"] == pytest.approx(1 / 62)
    assert [item for item, _ in rrf_fuse({"bm25": ["a", "b", "c"], "dense": ["b", "d"]})] == ["b", "a", "d", "c"]


def test_rrf_uses_one_based_ranks_and_breaks_ties_by_best_rank():
    fused = rrf_fuse({"x": ["p", "q"], "y": ["q", "p"]}, k=1)
    # Both get 1/(1+1) + 1/(1+2); the tie goes to the earlier list's first item.
    assert fused == [("p", pytest.approx(0.5 + 1 / 3)), ("q", pytest.approx(0.5 + 1 / 3))]


def test_rrf_counts_an_id_a_list_repeats_once_at_its_first_place():
    fused = dict(rrf_fuse({"bm25": ["a", "a", "b", "a"], "dense": ["b"]}, k=60))
    assert fused["a"] == pytest.approx(1 / 61)  # not 1/61 + 1/62 + 1/64
    assert fused["b"] == pytest.approx(1 / 62 + 1 / 61)  # ranks over the list's distinct ids


def test_index_config_rejects_unknown_fields_and_hashes_defaults_alike():
    with pytest.raises(ValidationError):
        IndexConfig.model_validate({"rrf": 60})
    with pytest.raises(ValidationError):
        IndexConfig(candidates=0)
    assert IndexConfig().content_hash() == IndexConfig(rrf_k=60, reranker="convex").content_hash()
    assert IndexConfig().content_hash() != IndexConfig(rrf_k=10).content_hash()


# --- search -------------------------------------------------------------------------------------------------------
def test_bm25_finds_the_chunk_that_shares_the_query_words(lexical):
    hits = lexical.search("how tall is the Eiffel tower in metres", k=3)
    assert hits[0].chunk.chunk_id == "eiffel#2"
    assert all(h.retrievers == ["bm25"] for h in hits)
    assert [h.ranks["bm25"] for h in hits] == [1, 2, 3]


def test_dense_finds_a_paraphrase_that_shares_no_word(hybrid):
    query = "how do green leaves make sugar from light"
    target = hybrid.chunk("photosynthesis#1")
    assert target is not None
    assert not {w.lower() for w in query.split()} & {w.lower().strip(",.") for w in target.text.split()}
    hits = hybrid.search(query, k=3)
    assert "photosynthesis#1" in ids(hits)
    found = next(h for h in hits if h.chunk.chunk_id == "photosynthesis#1")
    assert "dense" in found.ranks


def test_hybrid_hits_carry_ranks_from_both_retrievers(hybrid):
    hits = hybrid.search("Eiffel tower height in metres", k=5)
    assert hits[0].chunk.doc_id == "eiffel"
    assert hits[0].retrievers == ["bm25", "dense"]
    assert all(h.ranks.get("dense", 1) >= 1 for h in hits)
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True)


def test_exclusion_never_returns_excluded_ids_and_still_returns_k(hybrid, lexical):
    first = ids(hybrid.search("error code", k=5))
    again = hybrid.search("error code", k=5, exclude=first)
    assert len(again) == 5
    assert not set(ids(again)) & set(first)
    # BM25 alone: 7 chunks hold "error code"; with 5 excluded only the other 2 can come back.
    lexical_first = ids(lexical.search("error code", k=5))
    rest = lexical.search("error code", k=5, exclude=lexical_first)
    assert sorted(ids(rest)) == sorted(set(f"errors#{i}" for i in range(7)) - set(lexical_first))


def test_excluding_everything_returns_nothing(hybrid):
    assert hybrid.search("tower", k=5, exclude=[c.chunk_id for c in hybrid.chunks]) == []


def test_convex_reranker_scores_match_an_independent_computation(hybrid):
    query = "boiling water for spaghetti"
    hits = hybrid.search(query, k=5)
    # Oracle: bm25s's own scores and the raw embeddings, min-max normalised over the reranked candidates.
    rows = {c.chunk_id: i for i, c in enumerate(hybrid.chunks)}
    tokens = search_index.bm25s.tokenize(
        query, stopwords="en", stemmer=Stemmer.Stemmer("english"), return_ids=False, show_progress=False
    )[0]
    bm25 = hybrid._bm25.get_scores(tokens)
    dense = np.asarray(hybrid._embeddings) @ embed.embed_query(query)

    # 24 chunks and 50 candidates: every chunk is a dense candidate, so the reranked set is the whole corpus.
    def mm(x: np.ndarray) -> np.ndarray:
        return (x - x.min()) / (x.max() - x.min())

    expected = 0.5 * mm(dense) + 0.5 * mm(bm25)
    for hit in hits:
        assert hit.score == pytest.approx(expected[rows[hit.chunk.chunk_id]], abs=1e-5)
    assert ids(hits) == [hybrid.chunks[i].chunk_id for i in np.argsort(-expected, kind="stable")[:5]]
    assert hits[0].chunk.doc_id == "pasta"


def test_rrf_only_reranker_keeps_the_fused_order(hybrid, lexical):
    plain = SearchIndex(
        hybrid.chunks, LEGACY.model_copy(update={"reranker": "none"}), hybrid._bm25, hybrid._embeddings, {}
    )
    query = "Eiffel tower"
    by_dense = np.argsort(-(np.asarray(hybrid._embeddings) @ embed.embed_query(query)), kind="stable")
    expected = rrf_fuse(
        {"bm25": ids(lexical.search(query, k=50)), "dense": [hybrid.chunks[i].chunk_id for i in by_dense]}
    )[:5]
    hits = plain.search(query, k=5)
    assert ids(hits) == [chunk_id for chunk_id, _ in expected]
    assert [h.score for h in hits] == pytest.approx([score for _, score in expected])


def test_rerank_orders_a_documents_chunks_by_relevance(hybrid, lexical):
    chunk_ids = [c.chunk_id for c in hybrid.document("eiffel")]
    assert chunk_ids == ["eiffel#0", "eiffel#1", "eiffel#2"]
    for index in (hybrid, lexical):
        hits = index.rerank("height in metres", list(reversed(chunk_ids)))
        assert ids(hits)[0] == "eiffel#2"
        assert sorted(ids(hits)) == chunk_ids
    with pytest.raises(KeyError, match="nope#0"):
        hybrid.rerank("x", ["eiffel#0", "nope#0"])
    assert hybrid.rerank("x", []) == []


def test_documents_and_chunks_are_looked_up_by_id(hybrid):
    assert hybrid.has_document("moon") and not hybrid.has_document("mars")
    assert hybrid.document("mars") == []
    assert hybrid.chunk("moon#1").text.startswith("Tides")  # type: ignore[union-attr]
    assert hybrid.chunk("moon#9") is None


def test_build_refuses_an_empty_corpus_and_repeated_ids():
    with pytest.raises(ValueError, match="no chunks"):
        SearchIndex.build([], IndexConfig(dense=False))
    chunk = make_chunks()[0]
    with pytest.raises(ValueError, match="appears twice"):
        SearchIndex.build([chunk, chunk], IndexConfig(dense=False))


# --- grep ---------------------------------------------------------------------------------------------------------
def test_grep_returns_matching_chunks_in_corpus_order(lexical):
    hits = lexical.grep(r"Eiffel('s)? (Tower|company)")
    assert ids(hits) == ["eiffel#0", "eiffel#1"]
    assert [h.ranks for h in hits] == [{"grep": 1}, {"grep": 2}]
    assert lexical.grep(r"(?i)^espresso") and not lexical.grep(r"^espresso")


def test_grep_returns_at_most_five_chunks_and_honours_exclusion(lexical):
    hits = lexical.grep(r"error code \d+")
    assert ids(hits) == [f"errors#{i}" for i in range(5)]
    assert ids(lexical.grep(r"error code \d+", max_chunks=2, exclude=["errors#0"])) == ["errors#1", "errors#2"]


def test_grep_explains_an_invalid_or_too_long_pattern(lexical):
    with pytest.raises(GrepError, match=r"invalid regular expression: missing \) at position"):
        lexical.grep("tower (of")
    with pytest.raises(GrepError, match="at most 200"):
        lexical.grep("a" * 201)
    with pytest.raises(GrepError, match="empty"):
        lexical.grep("")


def test_a_catastrophic_pattern_times_out_instead_of_hanging():
    chunks = [Chunk(chunk_id="long#0", doc_id="long", position=0, text="a" * 20_000 + "b")]
    index = SearchIndex.build(chunks, IndexConfig(dense=False))
    # Nested repetition backtracks exponentially on a run of a's that ends in b; the deadline stops it.
    with pytest.raises(GrepError, match=r"took longer than 0.2 s; use a simpler pattern"):
        index.grep(r"(a+)+$", timeout_s=0.2)


# --- save, load, storage --------------------------------------------------------------------------------------------
QUERIES = ["Eiffel tower height", "how do plants make sugar", "error code 503", "spaghetti"]


def test_save_and_load_give_identical_results(hybrid, tmp_path):
    hybrid.save(tmp_path / "idx")
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    assert manifest["chunks"] == len(hybrid.chunks) and manifest["documents"] == len(DOCS)
    assert manifest["config"] == LEGACY.model_dump(mode="json") and manifest["format"] == 3
    assert manifest["corpus_hash"] == hashlib.sha256(dump_chunks_jsonl(make_chunks())).hexdigest()
    assert set(manifest["build_seconds"]) == {"bm25", "dense"}
    loaded = SearchIndex.load(tmp_path / "idx")
    assert loaded.chunks == hybrid.chunks and loaded.config == hybrid.config
    for query in QUERIES:
        before, after = hybrid.search(query, k=5, exclude=["eiffel#0"]), loaded.search(query, k=5, exclude=["eiffel#0"])
        assert [(h.chunk, h.score, h.ranks) for h in before] == [(h.chunk, h.score, h.ranks) for h in after]
    assert ids(loaded.grep("tower")) == ids(hybrid.grep("tower"))


def test_a_format_1_index_loads_with_the_settings_it_was_built_with(hybrid, tmp_path):
    """An index saved before the later IndexConfig fields existed: its manifest lacks them, and it must load as
    built (one vector per chunk, equal weights), not with today's defaults."""
    hybrid.save(tmp_path / "old")
    manifest_path = tmp_path / "old" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    for name in ("tokenizer", "rrf_form", "bm25_weight", "dense_weight", "dense_windows"):
        del manifest["config"][name]
    manifest["format"] = 1
    manifest_path.write_text(json.dumps(manifest))
    loaded = SearchIndex.load(tmp_path / "old")
    assert loaded.config == hybrid.config and loaded.config.content_hash() == hybrid.config.content_hash()
    assert ids(loaded.search("Eiffel tower", k=5)) == ids(hybrid.search("Eiffel tower", k=5))


def test_load_refuses_a_directory_without_an_index(tmp_path):
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        SearchIndex.load(tmp_path)


def test_load_index_from_file_uri_copies_once_and_caches_per_process(lexical, tmp_path, monkeypatch):
    monkeypatch.setenv("CRUCIBLE_INDEX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(index_module, "_loaded", {})
    uri = f"file://{tmp_path}/store/corpus-v1/idx"
    save_index(lexical, uri)
    first = load_index(uri)
    assert load_index(uri) is first
    cached = index_module.index_cache_dir(uri)
    assert cached.parent == tmp_path / "cache" and (cached / "manifest.json").is_file()
    assert ids(first.search("error code", k=3)) == ids(lexical.search("error code", k=3))

    # A new process (empty in-memory cache) reuses the local copy while the stored manifest is unchanged ...
    monkeypatch.setattr(index_module, "_loaded", {})
    (cached / "marker").write_text("kept")
    load_index(uri)
    assert (cached / "marker").is_file()
    # ... and fetches again when the index at the URI was replaced.
    other = SearchIndex.build(make_chunks()[:5], IndexConfig(dense=False))
    save_index(other, uri)
    monkeypatch.setattr(index_module, "_loaded", {})
    assert len(load_index(uri).chunks) == 5
    assert not (cached / "marker").exists()


def test_load_index_names_a_missing_index(tmp_path, monkeypatch):
    monkeypatch.setattr(index_module, "_loaded", {})
    with pytest.raises(FileNotFoundError, match="build it first"):
        load_index(f"file://{tmp_path}/nothing")


# --- the build job -------------------------------------------------------------------------------------------------
def job_spec(tmp_path: Path, data: bytes, **overrides: object) -> BuildIndexSpec:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(data)
    fields: dict[str, object] = {
        "run_id": 7,
        "kind": "index",
        "ingest_url": "http://127.0.0.1:1/api/v1/runs/7/ingest/",
        "corpus_uri": f"file://{corpus}",
        "output_uri": f"file://{tmp_path}/out/index",
        "config": {"dense": False},
        "corpus_hash": hashlib.sha256(data).hexdigest(),
    }
    return BuildIndexSpec.model_validate({**fields, **overrides})


def test_build_job_indexes_the_corpus_and_saves_it(tmp_path, monkeypatch):
    monkeypatch.setattr(index_module, "_loaded", {})
    monkeypatch.setenv("CRUCIBLE_INDEX_CACHE", str(tmp_path / "cache"))
    data = dump_chunks_jsonl(make_chunks())
    progress: list[tuple[int, int]] = []
    spec = job_spec(tmp_path, data)
    summary = build(spec, progress=lambda done, total: progress.append((done, total)), log_line=lambda line: None)
    assert summary["chunks"] == len(make_chunks()) and summary["documents"] == len(DOCS)
    assert set(summary["seconds"]) == {"read", "bm25", "dense", "save", "total"}
    assert progress[-1] == (len(make_chunks()), len(make_chunks()))
    loaded = load_index(spec.output_uri)
    assert loaded.manifest["corpus_hash"] == spec.corpus_hash
    assert ids(loaded.search("volcano magma", k=1)) == ["volcano#1"]


def test_build_job_fails_loudly_on_an_empty_or_changed_corpus(tmp_path):
    with pytest.raises(BuildIndexError, match="has no chunks: import documents"):
        build(job_spec(tmp_path, b"\n"), log_line=lambda line: None)
    spec = job_spec(tmp_path, dump_chunks_jsonl(make_chunks()), corpus_hash="0" * 64)
    with pytest.raises(BuildIndexError, match="file changed after its version was created"):
        build(spec, log_line=lambda line: None)
