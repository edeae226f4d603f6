"""How a search index is built (`IndexConfig`: chunk text, BM25 and its analyzer, the dense embedder, fusion and
reranking), stored in the index's manifest with a content hash; `workers.search.index` builds and loads indexes."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from workers.search.analyzers import Tokenizer


class IndexConfig(BaseModel):
    """How an index is built and queried. It is part of the index's identity (its hash names the build)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bm25_k1: float = Field(default=1.5, gt=0, le=10, description="BM25 term-frequency saturation k1")
    bm25_b: float = Field(default=0.75, ge=0, le=1, description="BM25 length normalisation b (0: none, 1: full)")
    tokenizer: Tokenizer = Field(
        default="words",
        description="words: bm25s's word tokens (os.path.join is os, path, join); code: identifiers, dotted names "
        "and --flags kept whole and split into their parts (workers.search.analyzers)",
    )
    stemmer: Literal["english"] | None = Field(
        default=None,
        description="Snowball stemmer applied to chunk and query tokens (PyStemmer); null (the default, chosen by "
        "bench/retrieval_eval.py on its tuning corpora): no stemming, so option and identifier names match as written",
    )
    stopwords: Literal["en"] | None = Field(
        default="en", description="stopword list removed before BM25; null: keep all"
    )
    second_tokenizer: Tokenizer | None = Field(
        default=None,
        description="a second BM25 list over this tokenizer (with `second_stemmer`, the same stopwords), fused in RRF "
        "with weight `second_bm25_weight` and averaged with the first into the convex reranker's BM25 term; null: one "
        "BM25 list",
    )
    second_stemmer: Literal["english"] | None = Field(
        default=None, description="the second BM25 list's stemmer (null: none); used only with `second_tokenizer`"
    )
    second_bm25_weight: float = Field(
        default=1.0, ge=0, le=10, description="weight of the second BM25 list in RRF and in the convex BM25 term"
    )
    dense: bool = Field(
        default=True, description="MiniLM embeddings beside BM25 (false: BM25 only, no fusion or rerank)"
    )
    rrf_k: int = Field(default=60, ge=1, le=10_000, description="RRF constant k (docs/methods.md R1 and R2)")
    rrf_form: Literal["r1", "r2"] = Field(
        default="r1",
        description="r1: 1-based ranks (Cormack et al., docs/methods.md R1); r2: Chroma's Rrf, 0-based ranks (R2)",
    )
    bm25_weight: float = Field(
        default=1.0, ge=0, le=10, description="weight of the BM25 list in RRF (1 and 1: plain RRF; R2's w_i)"
    )
    dense_weight: float = Field(
        default=0.25,
        ge=0,
        le=10,
        description="weight of the dense list in RRF (0.25: fitted on the retrieval harness's tuning corpora)",
    )
    dense_windows: bool = Field(
        default=True,
        description="embed a chunk longer than MiniLM's 256 word pieces in overlapping windows and score it by its "
        "best window (false: the embedding sees the chunk's beginning only)",
    )
    candidates: int = Field(default=50, ge=1, le=1000, description="depth of each retriever's list fused with RRF")
    rerank_top: int = Field(default=50, ge=0, le=2000, description="how many of the fused candidates are reranked")
    reranker: Literal["convex", "none"] = Field(
        default="convex",
        description="convex: alpha x min-max(dense cosine) + (1 - alpha) x min-max(BM25) over the candidates "
        "(Bruch et al. 2023); none: keep the RRF order",
    )
    alpha: float = Field(
        default=0.3,
        ge=0,
        le=1,
        description="the dense share of the convex reranker's score (0.3: fitted on the harness's tuning corpora)",
    )

    @model_validator(mode="after")
    def _second_list_differs(self) -> IndexConfig:
        if self.second_tokenizer == self.tokenizer and self.second_stemmer == self.stemmer:
            raise ValueError(
                f"second_tokenizer={self.second_tokenizer!r} with second_stemmer={self.second_stemmer!r} repeats the "
                "first BM25 list: choose another tokenizer or stemmer for it, or set second_tokenizer to null"
            )
        return self

    @classmethod
    def from_stored(cls, values: Mapping[str, Any], *, format_version: int) -> IndexConfig:
        """A config as an index manifest (or a stored index row) recorded it. A field younger than the index's
        format takes the legacy value the index was built with, not today's default."""
        filled = dict(values)
        for name, (since, legacy) in _LATER_FIELDS.items():
            if format_version < since:
                filled.setdefault(name, legacy)
        return cls.model_validate(filled)

    def content_hash(self) -> str:
        """sha256 of the full config with defaults filled in: `{}` and the same values spelled out hash alike.
        A field added after format 1 enters the hash only when it differs from its legacy value (the behaviour
        before it existed), so the indexes built before it keep their identity."""
        values = self.model_dump(mode="json")
        for name, (_, legacy) in _LATER_FIELDS.items():
            if values[name] == legacy:
                del values[name]
        canonical = json.dumps(values, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


# Fields added after format 1: the format that introduced each, and the value that reproduces how an older index
# was built (see IndexConfig.from_stored and content_hash).
_LATER_FIELDS: dict[str, tuple[int, Any]] = {
    "tokenizer": (2, "words"),
    "rrf_form": (2, "r1"),
    "bm25_weight": (2, 1.0),
    "dense_weight": (2, 1.0),
    "dense_windows": (2, False),
    "second_tokenizer": (3, None),
    "second_stemmer": (3, None),
    "second_bm25_weight": (3, 1.0),
}
