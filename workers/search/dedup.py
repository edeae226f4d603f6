"""Boilerplate and near-duplicate text, found when a corpus is built (`workers.search.corpus.build_corpus`).

- **Boilerplate paragraphs**: a paragraph of at most `BOILERPLATE_MAX_WORDS` words that appears, after
  normalisation (lower case, digits as 0, whitespace collapsed), in at least `max(3, 5%)` of the documents: page
  footers, copyright lines, navigation left in a page, but also an option block a family of documents shares.
  It is set apart before chunking so it does not pad every chunk of the document, and is never deleted:
  `build_corpus` stores it as a chunk of its own (`metadata["boilerplate"]`), which the merge below stores once
  and attributes to every document that holds it word for word.
  Headings never count (`## Parameters` in every API page is structure, not boilerplate).
- **Near-duplicate chunks**: a chunk whose word-trigram set (lower case, digits kept) has a Jaccard
  similarity of at least `threshold` (0.9) with an earlier chunk's is a copy of it. Candidates come from MinHash
  with locality sensitive hashing (32 hashes in 8 bands of 4: a pair at Jaccard 0.9 is a candidate with
  probability 0.9998), and every candidate pair is confirmed by the exact Jaccard, so nothing matches on a hash
  collision. `near_duplicates` maps each copy to the earlier chunk it copies.
- **Copies across documents are merged, never deleted** (`merge_copies`, what `build_corpus` uses): a copy
  inside the same document is dropped (the document keeps the earlier chunk); a copy in another document whose
  text is identical (whitespace aside) is stored once and attributed to that document too; a near copy in
  another document that differs in any character is kept as its own chunk, since dropping it would delete the
  words it does not share. docs/corpus-chunking.md.
"""

from __future__ import annotations

import re
import zlib
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

BOILERPLATE_MAX_WORDS = 40
NEAR_DUPLICATE_JACCARD = 0.9
_HASHES, _BANDS = 32, 8
_PRIME = (1 << 61) - 1
_rng = np.random.default_rng(20261126)
_A = _rng.integers(1, _PRIME, size=_HASHES, dtype=np.uint64)
_B = _rng.integers(0, _PRIME, size=_HASHES, dtype=np.uint64)
_WORD = re.compile(r"\w+")
_DIGITS = re.compile(r"\d+")
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
_HEADING = re.compile(r"#{1,6}[ \t]")


def normalise(text: str) -> str:
    return " ".join(_DIGITS.sub("0", text.lower()).split())


def boilerplate_paragraphs(texts: Sequence[str]) -> set[str]:
    """Normalised paragraphs that are boilerplate across these documents (module docstring)."""
    if len(texts) < 3:
        return set()
    seen: Counter[str] = Counter()
    for text in texts:
        paragraphs = {normalise(p) for p in _PARAGRAPH_BREAK.split(text) if p.strip()}
        seen.update(p for p in paragraphs if len(p.split()) <= BOILERPLATE_MAX_WORDS and not _HEADING.match(p))
    floor = max(3, -(-len(texts) * 5 // 100))
    return {p for p, n in seen.items() if n >= floor}


def split_paragraphs(text: str, drop: set[str]) -> tuple[str, list[str]]:
    """`text` without the paragraphs whose normalised form is in `drop`, and those paragraphs as written (each
    once, in order): (text, paragraphs set apart). The caller keeps them findable (`build_corpus` stores each as a
    chunk of its own, attributed to every document that holds it)."""
    if not drop:
        return text, []
    kept: list[str] = []
    removed: list[str] = []
    for paragraph in _PARAGRAPH_BREAK.split(text):
        if paragraph.strip() and normalise(paragraph) in drop:
            if not any(same_text(paragraph, earlier) for earlier in removed):
                removed.append(paragraph.strip())
        else:
            kept.append(paragraph)
    return "\n\n".join(kept), removed


def _shingles(text: str) -> set[int]:
    # Digits stay: two release notes or two numbered steps that differ only in their numbers are not copies.
    words = _WORD.findall(text.lower())
    grams = [" ".join(words[i : i + 3]) for i in range(max(1, len(words) - 2))] if words else []
    return {zlib.crc32(g.encode()) for g in grams}


def _signature(shingles: set[int]) -> np.ndarray:
    values = np.fromiter(shingles, dtype=np.uint64, count=len(shingles))
    # (a x + b) mod p for each of the hash functions, minimum over the shingles. uint64 products wrap, which is
    # still a fixed pseudo-random function of x: good enough for bucketing, and every match is confirmed exactly.
    hashed = (values[:, None] * _A[None, :] + _B[None, :]) % np.uint64(_PRIME)
    minimum: np.ndarray = hashed.min(axis=0)
    return minimum


def near_duplicates(texts: Sequence[str], threshold: float = NEAR_DUPLICATE_JACCARD) -> dict[int, int]:
    """{dropped index: the earlier index it duplicates} (module docstring). Texts without words never match."""
    shingles = [_shingles(t) for t in texts]
    buckets: dict[tuple[int, bytes], list[int]] = defaultdict(list)
    rows = _HASHES // _BANDS
    dropped: dict[int, int] = {}
    for i, current in enumerate(shingles):
        if not current:
            continue
        signature = _signature(current)
        keys = [(band, signature[band * rows : (band + 1) * rows].tobytes()) for band in range(_BANDS)]
        match = None
        candidates = sorted({j for key in keys for j in buckets.get(key, ())})
        for j in candidates:
            other = shingles[j]
            if len(current & other) / len(current | other) >= threshold:
                match = j
                break
        if match is not None:
            dropped[i] = match
            continue
        for key in keys:
            buckets[key].append(i)
    return dropped


@dataclass
class Merge:
    """What `merge_copies` decided, by index into the texts given to it."""

    dropped: dict[int, int] = field(default_factory=dict)
    """A copy of an earlier chunk that its document already holds: {index: the kept index}."""
    shared: dict[int, int] = field(default_factory=dict)
    """An identical copy in another document, stored as the kept chunk: {index: the kept index}."""
    kept_near: dict[int, int] = field(default_factory=dict)
    """A near copy in another document that differs in its text, kept as its own chunk: {index: the one it is near}."""


def same_text(a: str, b: str) -> bool:
    """Identical apart from whitespace: a quote of one is a quote of the other."""
    return a.split() == b.split()


def merge_copies(texts: Sequence[str], groups: Sequence[str], threshold: float = NEAR_DUPLICATE_JACCARD) -> Merge:
    """Near-duplicates (module docstring) resolved so that no group (document) loses text.

    For each text in order, the earlier stored texts it copies (Jaccard >= threshold) are found. One with the same
    text apart from whitespace is preferred: if its group (or a group it is attributed to) is this text's, the
    text is dropped (`dropped`), else the text is attributed to it (`shared`). Without one, a near copy that this
    group already holds drops the text (`dropped`: a repeat within a document); otherwise the text is stored
    (`kept_near` when it was a near copy of another group's) and later texts can match it.
    """
    if len(texts) != len(groups):
        raise ValueError("merge_copies needs one group per text")
    shingles = [_shingles(t) for t in texts]
    buckets: dict[tuple[int, bytes], list[int]] = defaultdict(list)
    rows = _HASHES // _BANDS
    holders: dict[int, set[str]] = {}
    out = Merge()
    for i, current in enumerate(shingles):
        if not current:
            continue
        signature = _signature(current)
        keys = [(band, signature[band * rows : (band + 1) * rows].tobytes()) for band in range(_BANDS)]
        candidates = sorted({j for key in keys for j in buckets.get(key, ())})
        matches = [j for j in candidates if len(current & shingles[j]) / len(current | shingles[j]) >= threshold]
        same = next((j for j in matches if same_text(texts[i], texts[j])), None)
        if same is not None and groups[i] in holders[same]:
            out.dropped[i] = same
            continue
        if same is not None:
            out.shared[i] = same
            holders[same].add(groups[i])
            continue
        own = next((j for j in matches if groups[i] in holders[j]), None)
        if own is not None:
            out.dropped[i] = own
            continue
        if matches:
            out.kept_near[i] = matches[0]
        holders[i] = {groups[i]}
        for key in keys:
            buckets[key].append(i)
    return out
