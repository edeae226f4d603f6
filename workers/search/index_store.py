"""Search indexes in object storage: `save_index` uploads an index directory to any fsspec URL (manifest last),
`load_index` loads one once per process from a local copy kept under `index_cache_dir` (a file lock lets one
actor of a node copy while the others wait). The index itself is `workers.search.index.SearchIndex`."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import fsspec

from workers.search.index import MANIFEST, SearchIndex

_loaded: dict[str, SearchIndex] = {}
_loading = threading.Lock()


def index_cache_dir(uri: str) -> Path:
    """Where `load_index` keeps a local copy of `uri`: $CRUCIBLE_INDEX_CACHE (default ~/.cache/crucible/indexes)
    / sha256(uri)[:24]."""
    root = os.environ.get("CRUCIBLE_INDEX_CACHE") or str(Path.home() / ".cache" / "crucible" / "indexes")
    return Path(root).expanduser() / hashlib.sha256(uri.encode()).hexdigest()[:24]


def save_index(index: SearchIndex, uri: str, storage_options: dict[str, Any] | None = None) -> None:
    """Upload the index directory to `uri` (file://, s3://, any fsspec URL); manifest.json goes last, so a
    half-written upload never looks like an index."""
    fs, root = fsspec.core.url_to_fs(uri, **(storage_options or {}))
    root = root.rstrip("/")
    with tempfile.TemporaryDirectory(prefix="crucible-index-") as tmp:
        index.save(tmp)
        local = Path(tmp)
        files = sorted(p for p in local.rglob("*") if p.is_file() and p.name != MANIFEST)
        for path in [*files, local / MANIFEST]:
            target = f"{root}/{path.relative_to(local).as_posix()}"
            parent = target.rsplit("/", 1)[0]
            fs.makedirs(parent, exist_ok=True)
            fs.put_file(str(path), target)


def _download(fs: Any, root: str, target: Path) -> None:
    staging = Path(tempfile.mkdtemp(prefix=".incoming-", dir=target.parent))
    try:
        for remote in fs.find(root):
            relative = remote[len(root) :].lstrip("/")
            local = staging / relative
            local.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(remote, str(local))
        if not (staging / MANIFEST).is_file():
            raise FileNotFoundError(f"no search index at {root} ({MANIFEST} is missing)")
        shutil.rmtree(target, ignore_errors=True)
        # A rename, so another process never loads a half-copied directory.
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def load_index(uri: str, storage_options: dict[str, Any] | None = None) -> SearchIndex:
    """The index saved at `uri`, loaded once per process (later calls return the same object). A local copy is
    kept in `index_cache_dir(uri)` and reused while its manifest matches the stored one."""
    with _loading:
        if uri in _loaded:
            return _loaded[uri]
        fs, root = fsspec.core.url_to_fs(uri, **(storage_options or {}))
        root = root.rstrip("/")
        try:
            with fs.open(f"{root}/{MANIFEST}", "rb") as handle:
                remote_manifest = handle.read()
        except FileNotFoundError:
            raise FileNotFoundError(f"no search index at {uri} ({MANIFEST} is missing): build it first") from None
        target = index_cache_dir(uri)
        target.parent.mkdir(parents=True, exist_ok=True)
        # The actors of one node start together: a file lock lets one of them copy while the others wait.
        with open(target.parent / f"{target.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            local_manifest = target / MANIFEST
            # A URI can be reused (a reset database hands out run ids again): the manifest tells a stale copy.
            if not local_manifest.is_file() or local_manifest.read_bytes() != remote_manifest:
                _download(fs, root, target)
            index = SearchIndex.load(target)
        _loaded[uri] = index
        return index
