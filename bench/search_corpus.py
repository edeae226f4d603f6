"""search_corpus on a 100k-chunk corpus: index build time, calls/s, and the harness's overhead over raw retrieval.

    python bench/search_corpus.py [--chunks 100000] [--queries 200] [--rebuild]

The corpus is built on the fly from text every Python ships (pydoc topics and the docstrings of stdlib modules),
split into windows of whole sentences (25-60 words), and repeated with perturbations (words dropped and swapped,
each copy its own document) until it holds `--chunks` chunks. Nothing is downloaded.

Rows, measured on the same queries in the same process (2 cores, --threads torch threads), taking turns query
by query:
  SearchIndex.search    workers.search.index: BM25 + dense scores of every chunk, ~20 excluded ids masked,
                        top 50 of each, RRF, convex rerank of the top 50, k = 10
  raw bm25s + dense     the peer: bm25s.tokenize + BM25.retrieve(k=10), then MiniLM encode + one float32
                        matrix-vector product + top 10; no exclusion, fusion or rerank
  (harness rows)        `harness_rows` below: the environment's search_corpus tool call plugs in there

The overhead ratio is seconds per call of a row / seconds per call of the peer (median of --rounds passes). The
query-embedding cache is cleared before every call, so no row reuses an embedding. The built index is kept in
--index-dir and reused by the next run on the same corpus (its build times come from its manifest). Results:
bench/results/search_corpus.{txt,json} (search_corpus-quick.* when --chunks is not 100,000). Nothing here
asserts on time.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import random
import re
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._noise import add_load_guard, load_guard  # noqa: E402

warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402

from workers.search import embed  # noqa: E402
from workers.search.index import IndexConfig, SearchIndex  # noqa: E402
from workers.search.types import Chunk, dump_chunks_jsonl  # noqa: E402

MODULES = [
    "builtins", "os", "os.path", "re", "json", "collections", "itertools", "functools", "pathlib", "typing",
    "inspect", "datetime", "decimal", "fractions", "statistics", "random", "string", "textwrap", "difflib",
    "argparse", "logging", "subprocess", "threading", "asyncio", "concurrent.futures", "socket", "ssl",
    "http.client", "urllib.request", "email.message", "csv", "sqlite3", "zipfile", "tarfile", "shutil",
    "tempfile", "unittest", "doctest", "pdb", "dataclasses", "enum", "abc", "contextlib", "heapq", "bisect",
    "array", "struct", "codecs", "io", "pickle", "copy", "pprint", "operator", "math", "cmath", "hashlib",
    "hmac", "secrets", "base64", "binascii", "uuid", "time", "calendar", "locale", "gettext", "xml.etree.ElementTree",
    "html.parser", "tkinter", "turtle", "ast", "dis", "tokenize", "importlib", "pkgutil", "sysconfig", "platform",
]  # fmt: skip
SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\"'`])")
WORD = re.compile(r"[A-Za-z][A-Za-z_]{2,}")


def source_documents() -> list[tuple[str, str, str]]:
    """(doc_id, title, text) of pydoc topics and docstrings, in a fixed order."""
    import importlib
    import pydoc_data.topics

    docs = [(f"topic:{name}", name, text) for name, text in sorted(pydoc_data.topics.topics.items())]
    for module_name in MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # tkinter and friends are optional
            continue
        objects = [(module_name, module)] + [
            (f"{module_name}.{name}", obj) for name, obj in sorted(vars(module).items()) if not name.startswith("_")
        ]
        for qualname, obj in objects:
            if qualname != module_name and (inspect.ismodule(obj) or getattr(obj, "__module__", None) != module_name):
                continue
            doc = inspect.getdoc(obj) if (callable(obj) or inspect.ismodule(obj)) else None
            if doc and len(doc) > 80:
                docs.append((f"py:{qualname}", qualname, doc))
            if inspect.isclass(obj):
                for name, member in sorted(vars(obj).items()):
                    member_doc = inspect.getdoc(member) if callable(member) and not name.startswith("_") else None
                    if member_doc and len(member_doc) > 80:
                        docs.append((f"py:{qualname}.{name}", f"{qualname}.{name}", member_doc))
    unique: dict[str, tuple[str, str, str]] = {}
    for doc in docs:
        unique.setdefault(doc[0], doc)
    return list(unique.values())


def windows(text: str, low: int = 25, high: int = 60) -> list[str]:
    """Whole sentences grouped into windows of `low` to about `high` words."""
    sentences = [" ".join(s.split()) for s in SENTENCE.split(text) if s.strip()]
    out: list[str] = []
    current: list[str] = []
    count = 0
    for sentence in sentences:
        words = len(sentence.split())
        if current and count + words > high:
            out.append(" ".join(current))
            current, count = [], 0
        current.append(sentence)
        count += words
        if count >= low:
            out.append(" ".join(current))
            current, count = [], 0
    if current and (count >= 8 or not out):
        out.append(" ".join(current))
    return [" ".join(w.split()[: high + 20]) for w in out]


def perturb(text: str, rng: random.Random) -> str:
    words = text.split()
    kept = [w for w in words if rng.random() > 0.1] or words
    for _ in range(2):
        if len(kept) > 3:
            i = rng.randrange(len(kept) - 1)
            kept[i], kept[i + 1] = kept[i + 1], kept[i]
    return " ".join(kept)


def build_corpus(total: int, seed: int = 0) -> tuple[list[Chunk], int]:
    """`total` chunks: the base windows, then perturbed copies (each copy a new document) until full."""
    base: list[Chunk] = []
    for doc_id, title, text in source_documents():
        for position, window in enumerate(windows(text)):
            base.append(
                Chunk(chunk_id=f"{doc_id}#{position}", doc_id=doc_id, position=position, text=window, title=title)
            )
    rng = random.Random(seed)
    chunks = list(base[:total])
    copy = 0
    while len(chunks) < total:
        copy += 1
        for chunk in base:
            if len(chunks) >= total:
                break
            doc_id = f"{chunk.doc_id}~{copy}"
            chunks.append(
                Chunk(
                    chunk_id=f"{doc_id}#{chunk.position}",
                    doc_id=doc_id,
                    position=chunk.position,
                    text=perturb(chunk.text, rng),
                    title=chunk.title,
                    metadata={"copy_of": chunk.chunk_id},
                )
            )
    return chunks, len(base)


def make_queries(chunks: list[Chunk], base_count: int, count: int, seed: int = 1) -> list[tuple[str, str]]:
    """(query, source doc family) pairs: 3-6 consecutive words of a base chunk, unique."""
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[tuple[str, str]] = []
    while len(out) < count:
        chunk = chunks[rng.randrange(min(base_count, len(chunks)))]
        words = WORD.findall(chunk.text)
        if len(words) < 8:
            continue
        size = rng.randint(3, 6)
        start = rng.randrange(len(words) - size)
        query = " ".join(words[start : start + size]).lower()
        if query not in seen:
            seen.add(query)
            out.append((query, chunk.doc_id))
    return out


def load_or_build(chunks: list[Chunk], index_dir: Path, rebuild: bool) -> tuple[SearchIndex, bool]:
    corpus_hash = hashlib.sha256(dump_chunks_jsonl(chunks)).hexdigest()
    manifest = index_dir / "manifest.json"
    if not rebuild and manifest.is_file() and json.loads(manifest.read_text())["corpus_hash"] == corpus_hash:
        print(f"reusing the index in {index_dir} (--rebuild to build again)", flush=True)
        return SearchIndex.load(index_dir), False
    print(f"building the index of {len(chunks):,} chunks (BM25, then MiniLM embeddings)...", flush=True)
    last = [time.monotonic()]

    def progress(done: int, total: int) -> None:
        if time.monotonic() - last[0] > 30 or done == total:
            last[0] = time.monotonic()
            print(f"  embedded {done:,}/{total:,}", flush=True)

    index = SearchIndex.build(chunks, IndexConfig(), progress=progress)
    index.save(index_dir)
    return SearchIndex.load(index_dir), True


def peer_call(index: SearchIndex) -> Callable[[str], object]:
    """Raw bm25s top 10 plus raw dense top 10, the way a user of the two libraries would write them."""
    import bm25s
    import Stemmer

    stemmer = Stemmer.Stemmer("english")
    retriever = index._bm25
    matrix = np.asarray(index._embeddings)
    starts = index._window_starts
    model = embed.embedder()

    def call(query: str) -> object:
        tokens = bm25s.tokenize(query, stopwords="en", stemmer=stemmer, return_ids=False, show_progress=False)
        lexical = retriever.retrieve(tokens, k=10, show_progress=False)
        vector = model.encode([query], normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)[0]
        scores = matrix @ vector
        if starts is not None:  # the index holds a vector per window: a chunk scores as its best one
            scores = np.maximum.reduceat(scores, starts)
        top = np.argpartition(-scores, 10)[:10]
        return lexical, top[np.argsort(-scores[top])]

    return call


def harness_rows(index: SearchIndex, excludes: dict[str, list[str]]) -> list[tuple[str, Callable[[str], object]]]:
    """Extra rows measured beside the two above, each a `call(query)`: the search environment's `search_corpus`
    tool call, i.e. the harness as a rollout runs it (exclusion of seen chunks, passage labels, token budget
    accounting and truncation, the trajectory's result record), with the same ~20 seen chunks excluded."""
    from workers.envs.registry import make_env
    from workers.envs.toolcalls import ToolCall

    env = make_env("search", index_uri="memory://bench", top_k=10)
    env.bind_index(index)  # type: ignore[attr-defined]
    task = env.validate_task_row({"id": "bench", "prompt": "benchmark", "gold_chunk_ids": ["x#0"]})

    def tool_call(query: str) -> object:
        env.reset(task)
        env._seen_set.update(excludes[query])  # type: ignore[attr-defined]
        return env.run_tool(ToolCall("search_corpus", {"query": query}))

    return [("search env: search_corpus tool call", tool_call)]


def time_interleaved(rows: list[tuple[str, Callable[[str], object]]], queries: list[str]) -> dict[str, float]:
    """Seconds per call of each row over `queries`. The rows take turns on every query (in a rotating order),
    so a burst of load from another process on this shared machine hits every row alike."""
    spent = {name: 0.0 for name, _ in rows}
    for i, query in enumerate(queries):
        for name, call in rows[i % len(rows) :] + rows[: i % len(rows)]:
            embed.embed_query.cache_clear()
            started = time.perf_counter()
            call(query)
            spent[name] += time.perf_counter() - started
    return {name: total / len(queries) for name, total in spent.items()}


def hit_rate(results: list[list[str]], families: list[str]) -> float:
    """Share of queries whose source document (or a perturbed copy of it) is in the top 10."""
    pairs = zip(results, families, strict=True)
    return sum(any(doc.split("~")[0] == family for doc in docs) for docs, family in pairs) / len(families)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3, help="timed passes over the queries; the median is kept")
    parser.add_argument("--index-dir", type=Path, default=None, help="default /tmp/crucible-bench-index-<chunks>")
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument(
        "--threads",
        type=int,
        default=2,
        help="torch threads (query encoding). On a shared machine 1 can beat 2: two OpenMP threads on two busy "
        "cores wait for each other",
    )
    add_load_guard(parser)
    args = parser.parse_args()
    load_guard(args)

    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 2:
        os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:2]))
    import torch

    torch.set_num_threads(args.threads)

    started = time.perf_counter()
    chunks, base_count = build_corpus(args.chunks)
    corpus_seconds = time.perf_counter() - started
    words = [len(c.text.split()) for c in chunks]
    print(
        f"corpus: {len(chunks):,} chunks ({base_count:,} distinct windows), {len({c.doc_id for c in chunks}):,} "
        f"documents, {statistics.mean(words):.0f} words per chunk on average; made in {corpus_seconds:.1f} s",
        flush=True,
    )
    index_dir = args.index_dir or Path(f"/tmp/crucible-bench-index-{args.chunks}")
    load_started = time.perf_counter()
    index, built = load_or_build(chunks, index_dir, args.rebuild)
    if not built:
        embed.embedder()
    load_seconds = time.perf_counter() - load_started
    build = index.manifest["build_seconds"]
    size_mb = sum(p.stat().st_size for p in index_dir.rglob("*") if p.is_file()) / 1e6

    pairs = make_queries(chunks, base_count, args.queries)
    queries = [q for q, _ in pairs]
    families = [f for _, f in pairs]
    peer = peer_call(index)
    # ~20 excluded ids per call, the ones a harness would have shown already: the query's own top 20 by BM25.
    excludes: dict[str, list[str]] = {}
    for query in queries:
        lexical = index._bm25_scores(query)
        top = np.argsort(-lexical)[:20]
        excludes[query] = [index.chunks[i].chunk_id for i in top.tolist() if lexical[i] > 0]
    rows: list[tuple[str, Callable[[str], object]]] = [
        ("SearchIndex.search(k=10, exclude=~20)", lambda q: index.search(q, k=10, exclude=excludes[q])),
        ("raw bm25s + dense top-10 (peer)", peer),
        *harness_rows(index, excludes),
    ]
    for _, call in rows:  # warm-up: first calls pay for lazy imports and allocator growth
        for query in queries[:10]:
            call(query)
    per_call: dict[str, list[float]] = {name: [] for name, _ in rows}
    for round_no in range(args.rounds):
        for name, seconds in time_interleaved(rows, queries).items():
            per_call[name].append(seconds)
            print(f"  round {round_no + 1}: {name:<40} {1 / seconds:7.1f} calls/s", flush=True)
    median = {name: statistics.median(values) for name, values in per_call.items()}
    peer_name = rows[1][0]

    # Quality beside speed (no exclusion here): does the fused index find the query's source at least as often?
    embed.embed_query.cache_clear()
    ours_docs = [[h.chunk.doc_id for h in index.search(q, k=10)] for q in queries]
    bm25_docs = [[index.chunks[i].doc_id for i in np.argsort(-index._bm25_scores(q))[:10].tolist()] for q in queries]

    # Chunk scores (a chunk embedded in windows scores as its best window), not rows of the embedding matrix.
    def dense_top(query: str) -> list[str]:
        scores = index._dense_scores(query)
        assert scores is not None, "the index was built without embeddings"
        return [index.chunks[i].doc_id for i in np.argsort(-scores)[:10].tolist()]

    dense_docs = [dense_top(q) for q in queries]
    quality = {
        "hybrid": hit_rate(ours_docs, families),
        "bm25": hit_rate(bm25_docs, families),
        "dense": hit_rate(dense_docs, families),
    }
    excluded_returned = sum(
        bool({h.chunk.chunk_id for h in index.search(q, k=10, exclude=excludes[q])} & set(excludes[q]))
        for q in queries[:50]
    )

    table = ["| measure | value |", "| --- | --- |"]
    table.append(f"| corpus | {len(chunks):,} chunks, {statistics.mean(words):.0f} words each on average |")
    when = "this run" if built else "manifest of the reused index"
    table.append(f"| index build, BM25 (tokenise + index) | {build['bm25']:.1f} s ({when}) |")
    table.append(
        f"| index build, MiniLM embeddings | {build['dense']:.1f} s ({len(chunks) / build['dense']:.0f} chunks/s) |"
    )
    table.append(f"| index on disk | {size_mb:,.0f} MB |")
    for name, _ in rows:
        ratio = median[name] / median[peer_name]
        note = "" if name == peer_name else f", {ratio:.2f}x the peer's time per call"
        table.append(f"| {name} | {1 / median[name]:,.1f} calls/s ({median[name] * 1000:.1f} ms{note}) |")
    table.append(
        f"| source document in top 10 (no exclusion) | hybrid {quality['hybrid']:.0%}, BM25 {quality['bm25']:.0%}, "
        f"dense {quality['dense']:.0%} |"
    )
    header = (
        f"bench/search_corpus.py --chunks {args.chunks}, {time.strftime('%Y-%m-%d %H:%M')}, "
        f"{len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()} cores, "
        f"torch threads {torch.get_num_threads()}, {len(queries)} queries x {args.rounds} rounds (median), "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    text = header + "\n\n" + "\n".join(table) + "\n"
    stem = "search_corpus" if args.chunks == 100_000 else "search_corpus-quick"
    stem += "" if args.threads == 2 else f"-{args.threads}thread"
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.txt").write_text(text)
    result: dict[str, Any] = {
        "chunks": len(chunks),
        "distinct_windows": base_count,
        "mean_words_per_chunk": statistics.mean(words),
        "build_seconds": build,
        "built_this_run": built,
        "load_or_build_seconds": load_seconds,
        "index_mb": size_mb,
        "queries": len(queries),
        "seconds_per_call": {name: values for name, values in per_call.items()},
        "calls_per_s": {name: 1 / median[name] for name in median},
        "overhead_ratio": {name: median[name] / median[peer_name] for name in median if name != peer_name},
        "hit_at_10": quality,
        "excluded_ids_returned": excluded_returned,
        "config": index.config.model_dump(mode="json"),
        "torch_threads": args.threads,
        "load_average": os.getloadavg(),
    }
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    print("\n" + text)


if __name__ == "__main__":
    main()
