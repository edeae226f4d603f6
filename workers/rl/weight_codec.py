"""The weight-sync codec (docs/methods.md C5): full snapshots and XOR deltas of a state dict as byte-plane zstd
blobs with a JSON header and SHA-256 digests. `workers.rl.weightsync` explains the design and holds the two
stateful ends (sender and receiver) that use it; import the codec's public names from there.
"""

from __future__ import annotations

import hashlib
import io
import json
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch
import zstandard
from torch import Tensor

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
class Entry:
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


def entries_of(state: Mapping[str, Tensor]) -> list[Entry]:
    out: list[Entry] = []
    for name, tensor in state.items():
        if not isinstance(name, str):
            raise WeightSyncError(f"state keys must be strings, got {name!r}")
        out.append(Entry(name, tensor.dtype, tuple(tensor.shape), _tensor_bytes(name, tensor)))
    return out


def digest_of(entries: list[Entry]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in order."""
    h = hashlib.new(_DIGEST_ALGO)
    for e in entries:
        h.update(json.dumps([e.name, str(e.dtype), list(e.shape)]).encode())
        h.update(e.raw.data)
    return h.hexdigest()


def state_digest(state: Mapping[str, Tensor]) -> str:
    """The digest a blob records for ``state`` (hex SHA-256 of names, dtypes, shapes and raw bytes)."""
    return digest_of(entries_of(state))


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


def encode(
    *,
    kind: SyncKind,
    new: list[Entry],
    prev: Mapping[str, Entry] | None,
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


def check_level(level: int) -> None:
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
    check_level(level)
    entries = entries_of(state)
    return encode(
        kind="full",
        new=entries,
        prev=None,
        version=version,
        base_version=None,
        digest=digest_of(entries),
        base_digest=None,
        level=level,
        threads=threads,
        chunk_elements=chunk_elements,
    )


def check_same_tensors(prev: Mapping[str, Entry], new: list[Entry] | SyncHeader, what: str) -> None:
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
    check_level(level)
    prev_entries = entries_of(prev)
    new_entries = entries_of(new)
    prev_by_name = {e.name: e for e in prev_entries}
    check_same_tensors(prev_by_name, new_entries, "encode_delta")
    return encode(
        kind="delta",
        new=new_entries,
        prev=prev_by_name,
        version=base_version + 1 if version is None else version,
        base_version=base_version,
        digest=digest_of(new_entries),
        base_digest=digest_of(prev_entries),
        level=level,
        threads=threads,
        chunk_elements=chunk_elements,
    )


# --- decoding ------------------------------------------------------------------------------------------------------


def split_blob(blob: bytes | bytearray | memoryview) -> tuple[SyncHeader, memoryview]:
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
    return split_blob(blob)[0]


def _read_exact(reader: zstandard.ZstdDecompressionReader, out: Bytes1D) -> None:
    view = out.data
    filled = 0
    while filled < len(view):
        n = reader.readinto(view[filled:])
        if not n:
            raise WeightSyncError("weight-sync payload ended early (truncated blob)")
        filled += n


def decode(
    header: SyncHeader, payload: memoryview, base: Mapping[str, Entry] | None
) -> tuple[dict[str, Tensor], list[Entry]]:
    """Rebuild the state a blob describes; ``base`` is the previous state for a delta, None for a full blob."""
    state: dict[str, Tensor] = {}
    entries: list[Entry] = []
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
                entries.append(Entry(name, dtype, tuple(shape), data))
            if reader.read(1):
                raise WeightSyncError("weight-sync payload is longer than its header says (corrupt blob)")
    except zstandard.ZstdError as exc:
        raise WeightSyncError(f"corrupt weight-sync payload: {exc}")
    return state, entries


def verify_digest(header: SyncHeader, entries: list[Entry]) -> None:
    got = digest_of(entries)
    if got != header.digest:
        raise WeightSyncError(
            f"version {header.version} rebuilt with digest {got[:16]}… but the sender recorded {header.digest[:16]}…;"
            " the base held here differs from the sender's (or the blob is corrupt): request a full sync"
        )


def decode_full(blob: bytes | bytearray | memoryview, *, verify: bool = True) -> dict[str, Tensor]:
    """Decode a full blob into a fresh name -> CPU tensor dict (bit-for-bit the encoded state).

    ``verify`` recomputes the digest of the result and raises :class:`WeightSyncError` if it differs.
    """
    header, payload = split_blob(blob)
    if header.kind != "full":
        raise WeightSyncError(
            f"decode_full got a delta blob (version {header.base_version} -> {header.version}); use apply_delta"
        )
    state, entries = decode(header, payload, None)
    if verify:
        verify_digest(header, entries)
    return state


def apply(
    header: SyncHeader,
    payload: memoryview,
    base: list[Entry],
    *,
    base_digest: str | None,
    base_version: int | None,
    verify: bool,
) -> tuple[dict[str, Tensor], list[Entry]]:
    if header.kind != "delta":
        raise WeightSyncError(f"apply_delta got a full blob (version {header.version}); use decode_full")
    if base_version is not None and base_version != header.base_version:
        raise WeightSyncError(
            f"delta {header.base_version} -> {header.version} cannot apply to version {base_version}:"
            " apply the missing deltas in order or request a full sync"
        )
    base_by_name = {e.name: e for e in base}
    check_same_tensors(base_by_name, header, f"delta {header.base_version} -> {header.version}")
    if base_digest is not None and base_digest != header.base_digest:
        raise WeightSyncError(
            f"delta {header.base_version} -> {header.version} was computed against a base with digest "
            f"{(header.base_digest or '')[:16]}…, but the base given has digest {base_digest[:16]}…:"
            " wrong base version, or the weights were changed since; request a full sync"
        )
    state, entries = decode(header, payload, base_by_name)
    if verify:
        verify_digest(header, entries)
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
    header, payload = split_blob(blob)
    base = entries_of(prev)
    state, _ = apply(
        header,
        payload,
        base,
        base_digest=digest_of(base) if verify else None,
        base_version=base_version,
        verify=verify,
    )
    return state
