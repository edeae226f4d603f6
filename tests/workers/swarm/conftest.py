"""A small Markdown corpus with headed API sections, its BM25 index and wide tasks over it."""

from __future__ import annotations

from typing import Any

import pytest

from workers.search.corpus import Document, build_corpus
from workers.search.index import IndexConfig, SearchIndex
from workers.search.types import Chunk

MODULES: dict[str, list[str]] = {
    "lib:alpha": [
        "## alpha.open(path, mode='r')\nOpen the file at path and return a stream.",
        "## class alpha.Reader(stream, size=64)\nRead records from a stream, size bytes at a time.",
    ],
    "lib:beta": [
        "## beta.merge(left, right, *, key=None)\nMerge two sorted lists into one.\n\nNew in version 3.2.",
        "## beta.Tree.depth (property)\nThe number of levels below the root.",
    ],
    "lib:gamma": [
        "## gamma.encode(data, errors='strict')\nEncode bytes as text.",
        "## gamma.decode(text)\nDecode text back into bytes.",
    ],
    "lib:delta": [
        "## delta.spawn(command, env=None)\nStart a child process running command.",
        "## class delta.Pool(workers)\nA pool of worker processes.",
    ],
}


def documents() -> list[Document]:
    return [
        Document(doc_id=doc, text=f"Module {doc.split(':')[1]}.\n\n" + "\n\n".join(sections), title=doc.split(":")[1])
        for doc, sections in MODULES.items()
    ]


@pytest.fixture(scope="session")
def swarm_chunks() -> list[Chunk]:
    chunks, _ = build_corpus(documents())
    return chunks


@pytest.fixture(scope="session")
def swarm_index(swarm_chunks: list[Chunk]) -> SearchIndex:
    return SearchIndex.build(swarm_chunks, IndexConfig(dense=False))


@pytest.fixture
def wide_task(swarm_chunks: list[Chunk]) -> dict[str, Any]:
    from workers.search.wide import WideParams, synthesize_wide

    result = synthesize_wide(swarm_chunks, WideParams(num_tasks=1, min_rows=4, max_rows=4, seed=3))
    assert result.tasks, result.report
    return result.tasks[0]
