"""Retrieval harness: every retriever configuration on six corpora of four formats, tuning vs evaluation.

    .venv/bin/python bench/retrieval_eval.py                   # docs/benchmarks.md's table (sdists downloaded once)
    .venv/bin/python bench/retrieval_eval.py --tasks 40        # fewer tasks per corpus

Corpora, built offline with the project's own importer (`workers.search.corpus_files.document_from_file`) from what the
package registries carry (source distributions are fetched once with `pip download` into --cache):

  tuning      md-stdlib      Markdown: the built-in demo corpus (Python's own docs, `workers.search.stdlib_corpus`)
              rst-pytest     reStructuredText: pytest 8.3.3's sdist, doc/en
              py-tune        Python source (docstrings and comments): djangorestframework, click, jinja2 as installed
  evaluation  rst-celery     reStructuredText: celery 5.4.0's sdist, docs
              py-eval        Python source: kombu, redis as installed
              html-lxml      HTML: lxml 5.3.0's sdist, doc/html (its Sphinx-built manual and API pages; the
                             highlighted-source pages `_modules/` and the general index left out)

Tasks: the extraction-verified multi-hop generator (template, up to 2 hops) on each corpus; queries per hop
(`workers.search.retrieval_eval`). Every default of `IndexConfig` is chosen on the tuning corpora only (the fitted
fusion weights and alpha included: `--fit`), then the evaluation corpora are reported with those settings.
Rows: BM25 with each analyzer (words/code, stemmed or not), plain `bm25s` over the chunk texts (the peer, no
stemmer), dense MiniLM (first 256 word pieces, and windows), and the hybrids (RRF, weighted RRF, Chroma's R2,
the convex reranker). Results: bench/results/retrieval_eval.{json,txt}. Nothing asserts on time or score; the run
fails (after writing its results) if any corpus lost a task's evidence (`workers.search.retrieval_eval.lost_evidence`).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import re
import ssl
import statistics
import sys
import tarfile
import time
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import bm25s  # noqa: E402
import numpy as np  # noqa: E402

from workers.search import embed  # noqa: E402
from workers.search.corpus import Document, build_corpus  # noqa: E402
from workers.search.corpus_files import document_from_file  # noqa: E402
from workers.search.index import IndexConfig, SearchIndex, index_text  # noqa: E402
from workers.search.retrieval_eval import (  # noqa: E402
    KS,
    EvalQuery,
    IndexViews,
    evaluate,
    hop_queries,
    lost_evidence,
    ranked_ids,
    report,
)
from workers.search.stdlib_corpus import stdlib_documents  # noqa: E402
from workers.search.synth import synthesize  # noqa: E402
from workers.search.synth_corpus import SynthCorpus  # noqa: E402
from workers.search.synth_params import SynthParams  # noqa: E402
from workers.search.synth_steps import TemplateGenerator  # noqa: E402
from workers.search.types import Chunk  # noqa: E402

SDISTS = {"pytest": "8.3.3", "celery": "5.4.0", "lxml": "5.3.0"}
TUNING = ("md-stdlib", "rst-pytest", "py-tune")
EVALUATION = ("rst-celery", "py-eval", "html-lxml")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- corpora -----------------------------------------------------------------------------------------------------
def _download_sdist(name: str, version: str, target: Path) -> None:
    """The sdist from PyPI's simple index, checked against the sha256 the index gives (no build, no metadata)."""
    context = ssl.create_default_context(cafile=os.environ.get("PIP_CERT") or None)
    page = urllib.request.urlopen(f"https://pypi.org/simple/{name}/", context=context, timeout=60).read().decode()
    match = re.search(rf'href="([^"]*/{re.escape(target.name)})#sha256=([0-9a-f]+)"', page)
    if match is None:
        raise SystemExit(f"{target.name} is not on PyPI's simple index for {name}")
    data = urllib.request.urlopen(match.group(1), context=context, timeout=300).read()
    if hashlib.sha256(data).hexdigest() != match.group(2):
        raise SystemExit(f"{target.name}: sha256 does not match the index")
    target.parent.mkdir(parents=True, exist_ok=True)  # a fresh machine, or a caller (bench/index_build.py) that
    partial = target.with_suffix(".partial")  # did not make the cache; written whole, then renamed
    partial.write_bytes(data)
    partial.replace(target)


def _sdist_files(
    name: str, cache: Path, under: str, suffix: str, skip: tuple[str, ...] = ()
) -> Iterable[tuple[str, bytes]]:
    version = SDISTS[name]
    archive = cache / f"{name}-{version}.tar.gz"
    if not archive.exists():
        _download_sdist(name, version, archive)
    with tarfile.open(archive) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            parts = member.name.split("/", 1)
            if not (member.isfile() and len(parts) == 2 and parts[1].startswith(under)):
                continue
            if not parts[1].endswith(suffix) or any(s in parts[1] for s in skip):
                continue
            handle = tar.extractfile(member)
            if handle is not None:
                yield parts[1], handle.read()


def _package_files(*packages: str) -> Iterable[tuple[str, bytes]]:
    for package in packages:
        root = Path(__import__(package).__file__ or "").parent
        for path in sorted(root.rglob("*.py")):
            relative = path.relative_to(root.parent).as_posix()
            if "/tests/" in relative or "/migrations/" in relative:
                continue
            yield relative, path.read_bytes()


def documents(name: str, cache: Path) -> list[Document]:
    if name == "md-stdlib":
        return stdlib_documents()
    files: Iterable[tuple[str, bytes]]
    if name == "rst-pytest":
        files = _sdist_files("pytest", cache, "doc/en/", ".rst")
    elif name == "rst-celery":
        files = _sdist_files("celery", cache, "docs/", ".rst")
    elif name == "py-tune":
        files = _package_files("rest_framework", "click", "jinja2")
    elif name == "py-eval":
        files = _package_files("kombu", "redis")
    elif name == "html-lxml":
        files = _sdist_files("lxml", cache, "doc/html/", ".html", skip=("/_modules/", "genindex", "search.html"))
    else:
        raise ValueError(name)
    out = []
    for path, data in files:
        try:
            document = document_from_file(path, data)
        except ValueError as exc:
            log(f"  {name}: {path} left out ({exc})")
            continue
        if document is not None and document.text.strip():
            out.append(document)
    return out


# --- embeddings, cached per corpus --------------------------------------------------------------------------------
def corpus_embeddings(chunks: list[Chunk], cache: Path, windows: bool) -> tuple[np.ndarray, np.ndarray | None, float]:
    texts = [index_text(c) for c in chunks]
    key = hashlib.sha256(("\n\x00".join(texts) + f"|{windows}|{embed.runtime()}").encode()).hexdigest()[:20]
    path = cache / f"emb-{key}.npz"
    if path.exists():
        stored = np.load(path)
        return stored["vectors"], (stored["starts"] if windows else None), float(stored["seconds"])
    started = time.perf_counter()
    if windows:
        vectors, starts = embed.embed_windowed(texts)
    else:
        vectors, starts = embed.embed_texts(texts), np.zeros(0, dtype=np.int64)
    seconds = time.perf_counter() - started
    np.savez(path, vectors=vectors, starts=starts, seconds=seconds)
    return vectors, (starts if windows else None), seconds


# --- retrievers ---------------------------------------------------------------------------------------------------
def plain_bm25s(chunks: list[Chunk]) -> Callable[[str], list[str]]:
    """The peer: bm25s's defaults over the chunk texts (its English stopwords, no stemmer)."""
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize([c.text for c in chunks], show_progress=False), show_progress=False)
    ids = [c.chunk_id for c in chunks]

    def search(query: str) -> list[str]:
        tokens = bm25s.tokenize([query], show_progress=False, return_ids=False)
        if not tokens or not tokens[0]:
            return []
        docs, scores = retriever.retrieve(tokens, k=min(100, len(ids)), show_progress=False)
        return [ids[int(d)] for d, s in zip(docs[0], scores[0], strict=True) if float(s) > 0]

    return search


ANALYZERS: dict[str, dict[str, Any]] = {
    "bm25 words+stem": {"tokenizer": "words", "stemmer": "english"},
    "bm25 words": {"tokenizer": "words", "stemmer": None},
    "bm25 code+stem": {"tokenizer": "code", "stemmer": "english"},
    "bm25 code": {"tokenizer": "code", "stemmer": None},
}


class Corpus:
    """One corpus's chunks and its `IndexViews`, the embeddings read from (or written to) the --cache."""

    def __init__(self, name: str, chunks: list[Chunk], cache: Path) -> None:
        self.name = name
        self.chunks = chunks
        self.views = IndexViews(chunks)
        vectors, _, self.embed_seconds = corpus_embeddings(chunks, cache, windows=False)
        self.views.set_vectors(False, vectors)
        window_vectors, starts, self.window_seconds = corpus_embeddings(chunks, cache, windows=True)
        self.views.set_vectors(True, window_vectors, starts)

    def index(self, config: IndexConfig) -> SearchIndex:
        return self.views.index(config)


def hybrid(base: dict[str, Any], **changes: Any) -> IndexConfig:
    return IndexConfig(**{**base, **changes})


def retrievers_for(corpus: Corpus, analyzer: dict[str, Any], fitted: dict[str, float]) -> dict[str, Any]:
    rows: dict[str, Any] = {"bm25s plain (peer)": plain_bm25s(corpus.chunks)}
    for label, options in ANALYZERS.items():
        rows[label] = ranked_ids(corpus.index(IndexConfig(dense=False, **options)))
    for label, second in SECONDS.items():
        if second["second_tokenizer"] is None or _repeats(analyzer, second):
            continue
        two_lists = IndexConfig(dense=False, **analyzer, **second)
        rows[f"bm25 {_label(analyzer)} {label}"] = ranked_ids(corpus.index(two_lists))
    rows["dense"] = ranked_ids(corpus.index(IndexConfig(**analyzer)), dense_only=True)
    rows["dense windows"] = ranked_ids(corpus.index(IndexConfig(dense_windows=True, **analyzer)), dense_only=True)
    lexical = {k: fitted[k] for k in ("second_tokenizer", "second_stemmer", "second_bm25_weight")}
    for windows in (False, True):
        tag = " +windows" if windows else ""
        base = {**analyzer, "dense_windows": windows}
        rows[f"rrf{tag}"] = ranked_ids(corpus.index(hybrid(base, reranker="none")))
        rows[f"rrf r2{tag}"] = ranked_ids(corpus.index(hybrid(base, reranker="none", rrf_form="r2")))
        rows[f"convex a=0.5{tag}"] = ranked_ids(corpus.index(hybrid(base, reranker="convex", alpha=0.5)))
        rows[f"weighted rrf{tag}"] = ranked_ids(
            corpus.index(hybrid(base, reranker="none", dense_weight=fitted["dense_weight"]))
        )
        rows[f"convex fitted{tag}"] = ranked_ids(
            corpus.index(hybrid(base, reranker="convex", alpha=fitted["alpha"], dense_weight=fitted["dense_weight"]))
        )
        if lexical["second_tokenizer"] is not None:
            rows[f"convex fitted 2xbm25{tag}"] = ranked_ids(
                corpus.index(
                    hybrid(
                        base, reranker="convex", alpha=fitted["alpha"], dense_weight=fitted["dense_weight"], **lexical
                    )
                )
            )
    rows["default IndexConfig()"] = ranked_ids(corpus.index(IndexConfig()))
    return rows


# The second BM25 list the fit may add beside the chosen analyzer (IndexConfig.second_tokenizer), with the RRF
# weights tried for it.
SECONDS: dict[str, dict[str, Any]] = {
    "none": {"second_tokenizer": None, "second_stemmer": None},
    "+ code": {"second_tokenizer": "code", "second_stemmer": None},
    "+ words": {"second_tokenizer": "words", "second_stemmer": None},
    "+ words+stem": {"second_tokenizer": "words", "second_stemmer": "english"},
}
SECOND_WEIGHTS = (0.5, 1.0, 2.0)


def _repeats(analyzer: dict[str, Any], second: dict[str, Any]) -> bool:
    return (second["second_tokenizer"], second["second_stemmer"]) == (analyzer["tokenizer"], analyzer["stemmer"])


def _label(analyzer: dict[str, Any]) -> str:
    return analyzer["tokenizer"] + ("+stem" if analyzer["stemmer"] else "")


# --- fitting on the tuning corpora ---------------------------------------------------------------------------------
def fit(
    corpora: list[Corpus], queries: dict[str, list[EvalQuery]], analyzer: dict[str, Any], *, second_lists: bool = True
) -> dict[str, Any]:
    """Grid search over the tuning corpora of the convex reranker's (dense_weight, alpha) and of a second BM25
    list beside the chosen analyzer (`SECONDS` x `SECOND_WEIGHTS`, or none): the setting with the best mean of
    recall@1, recall@5, recall@10 and MRR, averaged over corpora (each corpus counts once). Ties go to the simpler
    setting (no second list, then the lower weights), as the grid is walked in that order. `second_lists=False`:
    one BM25 list only."""
    # The default stays a hybrid: the dense list has a weight and the dense score a share of the rerank. On these
    # quote-like queries BM25 is near its ceiling and a fit over 0 too picks 0 by a margin of 0.0005 (noise); an
    # agent's own queries are looser, which is where the dense side earns its place.
    grid_w = [0.25, 0.5, 1.0]
    grid_a = [0.1, 0.2, 0.3, 0.4, 0.5]
    windows = analyzer.get("dense_windows", False)
    seconds: list[dict[str, Any]] = []
    for second in SECONDS.values():
        if second["second_tokenizer"] is None:
            seconds.append({**second, "second_bm25_weight": 1.0})
        elif second_lists and not _repeats(analyzer, second):
            seconds += [{**second, "second_bm25_weight": w} for w in SECOND_WEIGHTS]
    scored: list[tuple[float, dict[str, Any]]] = []
    for second, weight, alpha in itertools.product(seconds, grid_w, grid_a):
        config = hybrid(analyzer, reranker="convex", alpha=alpha, dense_weight=weight, dense_windows=windows, **second)
        setting = {"dense_weight": weight, "alpha": alpha, **second}
        scored.append((_objective(corpora, queries, config), setting))
        log(f"  fit: {setting}: {scored[-1][0]:.4f}")
    objective, best = scored[0]
    for value, setting in scored[1:]:
        if value > objective + 1e-12:
            objective, best = value, setting
    return {**best, "objective": objective, "grid": [[v, s] for v, s in scored]}


_RECALLS = tuple(f"recall@{k}" for k in KS)


def _objective(corpora: list[Corpus], queries: dict[str, list[EvalQuery]], config: IndexConfig) -> float:
    """The fit's objective: the mean of recall@1, @5, @10 and MRR per query, averaged per corpus, then over corpora."""
    per_corpus = []
    for corpus in corpora:
        rows = evaluate({"x": ranked_ids(corpus.index(config))}, queries[corpus.name])["x"]
        per_corpus.append(statistics.mean(statistics.mean(r[m] for m in (*_RECALLS, "mrr")) for r in rows))
    return statistics.mean(per_corpus)


def pick_analyzer(results: dict[str, Any]) -> dict[str, Any]:
    """The BM25 analyzer with the best mean recall@1 over the tuning corpora (ties: recall@5)."""

    def score(label: str) -> tuple[float, float]:
        firsts = [results[c]["metrics"][label]["all"] for c in TUNING if c in results]
        return (
            statistics.mean(f["recall@1"]["mean"] for f in firsts),
            statistics.mean(f["recall@5"]["mean"] for f in firsts),
        )

    best = max(ANALYZERS, key=score)
    return dict(ANALYZERS[best])


# --- main ------------------------------------------------------------------------------------------------------------
def table(results: dict[str, Any], names: Iterable[str], part: str) -> list[str]:
    lines = []
    for corpus in names:
        info = results[corpus]
        lines.append(
            f"\n{corpus} ({info['chunks']} chunks, {info['tasks']} tasks, "
            f"{sum(info['queries'].values()) if part == 'all' else info['queries'][part]} {part}-hop queries)"
        )
        lines.append(f"  {'retriever':24} " + " ".join(f"{m:>18}" for m in (*_RECALLS, "mrr", "ndcg@10")))
        for label, metrics in info["metrics"].items():
            cells = []
            for m in (*_RECALLS, "mrr", "ndcg@10"):
                value = metrics[part].get(m)
                cells.append(f"{value['mean']:.3f} [{value['low']:.2f},{value['high']:.2f}]" if value else "-")
            lines.append(f"  {label:24} " + " ".join(f"{c:>18}" for c in cells))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=120, help="verified tasks per corpus (at most)")
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "crucible" / "retrieval-bench"))
    parser.add_argument("--corpora", default=",".join(TUNING + EVALUATION))
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "retrieval_eval.json"))
    args = parser.parse_args()
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    names = [n for n in args.corpora.split(",") if n]

    corpora: dict[str, Corpus] = {}
    queries: dict[str, list[EvalQuery]] = {}
    info: dict[str, dict[str, Any]] = {}
    lost: dict[str, dict[str, list[str]]] = {}
    for name in names:
        docs = documents(name, cache)
        chunks, corpus_report = build_corpus(docs, source=name)
        synth = SynthCorpus(chunks)
        tasks = synthesize(synth, SynthParams(num_tasks=args.tasks, max_hops=2, seed=0), TemplateGenerator(synth)).tasks
        # Every corpus: no task's evidence may be missing from the chunks of its document (docs/corpus-chunking.md).
        lost[name] = lost_evidence(tasks, chunks)
        if lost[name]:
            log(f"{name}: {len(lost[name])} task(s) lost evidence: {sorted(lost[name])[:10]}")
        queries[name] = hop_queries(tasks, synth)
        corpora[name] = Corpus(name, chunks, cache)
        words = [len(c.text.split()) for c in chunks]
        info[name] = {
            "split": "tuning" if name in TUNING else "evaluation",
            "documents": len(docs),
            "chunks": len(chunks),
            "mean_words": round(statistics.mean(words), 1),
            "tasks": len(tasks),
            "queries": {
                "first": sum(1 for q in queries[name] if q.hop == 0),
                "later": sum(1 for q in queries[name] if q.hop > 0),
            },
            "embed_seconds": round(corpora[name].embed_seconds, 1),
            "report": {
                k: corpus_report[k]
                for k in ("documents", "chunks", "empty_documents", "shared_chunks", "near_duplicate_chunks_dropped")
            },
            "evidence_lost": lost[name],
        }
        log(f"{name}: {len(docs)} documents, {len(chunks)} chunks, {len(tasks)} tasks, {len(queries[name])} queries")

    # 1. the analyzer, on the tuning corpora, from the BM25 rows alone
    results: dict[str, Any] = {n: dict(info[n]) for n in names}
    bm25_rows = {}
    for name in names:
        rows = {
            label: ranked_ids(corpora[name].index(IndexConfig(dense=False, **options)))
            for label, options in ANALYZERS.items()
        }
        bm25_rows[name] = report(evaluate(rows, queries[name]), queries[name])
        results[name]["metrics"] = bm25_rows[name]
    tuning = [n for n in names if n in TUNING]
    analyzer = pick_analyzer(results) if tuning else {"tokenizer": "code", "stemmer": None}
    log(f"analyzer chosen on the tuning corpora: {analyzer}")
    # 2. fusion weights, on the tuning corpora
    fitted_windows = {}
    for windows in (False, True):
        base = {**analyzer, "dense_windows": windows}
        # The second BM25 list is searched with windows only (windows won the one-list fit on every run so far;
        # the grid without them stays to show that).
        fitted_windows[windows] = fit([corpora[n] for n in tuning], queries, base, second_lists=windows)
        log(f"fitted (windows={windows}): { {k: v for k, v in fitted_windows[windows].items() if k != 'grid'} }")
    fitted = (
        fitted_windows[True]
        if fitted_windows[True]["objective"] >= fitted_windows[False]["objective"]
        else (fitted_windows[False])
    )
    # Does the fit beat today's default by more than noise? One query of a tuning corpus moves the objective by
    # about 1 / (its queries); a default changes only on a gain of at least one query per corpus.
    default_objective = _objective([corpora[n] for n in tuning], queries, IndexConfig()) if tuning else None
    queries_per_corpus = statistics.mean(len(queries[n]) for n in tuning) if tuning else 1
    verdict = {
        "default_objective": default_objective,
        "fitted_objective": fitted["objective"],
        "threshold": 1 / queries_per_corpus,
        "change_default": default_objective is not None
        and fitted["objective"] - default_objective >= 1 / queries_per_corpus,
    }
    log(f"fit against today's default: {verdict}")
    # 3. every row, every corpus
    for name in names:
        rows = retrievers_for(corpora[name], analyzer, fitted)
        results[name]["metrics"] = report(evaluate(rows, queries[name]), queries[name])
        log(f"{name}: evaluated {len(rows)} retrievers")
    out = {
        "analyzer": analyzer,
        "fitted": {str(k): {kk: vv for kk, vv in v.items() if kk != "grid"} for k, v in fitted_windows.items()},
        "fit_vs_default": verdict,
        "default_config": IndexConfig().model_dump(mode="json"),
        "fitted_grid": {str(k): v["grid"] for k, v in fitted_windows.items()},
        "embedding_runtime": embed.runtime(),
        "corpora": results,
        "load_average": os.getloadavg(),
    }
    Path(args.out).write_text(json.dumps(out, indent=1))
    lines = [f"analyzer {analyzer}; fitted {out['fitted']}", f"fit vs today's default: {verdict}"]
    for part in ("first", "later", "all"):
        lines.append(f"\n=== {part} hop ===")
        lines += table(results, [n for n in names if n in TUNING], part)
        lines += table(results, [n for n in names if n in EVALUATION], part)
    losses = {name: sorted(tasks) for name, tasks in lost.items() if tasks}
    lines.append(f"\nevidence lost: {losses or 'none, on every corpus'}")
    text = "\n".join(lines)
    Path(args.out).with_suffix(".txt").write_text(text + "\n")
    print(text)
    if losses:
        sys.exit(f"evidence lost on {', '.join(losses)}: those tasks can never be found (see evidence_lost)")


if __name__ == "__main__":
    main()
