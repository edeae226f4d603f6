"""Copy-on-write workspaces over an immutable repository snapshot.

    snapshot = Snapshot.load(task.snapshot)      # cached per process, hash checked
    ws = Workspace(snapshot)
    ws.write_text("pkg/mod.py", "...")           # lands in the workspace's own layer; the snapshot is untouched
    children = [ws.fork() for _ in range(8)]     # O(1): all G samples of a group start from this state
    ws.diff()                                    # git-style unified diff against the snapshot

Layers. A workspace is a chain: the snapshot at the bottom, then frozen layers (dicts of path -> bytes, or None
for a deleted file) shared with other workspaces, then its own mutable top layer. A read walks the chain from the
top. `fork()` freezes the top layer (when it holds anything) and gives both the parent and the child a new empty
top over the same frozen chain, like a persistent map: no file is copied, and a write in one can never be seen by
the other. When a chain grows past `_MAX_CHAIN` frozen layers (a long run of forks), the workspace merges its own
chain into one frozen layer (O(changed files); the shared layers themselves are never modified).

Paths are relative POSIX paths ("pkg/mod.py"); "./a//b" is read as "a/b"; absolute paths and '..' raise
ValueError naming the path. Directories are implicit: a directory exists while a file lies under it.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from workers.coding.archive import check_tree, content_hash, normalize_path, unpack
from workers.coding.patches import lines_changed, make_patch
from workers.storage import read_bytes

if TYPE_CHECKING:
    from workers.coding.task import SnapshotRef

_MAX_CHAIN = 16
_CACHE_SIZE = 8

_Layer = dict[str, bytes | None]  # None: deleted in this layer


class SnapshotError(ValueError):
    """A snapshot cannot be loaded (no uri, unreadable archive, content hash mismatch)."""


class Snapshot:
    """An immutable map of relative path -> bytes, with its content hash (`archive.content_hash`)."""

    __slots__ = ("_files", "_paths", "_sha256", "_file_hashes", "__weakref__")

    def __init__(self, files: Mapping[str, bytes | str]) -> None:
        checked: dict[str, bytes] = {}
        for name, content in files.items():
            path = normalize_path(name)
            if path in checked:
                raise ValueError(f"path {name!r} repeats {path!r} after normalisation; give each file once")
            checked[path] = content.encode("utf-8") if isinstance(content, str) else bytes(content)
        check_tree(checked)
        self._files: Mapping[str, bytes] = MappingProxyType(checked)
        self._paths: list[str] = sorted(checked)
        self._sha256: str | None = None
        self._file_hashes: dict[str, str] | None = None

    @classmethod
    def from_files(cls, files: Mapping[str, bytes | str]) -> Snapshot:
        return cls(files)

    @classmethod
    def from_archive(cls, data: bytes, *, strip_top: bool = False) -> Snapshot:
        """From a tar, tar.gz or zip archive (checked by `archive.unpack`, which raises ArchiveError)."""
        return cls(unpack(data, strip_top=strip_top))

    @classmethod
    def load(cls, ref: SnapshotRef, *, storage_options: Mapping[str, Any] | None = None) -> Snapshot:
        """The snapshot `ref` names, read from `ref.uri` (a path or storage URI) and checked against `ref.sha256`.

        Cached per process (the last 8 snapshots, by hash), so the many episodes of one task read its archive
        once. Raises SnapshotError when the uri is missing or unreadable or the hash does not match.
        """
        with _cache_lock:
            cached = _cache.get(ref.sha256)
            if cached is not None:
                _cache.move_to_end(ref.sha256)
                return cached
        if not ref.uri:
            raise SnapshotError(f"snapshot {ref.sha256[:12]} has no uri; store its archive and set snapshot.uri")

        try:
            data = read_bytes(ref.uri, dict(storage_options or {}))
        except (OSError, ValueError) as exc:
            raise SnapshotError(f"could not read snapshot {ref.sha256[:12]} from {ref.uri}: {exc}") from None
        snapshot = cls.from_archive(data)
        if snapshot.sha256 != ref.sha256:
            raise SnapshotError(
                f"the archive at {ref.uri} holds files with content hash {snapshot.sha256}, not the {ref.sha256} "
                "the task names; the archive was replaced or the task row is stale"
            )
        with _cache_lock:
            _cache[ref.sha256] = snapshot
            while len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
        return snapshot

    @property
    def sha256(self) -> str:
        if self._sha256 is None:
            self._sha256 = content_hash(self._files)
        return self._sha256

    @property
    def files(self) -> Mapping[str, bytes]:
        """The files (read-only)."""
        return self._files

    @property
    def paths(self) -> list[str]:
        """Every path, sorted (a copy)."""
        return list(self._paths)

    @property
    def size_bytes(self) -> int:
        return sum(len(content) for content in self._files.values())

    def file_sha256(self, path: str) -> str:
        """sha256 hex of one file's content (computed once for all files, then kept)."""
        if self._file_hashes is None:
            self._file_hashes = {name: hashlib.sha256(data).hexdigest() for name, data in self._files.items()}
        return self._file_hashes[path]

    def __len__(self) -> int:
        return len(self._files)

    def __contains__(self, path: object) -> bool:
        return path in self._files

    def __repr__(self) -> str:
        return f"Snapshot({len(self._files)} files, sha256={self.sha256[:12]})"


_cache: OrderedDict[str, Snapshot] = OrderedDict()
_cache_lock = threading.Lock()


class Workspace:
    """A copy-on-write view of a snapshot (see the module docstring). Not thread-safe: one episode, one thread."""

    __slots__ = ("_snapshot", "_frozen", "_top")

    def __init__(self, snapshot: Snapshot, *, _frozen: tuple[Mapping[str, bytes | None], ...] = ()) -> None:
        self._snapshot = snapshot
        self._frozen: tuple[Mapping[str, bytes | None], ...] = _frozen  # oldest first; never modified
        self._top: _Layer = {}

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    # --- reading ---------------------------------------------------------------------------------------------------

    def _lookup(self, path: str) -> bytes | None:
        """The content at a normalised path, None when there is no such file."""
        if path in self._top:
            return self._top[path]
        for layer in reversed(self._frozen):
            if path in layer:
                return layer[path]
        return self._snapshot.files.get(path)

    def read_bytes(self, path: str) -> bytes:
        """Raises FileNotFoundError naming the path (IsADirectoryError for a directory)."""
        normal = normalize_path(path)
        content = self._lookup(normal)
        if content is None:
            if self.is_dir(normal):
                raise IsADirectoryError(f"{path!r} is a directory, not a file")
            raise FileNotFoundError(f"no file {path!r} in the workspace")
        return content

    def read_text(self, path: str) -> str:
        """The file as UTF-8 text; UnicodeDecodeError names the path and the first bad byte's offset."""
        data = self.read_bytes(path)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UnicodeDecodeError(
                exc.encoding, exc.object, exc.start, exc.end, f"{path!r} is not UTF-8 text (byte {exc.start})"
            ) from None

    def exists(self, path: str) -> bool:
        """Whether a file is at `path` (directories: `is_dir`)."""
        return self._lookup(normalize_path(path)) is not None

    def is_dir(self, path: str) -> bool:
        """Whether some file lies under `path` ("" is the root, always a directory)."""
        if path in ("", ".", "./"):
            return True
        prefix = normalize_path(path) + "/"
        overlay = self._overlay()
        for name, content in overlay.items():
            if content is not None and name.startswith(prefix):
                return True
        paths = self._snapshot._paths
        start = bisect.bisect_left(paths, prefix)
        for name in paths[start:]:
            if not name.startswith(prefix):
                break
            if overlay.get(name, b"") is not None:
                return True
        return False

    def _overlay(self) -> dict[str, bytes | None]:
        """Every change against the snapshot, the newest layer winning (O(changed files))."""
        merged: dict[str, bytes | None] = {}
        for layer in self._frozen:
            merged.update(layer)
        merged.update(self._top)
        return merged

    def list_files(self, prefix: str = "") -> list[str]:
        """Sorted paths of the files at or under the directory `prefix` ("" for all; "pkg" lists "pkg/..." but not
        "pkg2/...")."""
        overlay = self._overlay()
        paths = self._snapshot._paths
        if prefix in ("", ".", "./"):
            base: Iterable[str] = paths
            under = ""
        else:
            exact = normalize_path(prefix)
            under = exact + "/"
            start = bisect.bisect_left(paths, exact)
            end = bisect.bisect_left(paths, exact + "0")  # "0" follows "/": the end of "exact/..."
            base = (name for name in paths[start:end] if name == exact or name.startswith(under))
        kept = [name for name in base if overlay.get(name, b"") is not None]
        added = [
            name
            for name, content in overlay.items()
            if content is not None
            and name not in self._snapshot.files
            and (not under or name == under[:-1] or name.startswith(under))
        ]
        if not added:
            return kept
        return sorted([*kept, *added])

    def files(self) -> dict[str, bytes]:
        """The merged tree: path -> content (a new dict; O(files))."""
        merged = dict(self._snapshot.files)
        for name, content in self._overlay().items():
            if content is None:
                merged.pop(name, None)
            else:
                merged[name] = content
        return merged

    def __iter__(self) -> Iterator[str]:
        return iter(self.list_files())

    # --- writing ---------------------------------------------------------------------------------------------------

    def write_bytes(self, path: str, content: bytes) -> None:
        """Create or replace a file. ValueError when `path` is a directory or lies under a file."""
        normal = normalize_path(path)
        if not isinstance(content, bytes | bytearray | memoryview):
            raise TypeError(f"content for {path!r} must be bytes, got {type(content).__name__}")
        self._check_writable(normal)
        self._top[normal] = bytes(content)

    def write_text(self, path: str, text: str) -> None:
        """Create or replace a file with `text` as UTF-8."""
        if not isinstance(text, str):
            raise TypeError(f"text for {path!r} must be str, got {type(text).__name__}")
        self.write_bytes(path, text.encode("utf-8"))

    def _check_writable(self, path: str) -> None:
        if self._lookup(path) is not None:
            return  # replacing a file: its parents are directories already
        parts = path.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if self._lookup(parent) is not None:
                raise ValueError(f"cannot write {path!r}: {parent!r} is a file, not a directory")
        if self.is_dir(path):
            raise ValueError(f"cannot write {path!r}: it is a directory")

    def delete(self, path: str) -> None:
        """Remove a file; FileNotFoundError naming it when there is none."""
        normal = normalize_path(path)
        if self._lookup(normal) is None:
            raise FileNotFoundError(f"no file {path!r} in the workspace")
        if normal in self._snapshot.files or any(normal in layer for layer in self._frozen):
            self._top[normal] = None
        else:
            del self._top[normal]  # only ever written in this layer: forget it

    def apply_changes(self, changes: Mapping[str, bytes | None]) -> None:
        """Write each file (None: delete it, if present). Checked first, so a bad path changes nothing."""
        normals = {normalize_path(path): content for path, content in changes.items()}
        trial = self.fork()
        # Deletions first: a file may give way to a directory of the same name, or the other way round.
        for path, content in sorted(normals.items(), key=lambda item: item[1] is not None):
            if content is None:
                if trial.exists(path):
                    trial.delete(path)
            else:
                trial.write_bytes(path, content)
        self._adopt(trial)

    def _adopt(self, other: Workspace) -> None:
        """Take `other`'s state (a fork of this workspace that is discarded afterwards)."""
        if other._snapshot is not self._snapshot:
            raise ValueError("can only adopt a fork of the same snapshot")
        self._frozen = other._frozen
        self._top = other._top
        other._top = {}
        other._frozen = ()

    # --- forking ---------------------------------------------------------------------------------------------------

    def fork(self) -> Workspace:
        """An independent workspace with this one's current files, in O(1) (amortised O(changed files) when the
        chain is compacted). Later writes to either are invisible to the other."""
        if self._top:
            self._frozen = (*self._frozen, MappingProxyType(self._top))
            self._top = {}
        if len(self._frozen) > _MAX_CHAIN:
            self._frozen = (MappingProxyType(self._overlay()),)
        return Workspace(self._snapshot, _frozen=self._frozen)

    @property
    def chain_length(self) -> int:
        """Frozen layers between this workspace's top and the snapshot (for tests and benchmarks)."""
        return len(self._frozen)

    # --- against the snapshot --------------------------------------------------------------------------------------

    def changes(self) -> dict[str, bytes | None]:
        """Files that differ from the snapshot: path -> new content, None for deleted (sorted by path)."""
        base = self._snapshot.files
        result: dict[str, bytes | None] = {}
        for name, content in sorted(self._overlay().items()):
            if content is None:
                if name in base:
                    result[name] = None
            elif base.get(name) != content:
                result[name] = content
        return result

    def changed_paths(self) -> list[str]:
        """Sorted paths added, modified or deleted against the snapshot."""
        return list(self.changes())

    def diff(self, exclude: Iterable[str] = ()) -> str:
        """A git-style unified diff (a/ and b/ prefixes) from the snapshot to this workspace, "" when equal.

        `exclude`: paths or fnmatch patterns ("tests/*") of files to leave out. `patches.apply_patch` applied to a
        fresh workspace of the same snapshot reproduces this one (text files; binary ones are named, not carried).
        """
        import fnmatch

        patterns = [pattern for pattern in exclude]
        changes = {
            name: content
            for name, content in self.changes().items()
            if not any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)
        }
        before = {name: self._snapshot.files[name] for name in changes if name in self._snapshot.files}
        after = {name: content for name, content in changes.items() if content is not None}
        return make_patch(before, after)

    def lines_changed(self, exclude: Iterable[str] = ()) -> int:
        """Lines added plus lines removed in `diff(exclude)`."""
        return lines_changed(self.diff(exclude))

    # --- disk --------------------------------------------------------------------------------------------------------

    def materialize(self, directory: str | os.PathLike[str]) -> Path:
        """Write the merged tree under `directory` (created when missing); returns it as a Path."""
        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        made: set[str] = set()
        for name, content in self.files().items():
            parent = name.rpartition("/")[0]
            if parent and parent not in made:
                (root / parent).mkdir(parents=True, exist_ok=True)
                made.add(parent)
            (root / name).write_bytes(content)
        return root

    def __repr__(self) -> str:
        return f"Workspace(snapshot={self._snapshot.sha256[:12]}, layers={len(self._frozen)}, top={len(self._top)})"
