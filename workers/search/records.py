"""What a search episode records for its reward and metrics (`SearchEnv.trajectory_fields`): the output, seen and
gold ids, as chunk ids for a task whose gold is chunks, or as document ids for a task whose gold is documents
(`gold_doc_ids`, e.g. a BEIR import; `gold_level: "document"`). The record's keys are the same either way
(`output_doc_ids`, `gold_doc_ids`, `seen_doc_ids`, ...: Context-1's "documents" are chunks), so the reward terms and
`workers.search.metrics` score both with the same formulas.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from workers.search.index import SearchIndex
from workers.search.tools import document_gold
from workers.search.types import chunk_doc_ids, doc_of


def canonical_ids(values: Iterable[Any] | None, index: SearchIndex | None) -> list[str]:
    """Chunk ids as the stored chunks name them: a copy's id (a chunk merged into one several documents share)
    becomes the stored chunk's, so an output naming either matches a gold list naming either. No index loaded
    yet: the ids stand as written."""
    out = [str(v) for v in values or []]
    return list(dict.fromkeys(index.canonical_id(v) for v in out)) if index is not None else out


def documents_of(chunk_ids: Iterable[Any], index: SearchIndex | None) -> list[str]:
    """The documents of `chunk_ids`, in the order first named: a chunk stands for its document and for the
    documents it is shared with."""
    out: dict[str, None] = {}
    for chunk_id in chunk_ids:
        chunk = index.chunk(str(chunk_id)) if index is not None else None
        for doc in chunk_doc_ids(chunk) if chunk is not None else [doc_of(str(chunk_id))]:
            out.setdefault(doc, None)
    return list(out)


def episode_record(
    metadata: Mapping[str, Any],
    index: SearchIndex | None,
    *,
    output: Sequence[tuple[str, str]],
    seen: Sequence[str],
    pruned: Sequence[str],
    usage: Sequence[Any],
    token_budget: int,
) -> dict[str, Any]:
    """The trajectory fields of one episode (module docstring); `output` is (chunk id, justification) per item."""
    common = {
        "output_items": [{"id": ident, "justification": why} for ident, why in output],
        "pruned_chunk_ids": list(pruned),
        "token_usage": list(usage),
        "token_budget": token_budget,
    }
    if document_gold(metadata):
        return {
            "gold_level": "document",
            "output_doc_ids": documents_of((ident for ident, _ in output), index),
            "gold_doc_ids": [str(d) for d in metadata.get("gold_doc_ids") or []],
            "answer_doc_ids": [],
            "seen_doc_ids": documents_of(seen, index),
            **common,
        }
    facts = metadata.get("gold_facts")
    return {
        "output_doc_ids": canonical_ids((ident for ident, _ in output), index),
        "gold_doc_ids": canonical_ids(metadata.get("gold_chunk_ids"), index),
        "answer_doc_ids": canonical_ids(metadata.get("answer_chunk_ids"), index),
        **({"gold_facts": [canonical_ids(f, index) for f in facts]} if facts else {}),
        "seen_doc_ids": list(seen),
        **common,
    }
