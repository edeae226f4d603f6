"""The code-aware analyzer, weighted and R2 fusion, dense windows, and the index identity of older configs."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from workers.search import embed
from workers.search.analyzers import Analyzer, code_tokens
from workers.search.index import IndexConfig, SearchIndex, rrf_fuse
from workers.search.retrieval_eval import bootstrap_interval, query_metrics, summarize
from workers.search.types import Chunk


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("--max-workers", ["--max-workers", "max", "workers"]),
        ("os.path.join", ["os.path.join", "os", "path", "join"]),
        ("snake_case_name", ["snake_case_name", "snake", "case", "name"]),
        ("getAttributeNS", ["getattributens", "get", "attribute", "ns"]),
        ("HTTP2Server", ["http2server", "http2", "server"]),
        ("-v", ["-v"]),
        ("__init__", ["init"]),
    ],
)
def test_the_code_tokenizer_keeps_names_whole_and_adds_their_parts(text: str, expected: list[str]) -> None:
    assert code_tokens(text, stopwords=False, stem=None) == expected


def test_the_code_tokenizer_stems_and_filters_plain_words_only() -> None:
    analyzer = Analyzer("code", "english", "en")
    [tokens] = analyzer.tokens(["Running the with_as workers"])
    # `the` is a stopword and `running` is stemmed; the compound keeps its stopword part `with` out of its parts
    # but the whole token stays as written.
    assert tokens == ["run", "with_as", "worker"]


def test_the_words_tokenizer_is_bm25s_own() -> None:
    [tokens] = Analyzer("words", None, "en").tokens(["Use os.path.join --verbose"])
    assert tokens == ["use", "os", "path", "join", "verbose"]


def test_weighted_rrf_and_chromas_r2() -> None:
    lists = {"bm25": ["a", "b", "c"], "dense": ["c", "a"]}
    plain = dict(rrf_fuse(lists, k=60))
    assert plain["a"] == pytest.approx(1 / 61 + 1 / 62)
    weighted = dict(rrf_fuse(lists, k=60, weights={"bm25": 1.0, "dense": 0.25}))
    assert weighted["c"] == pytest.approx(1 / 63 + 0.25 / 61)
    # R2: 0-based ranks, w_i / (k + r_i); Chroma negates the sum, here it is returned as is (higher is better).
    r2 = dict(rrf_fuse(lists, k=60, weights={"bm25": 2.0, "dense": 1.0}, form="r2"))
    assert r2["a"] == pytest.approx(2 / 60 + 1 / 61)
    assert r2["b"] == pytest.approx(2 / 61)
    # A weight of 0 leaves the list's order out.
    assert [c for c, _ in rrf_fuse(lists, k=60, weights={"dense": 0.0})] == ["a", "b", "c"]


def test_configs_from_before_the_new_fields_keep_their_hash() -> None:
    old = {
        "alpha": 0.5,
        "bm25_b": 0.75,
        "bm25_k1": 1.5,
        "candidates": 50,
        "dense": True,
        "rerank_top": 50,
        "reranker": "convex",
        "rrf_k": 60,
        "stemmer": "english",
        "stopwords": "en",
    }
    digest = hashlib.sha256(json.dumps(old, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    # A stored config lacks the later fields: it is read with their legacy values, which reproduce the index it
    # was built as, and keeps its hash.
    stored = IndexConfig.from_stored(old, format_version=1)
    assert (stored.dense_weight, stored.dense_windows, stored.tokenizer) == (1.0, False, "words")
    assert stored.content_hash() == digest
    assert IndexConfig(**old, tokenizer="code").content_hash() != digest
    # Today's defaults are another index.
    assert IndexConfig().content_hash() != digest
    assert IndexConfig.from_stored(IndexConfig().model_dump(mode="json"), format_version=2) == IndexConfig()


def test_a_long_chunk_is_found_by_a_passage_past_its_first_window() -> None:
    filler = " ".join(f"gardening note {i} about tomatoes and soil." for i in range(120))
    tail = "The lighthouse keeper polished the great lens every night before the storm."
    chunks = [
        Chunk("long#0", "long", 0, f"{filler} {tail}"),
        Chunk("other#0", "other", 0, "Recipes for bread, cakes and pastries baked at home."),
        Chunk("third#0", "third", 0, "A guide to bicycles, gears and chains."),
    ]
    assert len(embed.windows(chunks[0].text)) > 2
    query = "lighthouse keeper polishing the lens"
    plain = SearchIndex.build(chunks, IndexConfig(reranker="none", bm25_weight=0.0, dense_windows=False))
    windowed = SearchIndex.build(chunks, IndexConfig(reranker="none", bm25_weight=0.0, dense_windows=True))
    plain_dense = plain._dense_scores(query)
    windowed_dense = windowed._dense_scores(query)
    assert plain_dense is not None and windowed_dense is not None
    assert windowed_dense[0] > plain_dense[0] + 0.1
    assert windowed.search(query, k=1)[0].chunk.chunk_id == "long#0"
    assert windowed.manifest["embedding"]["rows"] == len(embed.windows(chunks[0].text)) + 2


def test_a_windowed_index_saves_and_loads(tmp_path) -> None:
    chunks = [Chunk(f"d{i}#0", f"d{i}", 0, ("word " * 400) + f"topic {i}") for i in range(3)]
    built = SearchIndex.build(chunks, IndexConfig(dense_windows=True))
    built.save(tmp_path)
    loaded = SearchIndex.load(tmp_path)
    query = "topic 2"
    assert np.allclose(loaded._dense_scores(query), built._dense_scores(query))
    (tmp_path / "window_starts.npy").unlink()
    with pytest.raises(FileNotFoundError):
        SearchIndex.load(tmp_path)


def test_embedding_runtime_is_a_documented_choice(monkeypatch) -> None:
    monkeypatch.setenv("CRUCIBLE_EMBED_DTYPE", "float32")
    assert embed.runtime() == "float32"
    monkeypatch.setenv("CRUCIBLE_EMBED_DTYPE", "fp8")
    with pytest.raises(ValueError, match="CRUCIBLE_EMBED_DTYPE"):
        embed.runtime()


def test_bfloat16_vectors_stay_close_to_float32(monkeypatch) -> None:
    texts = ["The cat sat on the mat.", "Configure the broker URL with --broker or broker_url."]
    monkeypatch.setenv("CRUCIBLE_EMBED_DTYPE", "float32")
    full = embed.embed_texts(texts)
    monkeypatch.setenv("CRUCIBLE_EMBED_DTYPE", "bfloat16")
    half = embed.embed_texts(texts)
    assert np.allclose(np.linalg.norm(half, axis=1), 1.0, atol=1e-5)
    assert float(np.min(np.sum(full * half, axis=1))) > 0.99


def test_retrieval_metrics_by_hand() -> None:
    assert query_metrics(["x", "y", "gold"], "gold") == {
        "recall@1": 0.0,
        "recall@5": 1.0,
        "recall@10": 1.0,
        "mrr": pytest.approx(1 / 3),
        "ndcg@10": pytest.approx(0.5),
    }
    missing = query_metrics(["x"] * 20, "gold")
    assert missing["mrr"] == 0 and missing["recall@10"] == 0
    low, high = bootstrap_interval([0.0, 1.0] * 50)
    assert low < 0.5 < high
    assert summarize([{"recall@1": 1.0}, {"recall@1": 0.0}])["recall@1"]["mean"] == 0.5


SECOND_LIST_CHUNKS = [
    Chunk("flag#0", "flag", 0, "Pass --max-workers to bound the pool; the worker count defaults to the cores."),
    Chunk("prose#0", "prose", 0, "Max said the workers of the pool went home; max workers, max pool, max max."),
    Chunk("other#0", "other", 0, "Queues route messages to exchanges by their routing key."),
]


def test_a_second_bm25_list_over_the_code_tokenizer_is_fused_and_named() -> None:
    words = SearchIndex.build(SECOND_LIST_CHUNKS, IndexConfig(dense=False))
    both = SearchIndex.build(SECOND_LIST_CHUNKS, IndexConfig(dense=False, second_tokenizer="code"))
    heavier = SearchIndex.build(
        SECOND_LIST_CHUNKS, IndexConfig(dense=False, second_tokenizer="code", second_bm25_weight=2.0)
    )
    # The words list sees `max`, `workers` and prefers the chunk that repeats them; the code list also matches
    # `--max-workers` whole and puts the flag's own chunk first. At equal weights the tie goes to the first list;
    # weighted 2:1 the code list wins.
    assert words.search("--max-workers", k=1)[0].chunk.chunk_id == "prose#0"
    assert both._bm25_scores("--max-workers", second=True).argmax() == 0
    assert both.search("--max-workers", k=1)[0].chunk.chunk_id == "prose#0"
    hits = heavier.search("--max-workers", k=2)
    assert hits[0].chunk.chunk_id == "flag#0"
    assert hits[0].ranks == {"bm25": 2, "bm25_2": 1}
    reranked = heavier.rerank("--max-workers", ["other#0", "prose#0", "flag#0"])
    assert reranked[0].chunk.chunk_id == "flag#0" and reranked[-1].chunk.chunk_id == "other#0"
    assert both.manifest["vocabulary"] > words.manifest["vocabulary"]


def test_a_hybrid_with_two_bm25_lists_saves_and_loads(tmp_path) -> None:
    config = IndexConfig(second_tokenizer="code", second_bm25_weight=0.5, dense_windows=False)
    built = SearchIndex.build(SECOND_LIST_CHUNKS, config)
    built.save(tmp_path)
    loaded = SearchIndex.load(tmp_path)
    assert loaded.config == config
    for query in ("--max-workers", "routing key", "pool"):
        assert [(h.chunk.chunk_id, h.ranks) for h in loaded.search(query)] == [
            (h.chunk.chunk_id, h.ranks) for h in built.search(query)
        ]
    # The second list's convex share follows its weight: 0.5 of 1.5.
    head = np.arange(3, dtype=np.int64)
    lexical = built._lexical("--max-workers")
    dense = built._dense_scores("--max-workers")
    assert dense is not None
    alpha = config.alpha
    mm = {n: (s - s.min()) / (s.max() - s.min()) for n, s in lexical.items()}
    expected = alpha * (dense - dense.min()) / (dense.max() - dense.min()) + (1 - alpha) * (
        mm["bm25"] / 1.5 + mm["bm25_2"] * 0.5 / 1.5
    )
    assert np.allclose(built._convex(head, lexical, dense), expected, atol=1e-6)
    (tmp_path / "bm25_2").rename(tmp_path / "elsewhere")
    with pytest.raises(FileNotFoundError):
        SearchIndex.load(tmp_path)


def test_a_second_list_that_repeats_the_first_is_refused_and_old_configs_have_none() -> None:
    with pytest.raises(ValueError, match="second_tokenizer='words'.*repeats the first BM25 list"):
        IndexConfig(second_tokenizer="words")
    assert IndexConfig(second_tokenizer="words", second_stemmer="english").second_stemmer == "english"
    # An index of format 2 predates the second list: read without one, whatever today's default is.
    stored = {k: v for k, v in IndexConfig().model_dump(mode="json").items() if not k.startswith("second_")}
    assert IndexConfig.from_stored(stored, format_version=2).second_tokenizer is None
    assert (
        IndexConfig.from_stored(stored, format_version=2).content_hash()
        == IndexConfig(**{**stored, "second_tokenizer": None}).content_hash()
    )
