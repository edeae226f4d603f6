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

import hashlib
import io
import json
import struct
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch
import zstandard
from torch import Tensor

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

_MAGIC = b"CRWS"
_FORMAT = 1
_PREAMBLE = struct.Struct("<4sBI")  # magic, format byte, header length
_DIGEST_ALGO = "sha256"  # hardware-accelerated on current x86 and ARM CPUs: about 2x blake2b here
# Elements per byte-plane chunk: bounds the scratch memory to chunk_elements * itemsize bytes per tensor.
DEFAULT_CHUNK_ELEMENTS = 1 << 22

Bytes1D = npt.NDArray[np.uint8]
SyncKind = Literal["full", "delta"]


class WeightSyncError(ValueError):
    """A blob cannot be applied: wrong base, mismatched tensors, a corrupt blob or a failed checksum."""


@dataclass(frozen=True)
class SyncStats:
    """Cost of one encode or apply.

    ``bytes``: size of the blob. ``seconds``: wall time of the encode (sender) or the decode and verify (receiver).
    ``ratio_vs_full``: blob size over the raw, uncompressed size of the full state (sum of the tensors' bytes), so a
    delta's saving is ``1 - ratio_vs_full`` relative to shipping the weights as they are.
    """

    bytes: int
    seconds: float
    ratio_vs_full: float


@dataclass(frozen=True)
class SyncHeader:
    """The parsed header of a blob; ``tensors`` lists (name, dtype, shape) in payload order."""

    kind: SyncKind
    version: int
    base_version: int | None
    digest: str
    base_digest: str | None
    raw_bytes: int
    chunk_elements: int
    tensors: tuple[tuple[str, torch.dtype, tuple[int, ...]], ...]


@dataclass(frozen=True)
class WeightUpdate:
    """One message from :class:`WeightSyncSender`: the blob to upload and what it is."""

    blob: bytes
    kind: SyncKind
    version: int
    base_version: int | None
    stats: SyncStats


# --- tensors as bytes ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    raw: Bytes1D  # the tensor's raw bytes, C order, native (little-endian) byte order

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize


def _tensor_bytes(name: str, tensor: Tensor) -> Bytes1D:
    """Zero-copy uint8 view of a CPU contiguous tensor's storage (a copy for anything else)."""
    if not isinstance(tensor, Tensor):
        raise WeightSyncError(f"state[{name!r}] is a {type(tensor).__name__}, not a torch.Tensor")
    if tensor.layout != torch.strided or tensor.is_quantized:
        raise WeightSyncError(f"state[{name!r}] has layout {tensor.layout}; only dense tensors can be synced")
    flat = tensor.detach().resolve_conj().resolve_neg().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy()


def _entries(state: Mapping[str, Tensor]) -> list[_Entry]:
    out: list[_Entry] = []
    for name, tensor in state.items():
        if not isinstance(name, str):
            raise WeightSyncError(f"state keys must be strings, got {name!r}")
        out.append(_Entry(name, tensor.dtype, tuple(tensor.shape), _tensor_bytes(name, tensor)))
    return out


def _digest(entries: list[_Entry]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in order."""
    h = hashlib.new(_DIGEST_ALGO)
    for e in entries:
        h.update(json.dumps([e.name, str(e.dtype), list(e.shape)]).encode())
        h.update(e.raw.data)
    return h.hexdigest()


def state_digest(state: Mapping[str, Tensor]) -> str:
    """The digest a blob records for ``state`` (hex SHA-256 of names, dtypes, shapes and raw bytes)."""
    return _digest(_entries(state))


def _dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise WeightSyncError(f"unknown dtype {name!r} in blob header")
    return dtype


def _chunks(nbytes: int, itemsize: int, chunk_elements: int) -> Iterator[tuple[int, int]]:
    """(start, stop) byte offsets of the byte-plane chunks of one tensor."""
    step = chunk_elements * itemsize
    for start in range(0, nbytes, step):
        yield start, min(start + step, nbytes)


def _as_planes(flat: Bytes1D, itemsize: int) -> npt.NDArray[np.uint8]:
    """[n * itemsize] bytes in element order -> strided [itemsize, n] view, one row per byte plane."""
    return flat.reshape(-1, itemsize).T


# --- encoding ------------------------------------------------------------------------------------------------------


def _compressor(level: int, threads: int) -> zstandard.ZstdCompressor:
    return zstandard.ZstdCompressor(level=level, threads=threads, write_checksum=True)


def _encode(
    *,
    kind: SyncKind,
    new: list[_Entry],
    prev: Mapping[str, _Entry] | None,
    version: int,
    base_version: int | None,
    digest: str,
    base_digest: str | None,
    level: int,
    threads: int,
    chunk_elements: int,
) -> bytes:
    raw_bytes = sum(e.raw.nbytes for e in new)
    header = {
        "kind": kind,
        "version": version,
        "base_version": base_version,
        "digest_algo": _DIGEST_ALGO,
        "digest": digest,
        "base_digest": base_digest,
        "raw_bytes": raw_bytes,
        "chunk_elements": chunk_elements,
        "tensors": [[e.name, str(e.dtype), list(e.shape)] for e in new],
    }
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    out = io.BytesIO()
    out.write(_PREAMBLE.pack(_MAGIC, _FORMAT, len(header_bytes)))
    out.write(header_bytes)

    compressor = _compressor(level, threads).compressobj(size=raw_bytes)
    scratch = np.empty(chunk_elements * max((e.itemsize for e in new), default=1), dtype=np.uint8)
    for e in new:
        base = prev[e.name].raw if prev is not None else None
        for start, stop in _chunks(e.raw.nbytes, e.itemsize, chunk_elements):
            planes_out = scratch[: stop - start].reshape(e.itemsize, -1)
            new_planes = _as_planes(e.raw[start:stop], e.itemsize)
            if base is None:
                np.copyto(planes_out, new_planes)
            else:
                # XOR is bitwise, so the byte-plane XOR equals the XOR of the int32 / int16 / uint8 views.
                np.bitwise_xor(new_planes, _as_planes(base[start:stop], e.itemsize), out=planes_out)
            out.write(compressor.compress(scratch[: stop - start].data))
    out.write(compressor.flush())
    return out.getvalue()


def _check_level(level: int) -> None:
    if not -(1 << 17) <= level <= 22:
        raise ValueError(f"level={level}: zstd levels run from -131072 (fastest) to 22 (smallest)")


def encode_full(
    state: Mapping[str, Tensor],
    *,
    version: int = 0,
    level: int = 3,
    threads: int = -1,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> bytes:
    """Encode the whole ``state`` (name -> tensor of any shape and dtype) as one self-contained blob.

    ``version`` is the policy version the weights belong to (the learner step). ``threads=-1`` uses one zstd
    worker per CPU; 0 compresses on the calling thread.
    """
    _check_level(level)
    entries = _entries(state)
    return _encode(
        kind="full",
        new=entries,
        prev=None,
        version=version,
        base_version=None,
        digest=_digest(entries),
        base_digest=None,
        level=level,
        threads=threads,
        chunk_elements=chunk_elements,
    )


def _check_same_tensors(prev: Mapping[str, _Entry], new: list[_Entry] | SyncHeader, what: str) -> None:
    """Both sides must hold the same names with the same dtypes and shapes."""
    new_meta = [(e.name, e.dtype, e.shape) for e in new] if isinstance(new, list) else list(new.tensors)
    new_names = {name for name, _, _ in new_meta}
    missing = sorted(set(prev) - new_names)
    added = sorted(new_names - set(prev))
    if missing or added:
        raise WeightSyncError(
            f"{what}: tensor names differ; only in the base: {missing[:5]}, only in the new state: {added[:5]}"
        )
    for name, dtype, shape in new_meta:
        base = prev[name]
        if base.dtype != dtype or base.shape != shape:
            raise WeightSyncError(
                f"{what}: tensor {name!r} is {base.dtype} {list(base.shape)} in the base but {dtype} {list(shape)}"
                " in the new state"
            )


def encode_delta(
    prev: Mapping[str, Tensor],
    new: Mapping[str, Tensor],
    level: int = 3,
    *,
    base_version: int = 0,
    version: int | None = None,
    threads: int = -1,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> bytes:
    """Encode ``new`` as the XOR of its bit patterns with those of ``prev``; both need the same names, dtypes, shapes.

    ``base_version`` is the version of ``prev``; ``version`` that of ``new`` (default ``base_version + 1``).
    Raises :class:`WeightSyncError` when the two states do not hold the same tensors.
    """
    _check_level(level)
    prev_entries = _entries(prev)
    new_entries = _entries(new)
    prev_by_name = {e.name: e for e in prev_entries}
    _check_same_tensors(prev_by_name, new_entries, "encode_delta")
    return _encode(
        kind="delta",
        new=new_entries,
        prev=prev_by_name,
        version=base_version + 1 if version is None else version,
        base_version=base_version,
        digest=_digest(new_entries),
        base_digest=_digest(prev_entries),
        level=level,
        threads=threads,
        chunk_elements=chunk_elements,
    )


# --- decoding ------------------------------------------------------------------------------------------------------


def _split(blob: bytes | bytearray | memoryview) -> tuple[SyncHeader, memoryview]:
    view = memoryview(blob)
    if len(view) < _PREAMBLE.size:
        raise WeightSyncError(f"blob of {len(view)} bytes is too short to be a weight-sync blob")
    magic, fmt, header_len = _PREAMBLE.unpack_from(view)
    if magic != _MAGIC:
        raise WeightSyncError("not a weight-sync blob (bad magic bytes)")
    if fmt != _FORMAT:
        raise WeightSyncError(f"blob format {fmt} is not supported (this reader knows format {_FORMAT})")
    end = _PREAMBLE.size + header_len
    try:
        raw: dict[str, Any] = json.loads(bytes(view[_PREAMBLE.size : end]))
        if raw["digest_algo"] != _DIGEST_ALGO:
            raise WeightSyncError(f"blob digest {raw['digest_algo']!r} is not supported")
        header = SyncHeader(
            kind=raw["kind"],
            version=int(raw["version"]),
            base_version=None if raw["base_version"] is None else int(raw["base_version"]),
            digest=str(raw["digest"]),
            base_digest=None if raw["base_digest"] is None else str(raw["base_digest"]),
            raw_bytes=int(raw["raw_bytes"]),
            chunk_elements=int(raw["chunk_elements"]),
            tensors=tuple(
                (str(n), _dtype_from_name(d), tuple(int(s) for s in shape)) for n, d, shape in raw["tensors"]
            ),
        )
    except (ValueError, KeyError, TypeError) as exc:
        if isinstance(exc, WeightSyncError):
            raise
        raise WeightSyncError(f"corrupt weight-sync header: {exc}")
    if header.kind not in ("full", "delta") or header.chunk_elements < 1:
        raise WeightSyncError(f"corrupt weight-sync header: kind={header.kind!r}, chunk={header.chunk_elements}")
    return header, view[end:]


def read_header(blob: bytes | bytearray | memoryview) -> SyncHeader:
    """Parse a blob's header without decompressing its payload."""
    return _split(blob)[0]


def _read_exact(reader: zstandard.ZstdDecompressionReader, out: Bytes1D) -> None:
    view = out.data
    filled = 0
    while filled < len(view):
        n = reader.readinto(view[filled:])
        if not n:
            raise WeightSyncError("weight-sync payload ended early (truncated blob)")
        filled += n


def _decode(
    header: SyncHeader, payload: memoryview, base: Mapping[str, _Entry] | None
) -> tuple[dict[str, Tensor], list[_Entry]]:
    """Rebuild the state a blob describes; ``base`` is the previous state for a delta, None for a full blob."""
    state: dict[str, Tensor] = {}
    entries: list[_Entry] = []
    max_item = max((d.itemsize for _, d, _ in header.tensors), default=1)
    scratch = np.empty(header.chunk_elements * max_item, dtype=np.uint8)
    try:
        with zstandard.ZstdDecompressor().stream_reader(payload, read_across_frames=False) as reader:
            for name, dtype, shape in header.tensors:
                tensor = torch.empty(shape, dtype=dtype)
                data = tensor.reshape(-1).view(torch.uint8).numpy()
                prev = base[name].raw if base is not None else None
                for start, stop in _chunks(data.nbytes, dtype.itemsize, header.chunk_elements):
                    chunk = scratch[: stop - start]
                    _read_exact(reader, chunk)
                    planes = chunk.reshape(dtype.itemsize, -1)
                    out = _as_planes(data[start:stop], dtype.itemsize)
                    if prev is None:
                        np.copyto(out, planes)
                    else:
                        np.bitwise_xor(planes, _as_planes(prev[start:stop], dtype.itemsize), out=out)
                state[name] = tensor
                entries.append(_Entry(name, dtype, tuple(shape), data))
            if reader.read(1):
                raise WeightSyncError("weight-sync payload is longer than its header says (corrupt blob)")
    except zstandard.ZstdError as exc:
        raise WeightSyncError(f"corrupt weight-sync payload: {exc}")
    return state, entries


def _verify(header: SyncHeader, entries: list[_Entry]) -> None:
    got = _digest(entries)
    if got != header.digest:
        raise WeightSyncError(
            f"version {header.version} rebuilt with digest {got[:16]}… but the sender recorded {header.digest[:16]}…;"
            " the base held here differs from the sender's (or the blob is corrupt): request a full sync"
        )


def decode_full(blob: bytes | bytearray | memoryview, *, verify: bool = True) -> dict[str, Tensor]:
    """Decode a full blob into a fresh name -> CPU tensor dict (bit-for-bit the encoded state).

    ``verify`` recomputes the digest of the result and raises :class:`WeightSyncError` if it differs.
    """
    header, payload = _split(blob)
    if header.kind != "full":
        raise WeightSyncError(
            f"decode_full got a delta blob (version {header.base_version} -> {header.version}); use apply_delta"
        )
    state, entries = _decode(header, payload, None)
    if verify:
        _verify(header, entries)
    return state


def _apply(
    header: SyncHeader,
    payload: memoryview,
    base: list[_Entry],
    *,
    base_digest: str | None,
    base_version: int | None,
    verify: bool,
) -> tuple[dict[str, Tensor], list[_Entry]]:
    if header.kind != "delta":
        raise WeightSyncError(f"apply_delta got a full blob (version {header.version}); use decode_full")
    if base_version is not None and base_version != header.base_version:
        raise WeightSyncError(
            f"delta {header.base_version} -> {header.version} cannot apply to version {base_version}:"
            " apply the missing deltas in order or request a full sync"
        )
    base_by_name = {e.name: e for e in base}
    _check_same_tensors(base_by_name, header, f"delta {header.base_version} -> {header.version}")
    if base_digest is not None and base_digest != header.base_digest:
        raise WeightSyncError(
            f"delta {header.base_version} -> {header.version} was computed against a base with digest "
            f"{(header.base_digest or '')[:16]}…, but the base given has digest {base_digest[:16]}…:"
            " wrong base version, or the weights were changed since; request a full sync"
        )
    state, entries = _decode(header, payload, base_by_name)
    if verify:
        _verify(header, entries)
    return state, entries


def apply_delta(
    prev: Mapping[str, Tensor],
    blob: bytes | bytearray | memoryview,
    *,
    base_version: int | None = None,
    verify: bool = True,
) -> dict[str, Tensor]:
    """Rebuild the new state from ``prev`` and a delta blob; ``prev`` is not modified.

    Raises :class:`WeightSyncError` when ``prev`` is not the base the delta was computed against: a different
    version (when ``base_version`` is given), other tensor names, dtypes or shapes, or (with ``verify``) other
    bytes, detected by the base digest before decoding and the result digest after.
    """
    header, payload = _split(blob)
    base = _entries(prev)
    state, _ = _apply(
        header,
        payload,
        base,
        base_digest=_digest(base) if verify else None,
        base_version=base_version,
        verify=verify,
    )
    return state


# --- stateful ends -------------------------------------------------------------------------------------------------


class WeightSyncSender:
    """The learner's end: caches the previous upload and turns each new state into a delta against it.

    The first :meth:`push` (and any with ``full=True``, or after :meth:`reset`) yields a full blob; later ones
    yield a delta whose ``base_version`` is the previous push's version. The cache is a private copy of the
    previous weights' bytes, so the caller may keep training the same tensors in place.
    """

    def __init__(self, *, level: int = 3, threads: int = -1, chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> None:
        _check_level(level)
        self.level = level
        self.threads = threads
        self.chunk_elements = chunk_elements
        self._cache: dict[str, _Entry] | None = None
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
        entries = _entries(state)
        digest = _digest(entries)
        delta = self._cache is not None and not full
        if self._cache is not None and delta:
            _check_same_tensors(self._cache, entries, f"push of version {version}")
        kind: SyncKind = "delta" if delta else "full"
        base_version = self._version if delta else None
        blob = _encode(
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

    def _remember(self, entries: list[_Entry]) -> None:
        """Copy the pushed bytes into the cache, reusing its buffers when the layout is unchanged."""
        cache = self._cache
        if cache is not None and list(cache) == [e.name for e in entries]:
            for e in entries:
                cached = cache[e.name]
                if cached.raw.nbytes == e.raw.nbytes:
                    np.copyto(cached.raw, e.raw)
                    cache[e.name] = _Entry(e.name, e.dtype, e.shape, cached.raw)
                else:
                    cache[e.name] = _Entry(e.name, e.dtype, e.shape, e.raw.copy())
        else:
            self._cache = {e.name: _Entry(e.name, e.dtype, e.shape, e.raw.copy()) for e in entries}


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
        self._entries: list[_Entry] = []
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
        header, payload = _split(blob)
        if header.kind == "full":
            state, entries = _decode(header, payload, None)
            if self.verify:
                _verify(header, entries)
        else:
            if self._state is None:
                raise WeightSyncError(
                    f"delta {header.base_version} -> {header.version} arrived before any full sync: request one"
                )
            state, entries = _apply(
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
