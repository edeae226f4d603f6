"""The corpus record every part of search shares: one chunk of one document.

A corpus dataset version is stored as canonical JSONL, one chunk per line:

    {"chunk_id": "py:os.path#0", "doc_id": "py:os.path", "position": 0, "title": "os.path",
     "text": "...", "metadata": {"source": "pydoc"}}

`chunk_id` is `<doc_id>#<position>`: stable (the same documents and chunker settings give the same ids), short
enough for a model to copy into `prune_chunks` and its final answer, and it names its document.

A chunk whose text several documents hold word for word is stored once, under the first document, and lists the
ids its copies would have had in `metadata["also_in"]` (`["guide/b#3", "guide/c#5"]`): it belongs to each of those
documents at that position too (`workers.search.corpus.build_corpus`, docs/corpus-chunking.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Chunk:
    chunk_id: str
    doc_id: str
    position: int
    text: str
    title: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "chunk_id": self.chunk_id,
            "doc_id": self.doc_id,
            "position": self.position,
            "title": self.title,
            "text": self.text,
            "metadata": self.metadata,
        }

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> Chunk:
        return cls(
            chunk_id=str(row["chunk_id"]),
            doc_id=str(row["doc_id"]),
            position=int(row["position"]),
            text=str(row["text"]),
            title=str(row.get("title") or ""),
            metadata=dict(row.get("metadata") or {}),
        )


ALSO_IN = "also_in"
BOILERPLATE = "boilerplate"
"""Metadata flag of a chunk that holds a boilerplate paragraph set apart from its document (`build_corpus`)."""


def chunk_id_for(doc_id: str, position: int) -> str:
    return f"{doc_id}#{position}"


def doc_of(chunk_id: str) -> str:
    """The document a chunk id names (doc ids never hold '#')."""
    return chunk_id.split("#", 1)[0]


def also_in(chunk: Chunk) -> list[str]:
    """The chunk ids this chunk also stands for in other documents (module docstring); [] for most chunks."""
    value = chunk.metadata.get(ALSO_IN)
    return [str(item) for item in value] if isinstance(value, list) else []


def chunk_doc_ids(chunk: Chunk) -> list[str]:
    """Every document that holds this chunk's text: its own first, then those it is shared with."""
    return list(dict.fromkeys([chunk.doc_id, *(doc_of(alias) for alias in also_in(chunk))]))


def dump_chunks_jsonl(chunks: Iterable[Chunk]) -> bytes:
    """Canonical corpus bytes: one chunk per line, keys in a fixed order, UTF-8."""
    return b"".join(json.dumps(c.to_json(), ensure_ascii=False).encode() + b"\n" for c in chunks)


def iter_chunks_jsonl(data: bytes) -> Iterator[Chunk]:
    """Chunks of canonical corpus bytes (written by `dump_chunks_jsonl`, already validated at import)."""
    for line in data.splitlines():
        if line.strip():
            yield Chunk.from_json(json.loads(line))
