"""Build a corpus version's search index on Ray: `python -m workers.jobs.build_index`.

Reads the canonical chunk JSONL at `corpus_uri` (checking it is still the version the control plane registered),
builds BM25 and the MiniLM embeddings with progress reported per embedding batch, saves the index directory to
`output_uri` and reports a summary (chunks, documents, seconds per phase) and the index as an artifact. The
control plane's success hook (apps.search.services.indexes.index_finalize) then marks the index ready.

The build runs in the job's own process rather than in a Ray task: it is one pass that torch and numpy already
spread over every core, and a task would only add a copy of the corpus.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any

from workers.jobs.common import load_spec, reporter_for
from workers.reporting import configure_logging
from workers.search.index import SearchIndex
from workers.search.index_store import save_index
from workers.search.types import iter_chunks_jsonl
from workers.specs import BuildIndexSpec
from workers.storage import read_bytes

log = logging.getLogger("crucible.build_index")


class BuildIndexError(RuntimeError):
    """The corpus cannot be indexed; the message says why and what to do."""


def build(
    spec: BuildIndexSpec,
    *,
    progress: Callable[[int, int], object] | None = None,
    log_line: Callable[[str], object] | None = None,
) -> dict[str, Any]:
    """Read, index and save the corpus; returns the summary. `progress(done, total)` counts chunks embedded.
    Raises BuildIndexError for an empty or changed corpus or unreadable lines."""
    say = log_line or log.info
    started = time.perf_counter()
    say(f"reading {spec.corpus_uri}")
    data = read_bytes(spec.corpus_uri, spec.storage_options)
    digest = hashlib.sha256(data).hexdigest()
    if digest != spec.corpus_hash:
        raise BuildIndexError(
            f"the corpus at {spec.corpus_uri} has sha256 {digest[:12]}…, not the registered {spec.corpus_hash[:12]}…: "
            "the file changed after its version was created; import the corpus again as a new version"
        )
    try:
        chunks = list(iter_chunks_jsonl(data))
    except (ValueError, KeyError, TypeError) as exc:
        raise BuildIndexError(f"the corpus at {spec.corpus_uri} is not canonical chunk JSONL: {exc}") from None
    if not chunks:
        raise BuildIndexError(
            f"the corpus at {spec.corpus_uri} has no chunks: import documents into the corpus before building an index"
        )
    read_seconds = time.perf_counter() - started
    dense = "BM25 + MiniLM embeddings" if spec.config.dense else "BM25 only"
    say(f"indexing {len(chunks):,} chunks ({dense})")
    try:
        index = SearchIndex.build(chunks, spec.config, progress=progress)
    except ValueError as exc:  # repeated chunk ids
        raise BuildIndexError(str(exc)) from None
    index.manifest["corpus_hash"] = spec.corpus_hash

    started = time.perf_counter()
    say(f"saving to {spec.output_uri}")
    save_index(index, spec.output_uri, spec.storage_options)
    save_seconds = time.perf_counter() - started
    seconds = {
        "read": round(read_seconds, 3),
        **index.manifest["build_seconds"],
        "save": round(save_seconds, 3),
    }
    return {
        "chunks": len(index),
        "documents": index.document_count,
        "vocabulary": index.manifest["vocabulary"],
        "dense": spec.config.dense,
        "index_uri": spec.output_uri,
        "config_hash": spec.config.content_hash(),
        "seconds": {**seconds, "total": round(sum(seconds.values()), 3)},
    }


def run(spec: BuildIndexSpec) -> dict[str, Any]:
    with reporter_for(spec) as reporter:
        try:
            summary = build(spec, progress=reporter.progress, log_line=reporter.log)
        except BuildIndexError as exc:
            reporter.log(f"index build failed: {exc}")
            raise SystemExit(f"index build failed: {exc}") from None
        reporter.artifact("index", spec.output_uri, meta={"chunks": summary["chunks"], "dense": summary["dense"]})
        reporter.summary(summary)
        reporter.log(
            f"done: {summary['chunks']:,} chunks in {summary['documents']:,} documents, "
            f"{summary['seconds']['total']:.1f} s ({summary['seconds']})"
        )
    return summary


def main() -> None:
    configure_logging()
    run(load_spec(BuildIndexSpec))


if __name__ == "__main__":
    main()
