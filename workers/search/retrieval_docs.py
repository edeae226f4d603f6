"""Retrieval evaluation against document-level gold (BEIR's qrels, `workers.search.beir`; any task row with a
`relevance` object, or with `gold_doc_ids` alone): the ranked chunks are folded to documents, then scored as BEIR
scores them.

- Folding: a document's rank is that of its first chunk in the ranking; a chunk several documents share
  (`metadata.also_in`) stands for each of them at its rank.
- nDCG@10 (graded, as trec_eval and pytrec_eval compute it): DCG = sum over the first 10 documents of
  gain / log2(rank + 1), the gain being the document's judged score (0 when unjudged); divided by the DCG of the
  judged scores sorted best first. Without grades (`gold_doc_ids` only) every gold document has gain 1.
- recall@k: the share of the query's relevant documents (score >= 1) among the first k documents.
- MRR: 1 / the rank of the first relevant document (0 past `depth`).

Every mean comes with the percentile bootstrap 95% interval over queries (`retrieval_eval.summarize`), per query
set (the BEIR split, `query_set`) and over all queries. Chunk-level gold is scored by `workers.search.retrieval_eval`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workers.search.beir import RELEVANT
from workers.search.retrieval_eval import Retriever, summarize
from workers.search.types import Chunk, chunk_doc_ids

DOC_KS = (1, 5, 10, 100)
ALL_QUERIES = "all"


@dataclass(frozen=True)
class DocQuery:
    qid: str
    text: str
    relevance: dict[str, int]  # judged documents and their grades (0: judged not relevant)
    query_set: str


def has_document_gold(task: Mapping[str, Any]) -> bool:
    """True for a task row whose gold is documents (a `relevance` object, or `gold_doc_ids` without chunk ids)."""
    return isinstance(task.get("relevance"), dict) or (
        bool(task.get("gold_doc_ids")) and not task.get("gold_chunk_ids")
    )


def doc_queries(tasks: Sequence[Mapping[str, Any]]) -> list[DocQuery]:
    """One query per task row with document gold; its text is the row's `prompt` (a string)."""
    out: list[DocQuery] = []
    for task in tasks:
        if not has_document_gold(task) or not isinstance(task.get("prompt"), str):
            continue
        graded = task.get("relevance")
        if isinstance(graded, dict):
            relevance = {str(doc): int(score) for doc, score in graded.items()}
        else:
            relevance = {str(doc): RELEVANT for doc in task.get("gold_doc_ids") or []}
        out.append(DocQuery(str(task["id"]), task["prompt"], relevance, str(task.get("query_set") or "tasks")))
    return out


def fold_to_documents(ranked_chunk_ids: Sequence[str], chunks_by_id: Mapping[str, Chunk]) -> list[str]:
    """The ranking's documents in the order their first chunk comes (module docstring)."""
    out: dict[str, None] = {}
    for chunk_id in ranked_chunk_ids:
        chunk = chunks_by_id.get(chunk_id)
        for doc in chunk_doc_ids(chunk) if chunk is not None else [chunk_id.split("#", 1)[0]]:
            out.setdefault(doc, None)
    return list(out)


def doc_metrics(ranked_docs: Sequence[str], relevance: Mapping[str, int], depth: int = 100) -> dict[str, float]:
    """recall@k, MRR and graded nDCG@10 of one query (module docstring)."""
    ranked = list(ranked_docs[:depth])
    relevant = {doc for doc, score in relevance.items() if score >= RELEVANT}
    row = {f"recall@{k}": (len(relevant.intersection(ranked[:k])) / len(relevant)) if relevant else 0.0 for k in DOC_KS}
    first = next((i for i, doc in enumerate(ranked, start=1) if doc in relevant), None)
    row["mrr"] = 1.0 / first if first else 0.0
    dcg = sum(max(relevance.get(doc, 0), 0) / math.log2(rank + 1) for rank, doc in enumerate(ranked[:10], start=1))
    ideal_gains = sorted((max(score, 0) for score in relevance.values()), reverse=True)[:10]
    ideal = sum(gain / math.log2(rank + 1) for rank, gain in enumerate(ideal_gains, start=1))
    row["ndcg@10"] = dcg / ideal if ideal > 0 else 0.0
    return row


def evaluate_documents(
    retrievers: Mapping[str, Retriever],
    queries: Sequence[DocQuery],
    chunks: Sequence[Chunk],
    *,
    depth: int = 100,
    chunk_depth: int = 300,
) -> dict[str, list[dict[str, float]]]:
    """Per retriever, one metrics row per query (in query order). Each retriever's ranking is cut at
    `chunk_depth` chunks before folding (several chunks of one document fold into one)."""
    by_id = {chunk.chunk_id: chunk for chunk in chunks}
    out: dict[str, list[dict[str, float]]] = {name: [] for name in retrievers}
    for query in queries:
        for name, retrieve in retrievers.items():
            docs = fold_to_documents(list(retrieve(query.text))[:chunk_depth], by_id)
            out[name].append(doc_metrics(docs, query.relevance, depth))
    return out


def report_documents(
    per_query: Mapping[str, Sequence[Mapping[str, float]]], queries: Sequence[DocQuery]
) -> dict[str, dict[str, Any]]:
    """{retriever: {query set: summary, ..., "all": summary}}."""
    sets = list(dict.fromkeys(q.query_set for q in queries))
    result: dict[str, dict[str, Any]] = {}
    for name, rows in per_query.items():
        parts = {s: summarize([rows[i] for i, q in enumerate(queries) if q.query_set == s]) for s in sets}
        parts[ALL_QUERIES] = summarize(rows)
        result[name] = parts
    return result
