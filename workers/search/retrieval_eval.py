"""Retrieval evaluation: how well each retriever configuration finds a task's supporting chunks.

Queries come from verified multi-hop tasks (`workers.search.synth`), one per hop:

- hop 0 (the first hop): the quote the question gives of the first supporting chunk; relevant: that chunk.
- hop h >= 1 (later hops): the bridge name the previous chunk mentions, followed by the quote of the chunk that
  documents it (what an agent searches once it has read the previous chunk); relevant: that chunk.

Every retriever is a function from a query to a ranked list of chunk ids. Metrics per query, then averaged:
recall@k (the relevant chunk is among the first k), reciprocal rank (1 / its rank, 0 past `depth`) and nDCG@10
(binary relevance, one relevant chunk: 1 / log2(rank + 1) within the first 10). Each mean comes with a
percentile bootstrap 95% interval over queries.

Before any metric, `lost_evidence` checks that the corpus still holds every task's evidence: each gold chunk id
names a stored chunk (or a copy merged into a shared one), and each quote of it is in some chunk attributed to its
document. A task whose evidence is gone can never be found, so a retriever would be blamed for the import's loss
(docs/corpus-chunking.md).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workers.search import embed
from workers.search.index import IndexConfig, SearchIndex, bm25_index, index_text
from workers.search.synth_corpus import CLOSE_QUOTE, OPEN_QUOTE, SynthCorpus, normalize
from workers.search.types import Chunk, also_in, chunk_doc_ids, doc_of

KS = (1, 5, 10)
Retriever = Callable[[str], Sequence[str]]


@dataclass(frozen=True)
class EvalQuery:
    qid: str
    text: str
    relevant: str
    hop: int


def _quote(task: Mapping[str, Any], chunk_id: str) -> str | None:
    quotes = task.get("provenance", {}).get("quotes", {}).get(chunk_id) or []
    return str(quotes[0]) if quotes else None


def _bridge_name(corpus: SynthCorpus, source: str, target: str) -> str | None:
    """The name chunk `source` writes for the entity that chunk `target` (or its document) is."""
    src, dst = corpus.index_of.get(source), corpus.index_of.get(target)
    if src is None or dst is None:
        return None
    target_doc = corpus.chunks[dst].doc_id
    for mention in corpus.mentions[src]:
        if mention.target.chunk == dst or (mention.target.chunk is None and mention.doc_id == target_doc):
            return mention.surface
    return None


def hop_queries(tasks: Sequence[Mapping[str, Any]], corpus: SynthCorpus) -> list[EvalQuery]:
    """One query per hop of each task (module docstring); hops without a stored quote are left out."""
    out: list[EvalQuery] = []
    for task in tasks:
        gold = [str(c) for c in task["gold_chunk_ids"]]
        for hop, chunk_id in enumerate(gold):
            quote = _quote(task, chunk_id)
            if not quote:
                continue
            quote = quote.replace(OPEN_QUOTE, "")
            if hop == 0:
                text = quote
            else:
                name = _bridge_name(corpus, gold[hop - 1], chunk_id)
                text = f"{name} {quote}" if name else quote
            out.append(EvalQuery(qid=f"{task['id']}:{hop}", text=text, relevant=chunk_id, hop=hop))
    return out


def lost_evidence(tasks: Sequence[Mapping[str, Any]], chunks: Sequence[Chunk]) -> dict[str, list[str]]:
    """{task id: what of its evidence the corpus lost} for every task with a loss (module docstring); {} when none.

    A gold chunk id must be a stored chunk's or a merged copy's (`metadata.also_in`); each quote the task stores
    for it (`provenance.quotes`) must appear, after normalisation (lower case, whitespace collapsed), in a chunk
    attributed to that chunk's document, its shared chunks included."""
    known = {ident for chunk in chunks for ident in (chunk.chunk_id, *also_in(chunk))}
    texts: dict[str, list[str]] = {}
    for chunk in chunks:
        text = normalize(chunk.text)
        for doc_id in chunk_doc_ids(chunk):
            texts.setdefault(doc_id, []).append(text)
    out: dict[str, list[str]] = {}
    for number, task in enumerate(tasks, start=1):
        task_id = str(task.get("id", f"row {number}"))
        problems: list[str] = []
        quotes = task.get("provenance", {}).get("quotes", {}) or {}
        for chunk_id in [str(c) for c in task.get("gold_chunk_ids") or []]:
            doc_id = doc_of(chunk_id)
            if chunk_id not in known:
                problems.append(f"gold chunk {chunk_id} is not in the corpus")
            for quote in quotes.get(chunk_id) or []:
                needle = normalize(str(quote).replace(OPEN_QUOTE, "").replace(CLOSE_QUOTE, ""))
                if needle and not any(needle in text for text in texts.get(doc_id, ())):
                    problems.append(f"quote {str(quote)[:80]!r} of {chunk_id} is in no chunk of document {doc_id}")
        if problems:
            out[task_id] = problems
    return out


def with_stored_ids(tasks: Sequence[Mapping[str, Any]], chunks: Sequence[Chunk]) -> list[dict[str, Any]]:
    """The tasks with every gold chunk id that names a merged copy (`metadata.also_in`) replaced by its stored
    chunk's id (quotes follow), so a retriever that returns the shared chunk is credited for it."""
    stored = {alias: chunk.chunk_id for chunk in chunks for alias in also_in(chunk)}
    if not stored:
        return [dict(task) for task in tasks]
    out = []
    for task in tasks:
        row = dict(task)
        row["gold_chunk_ids"] = [stored.get(str(c), str(c)) for c in task.get("gold_chunk_ids") or []]
        provenance = dict(task.get("provenance") or {})
        if isinstance(provenance.get("quotes"), Mapping):
            provenance["quotes"] = {stored.get(str(k), str(k)): v for k, v in provenance["quotes"].items()}
            row["provenance"] = provenance
        out.append(row)
    return out


def query_metrics(ranked: Sequence[str], relevant: str, depth: int = 100) -> dict[str, float]:
    rank = next((i for i, c in enumerate(ranked[:depth], start=1) if c == relevant), None)
    row = {f"recall@{k}": float(rank is not None and rank <= k) for k in KS}
    row["mrr"] = 1.0 / rank if rank else 0.0
    row["ndcg@10"] = 1.0 / math.log2(rank + 1) if rank and rank <= 10 else 0.0
    return row


def bootstrap_interval(values: Sequence[float], *, rounds: int = 1000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap 95% interval of the mean."""
    if not values:
        return (0.0, 0.0)
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(rounds))
    return (means[int(0.025 * rounds)], means[min(rounds - 1, int(0.975 * rounds))])


def summarize(rows: Sequence[Mapping[str, float]], *, rounds: int = 1000) -> dict[str, Any]:
    """Mean and bootstrap interval of every metric over `rows` (one per query)."""
    out: dict[str, Any] = {"queries": len(rows)}
    if not rows:
        return out
    for name in rows[0]:
        values = [row[name] for row in rows]
        low, high = bootstrap_interval(values, rounds=rounds)
        out[name] = {"mean": sum(values) / len(values), "low": low, "high": high}
    return out


def evaluate(
    retrievers: Mapping[str, Retriever], queries: Sequence[EvalQuery], *, depth: int = 100
) -> dict[str, list[dict[str, float]]]:
    """Per retriever, one metrics row per query (in query order); `hop` is kept in each row."""
    out: dict[str, list[dict[str, float]]] = {name: [] for name in retrievers}
    for query in queries:
        for name, retrieve in retrievers.items():
            row = query_metrics(list(retrieve(query.text))[:depth], query.relevant, depth)
            out[name].append(row)
    return out


def report(
    per_query: Mapping[str, Sequence[Mapping[str, float]]], queries: Sequence[EvalQuery]
) -> dict[str, dict[str, Any]]:
    """{retriever: {"first": summary, "later": summary, "all": summary}}."""
    first = [i for i, q in enumerate(queries) if q.hop == 0]
    later = [i for i, q in enumerate(queries) if q.hop > 0]
    result: dict[str, dict[str, Any]] = {}
    for name, rows in per_query.items():
        result[name] = {
            "first": summarize([rows[i] for i in first]),
            "later": summarize([rows[i] for i in later]),
            "all": summarize(rows),
        }
    return result


class IndexViews:
    """Many `IndexConfig`s over one corpus without rebuilding what they share: BM25 is built once per analyzer
    (tokenizer, stemmer, stopwords, k1, b) and embeddings once per window setting (`vectors` may be given, e.g.
    from a cache), then each config is a cheap `SearchIndex` over them."""

    def __init__(self, chunks: Sequence[Chunk]) -> None:
        self.chunks = list(chunks)
        self._texts = [index_text(c) for c in self.chunks]
        self._bm25: dict[tuple[Any, ...], Any] = {}
        self._vectors: dict[bool, tuple[Any, Any]] = {}

    def set_vectors(self, windows: bool, vectors: Any, starts: Any = None) -> None:
        self._vectors[windows] = (vectors, starts)

    def _lexical(self, config: IndexConfig, tokenizer: Any, stemmer: Any) -> Any:
        key = (tokenizer, stemmer, config.stopwords, config.bm25_k1, config.bm25_b)
        if key not in self._bm25:
            self._bm25[key] = bm25_index(self._texts, config, tokenizer, stemmer)
        return self._bm25[key]

    def index(self, config: IndexConfig) -> SearchIndex:
        first = self._lexical(config, config.tokenizer, config.stemmer)
        second = None
        if config.second_tokenizer is not None:
            second = self._lexical(config, config.second_tokenizer, config.second_stemmer)
        if not config.dense:
            return SearchIndex(self.chunks, config, first, None, {}, None, second)
        windows = config.dense_windows
        if windows not in self._vectors:
            if windows:
                self._vectors[windows] = embed.embed_windowed(self._texts)
            else:
                self._vectors[windows] = (embed.embed_texts(self._texts), None)
        vectors, starts = self._vectors[windows]
        return SearchIndex(self.chunks, config, first, vectors, {}, starts if windows else None, second)


def ranked_ids(index: SearchIndex, *, dense_only: bool = False, depth: int = 100) -> Retriever:
    """A retriever over `index`: its search, or (`dense_only`) the dense scores alone."""
    import numpy as np

    if not dense_only:
        return lambda query: [h.chunk.chunk_id for h in index.search(query, k=depth)]

    def dense(query: str) -> list[str]:
        scores = index._dense_scores(query)
        if scores is None:
            raise ValueError("dense_only needs an index with embeddings")
        return [index.chunks[i].chunk_id for i in np.argsort(-scores, kind="stable")[:depth].tolist()]

    return dense
