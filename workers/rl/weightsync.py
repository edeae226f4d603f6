"""Weight sync between the learner and the inference replicas: full snapshots and XOR deltas, zstd-compressed.

docs/methods.md C5: every step the sender caches its previous upload and ships only the difference; receivers rebuild
the new weights from the chain of deltas. The codec here is the lossless one Composer 2, SkyRL and slime describe:

- **delta** = XOR of the previous and the new bit pattern of every tensor. An unchanged weight XORs to zero, and
  a weight nudged by an optimizer step keeps its sign and usually its exponent, so the high bytes of the XOR are
  mostly zero. XOR is bitwise, so it is the same whether the elements are viewed as int32 (fp32), int16 (bf16,
  fp16) or bytes; the receiver XORs again and gets the new bit pattern back exactly, NaN payloads and -0.0
  included.
- **byte planes**: before compression each chunk of a tensor is transposed from element order to byte-plane order
  (all least-significant bytes, then the next, ...), so the long zero runs of the high bytes reach zstd as runs.
- **zstd**, multi-threaded (`threads=-1`: one worker per CPU), with zstd's frame checksum on.

A blob carries a small JSON header: kind (full or delta), ``version`` and ``base_version``, each tensor's name,
dtype and shape, and a SHA-256 digest of the *reconstructed* state (names, dtypes, shapes and raw bytes) plus,
for a delta, the digest of the base it was computed against. A receiver therefore refuses a delta applied to the
wrong base (:class:`WeightSyncError`) instead of silently producing garbage, and checks its result bit-for-bit.

Blob layout: ``b"CRWS"``, one format byte, a little-endian uint32 header length, the UTF-8 JSON header, then one
zstd frame holding every tensor's bytes in header order, each tensor cut into chunks of at most
``chunk_elements`` elements and each chunk in byte-plane order.

All work is vectorised numpy over zero-copy views of the tensors' storage (no per-element Python). Tensors on an
accelerator are copied to the CPU first; sparse and quantized tensors are refused.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np
from torch import Tensor

from workers.rl.weight_codec import (
    DEFAULT_CHUNK_ELEMENTS,
    Entry,
    SyncHeader,
    SyncKind,
    SyncStats,
    WeightSyncError,
    WeightUpdate,
    apply,
    apply_delta,
    check_level,
    check_same_tensors,
    decode,
    decode_full,
    digest_of,
    encode,
    encode_delta,
    encode_full,
    entries_of,
    read_header,
    split_blob,
    state_digest,
    verify_digest,
)

__all__ = [
    "SyncHeader",
    "SyncStats",
    "WeightSyncError",
    "WeightSyncReceiver",
    "WeightSyncSender",
    "WeightUpdate",
    "apply_delta",
    "decode_full",
    "encode_delta",
    "encode_full",
    "read_header",
    "state_digest",
]


# --- stateful ends -------------------------------------------------------------------------------------------------


class WeightSyncSender:
    """The learner's end: caches the previous upload and turns each new state into a delta against it.

    The first :meth:`push` (and any with ``full=True``, or after :meth:`reset`) yields a full blob; later ones
    yield a delta whose ``base_version`` is the previous push's version. The cache is a private copy of the
    previous weights' bytes, so the caller may keep training the same tensors in place.
    """

    def __init__(self, *, level: int = 3, threads: int = -1, chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> None:
        check_level(level)
        self.level = level
        self.threads = threads
        self.chunk_elements = chunk_elements
        self._cache: dict[str, Entry] | None = None
        self._digest: str | None = None
        self._version: int | None = None

    @property
    def version(self) -> int | None:
        """Version of the last push, None before the first."""
        return self._version

    def reset(self) -> None:
        """Forget the cached base; the next push is full (e.g. after a receiver asked for one)."""
        self._cache = None
        self._digest = None

    def push(self, state: Mapping[str, Tensor], *, version: int | None = None, full: bool = False) -> WeightUpdate:
        """Encode ``state`` as version ``version`` (default: previous + 1, or 0 for the first push).

        A delta needs the same tensor names, dtypes and shapes as the previous push (else
        :class:`WeightSyncError`); versions must increase.
        """
        started = time.perf_counter()
        if version is None:
            version = 0 if self._version is None else self._version + 1
        if self._version is not None and version <= self._version:
            raise WeightSyncError(f"version {version} does not follow the previous push's version {self._version}")
        entries = entries_of(state)
        digest = digest_of(entries)
        delta = self._cache is not None and not full
        if self._cache is not None and delta:
            check_same_tensors(self._cache, entries, f"push of version {version}")
        kind: SyncKind = "delta" if delta else "full"
        base_version = self._version if delta else None
        blob = encode(
            kind=kind,
            new=entries,
            prev=self._cache if delta else None,
            version=version,
            base_version=base_version,
            digest=digest,
            base_digest=self._digest if delta else None,
            level=self.level,
            threads=self.threads,
            chunk_elements=self.chunk_elements,
        )
        self._remember(entries)
        self._digest = digest
        self._version = version
        raw = sum(e.raw.nbytes for e in entries)
        stats = SyncStats(len(blob), time.perf_counter() - started, len(blob) / raw if raw else 0.0)
        return WeightUpdate(blob=blob, kind=kind, version=version, base_version=base_version, stats=stats)

    def _remember(self, entries: list[Entry]) -> None:
        """Copy the pushed bytes into the cache, reusing its buffers when the layout is unchanged."""
        cache = self._cache
        if cache is not None and list(cache) == [e.name for e in entries]:
            for e in entries:
                cached = cache[e.name]
                if cached.raw.nbytes == e.raw.nbytes:
                    np.copyto(cached.raw, e.raw)
                    cache[e.name] = Entry(e.name, e.dtype, e.shape, cached.raw)
                else:
                    cache[e.name] = Entry(e.name, e.dtype, e.shape, e.raw.copy())
        else:
            self._cache = {e.name: Entry(e.name, e.dtype, e.shape, e.raw.copy()) for e in entries}


class WeightSyncReceiver:
    """An inference replica's end: applies full blobs and deltas in order and tracks the version it holds.

    The base digest is remembered from the previous apply, so a delta costs one decode plus (with ``verify``) one
    digest of the result. The returned tensors are the receiver's own; copy them into a model
    (``model.load_state_dict(state)`` copies) rather than modifying them in place, or the next delta will fail
    its checksum.
    """

    def __init__(self, *, verify: bool = True) -> None:
        self.verify = verify
        self._state: dict[str, Tensor] | None = None
        self._entries: list[Entry] = []
        self._digest: str | None = None
        self._version: int | None = None
        self.last_stats: SyncStats | None = None

    @property
    def version(self) -> int | None:
        """Version currently held, None before the first full blob."""
        return self._version

    @property
    def state(self) -> dict[str, Tensor]:
        if self._state is None:
            raise WeightSyncError("no weights received yet: the first blob must be a full sync")
        return self._state

    def receive(self, blob: bytes | bytearray | memoryview) -> dict[str, Tensor]:
        """Apply one blob and return the new state (name -> CPU tensor)."""
        started = time.perf_counter()
        header, payload = split_blob(blob)
        if header.kind == "full":
            state, entries = decode(header, payload, None)
            if self.verify:
                verify_digest(header, entries)
        else:
            if self._state is None:
                raise WeightSyncError(
                    f"delta {header.base_version} -> {header.version} arrived before any full sync: request one"
                )
            state, entries = apply(
                header,
                payload,
                self._entries,
                base_digest=self._digest,
                base_version=self._version,
                verify=self.verify,
            )
        self._state, self._entries = state, entries
        self._digest, self._version = header.digest, header.version
        raw = header.raw_bytes
        self.last_stats = SyncStats(len(blob), time.perf_counter() - started, len(blob) / raw if raw else 0.0)
        return state
