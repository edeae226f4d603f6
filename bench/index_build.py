"""Index build speed: the index as it was built before issue 21 against today's default, side by side.

    .venv/bin/python bench/index_build.py [--chunks 1500] [--rounds 3]

Both sides build a `SearchIndex` (BM25 + MiniLM embeddings) over the same chunks of the celery documentation
(`bench/retrieval_eval.py`'s rst-celery corpus, its first --chunks chunks), in alternating rounds in one process:

  before    float32 embedding, batches of 128, one vector per chunk (its first 256 word pieces), words analyzer
  default   today's `IndexConfig()` and `embed.runtime()` (bfloat16 autocast where the CPU has it, batches of 32,
            and windows when the default says so)
  bfloat16, no windows   today's runtime on the old config: the runtime's own share of the gain

Prints seconds per build, chunks per second, the median ratio before / default with its spread over rounds, and
the load average. Results: bench/results/index_build.{json,txt}. Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._noise import add_load_guard, load_guard  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))

from retrieval_eval import documents  # noqa: E402

from workers.search import embed  # noqa: E402
from workers.search.corpus import build_corpus  # noqa: E402
from workers.search.index import IndexConfig, SearchIndex  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "crucible" / "retrieval-bench"))
    add_load_guard(parser)
    args = parser.parse_args()
    load_guard(args)
    chunks, _ = build_corpus(documents("rst-celery", Path(args.cache)))
    chunks = chunks[: args.chunks]
    embed.embedder()  # loaded once, outside every timing
    sides = {
        "before": ("float32", 128, IndexConfig(tokenizer="words", stemmer="english", dense_windows=False)),
        "default": (None, embed.BATCH_SIZE, IndexConfig()),
        "bfloat16, no windows": ("bfloat16", embed.BATCH_SIZE, IndexConfig(dense_windows=False)),
    }
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    rows: dict[str, int] = {}
    original_batch = embed.BATCH_SIZE
    for round_no in range(args.rounds):
        order = list(sides) if round_no % 2 == 0 else list(reversed(sides))
        for name in order:
            dtype, batch, config = sides[name]
            if dtype is None:
                os.environ.pop("CRUCIBLE_EMBED_DTYPE", None)
            else:
                os.environ["CRUCIBLE_EMBED_DTYPE"] = dtype
            embed.BATCH_SIZE = batch
            started = time.perf_counter()
            index = SearchIndex.build(chunks, config)
            seconds[name].append(time.perf_counter() - started)
            rows[name] = int(index.manifest["embedding"]["rows"])
            print(f"round {round_no + 1} {name:22} {seconds[name][-1]:7.1f} s", flush=True)
    embed.BATCH_SIZE = original_batch
    os.environ.pop("CRUCIBLE_EMBED_DTYPE", None)
    ratios = [b / d for b, d in zip(seconds["before"], seconds["default"], strict=True)]
    result = {
        "chunks": len(chunks),
        "default_config": IndexConfig().model_dump(mode="json"),
        "runtime": embed.runtime(),
        "seconds": seconds,
        "embedding_rows": rows,
        "chunks_per_second": {n: round(len(chunks) / statistics.median(s), 1) for n, s in seconds.items()},
        "speedup_before_over_default": {
            "median": round(statistics.median(ratios), 2),
            "min": round(min(ratios), 2),
            "max": round(max(ratios), 2),
        },
        "load_average": os.getloadavg(),
    }
    text = "\n".join(
        [f"{len(chunks)} chunks of rst-celery, {args.rounds} alternating rounds, load average {result['load_average']}"]
        + [
            f"  {n:22} median {statistics.median(s):6.1f} s  {result['chunks_per_second'][n]:6.1f} chunks/s  "
            f"({rows[n]} vectors)"
            for n, s in seconds.items()
        ]
        + [f"  speed-up per chunk, before / default: {result['speedup_before_over_default']}"]
    )
    print(text)
    out = ROOT / "bench" / "results" / "index_build"
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    out.with_suffix(".txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
