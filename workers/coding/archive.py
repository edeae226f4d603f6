"""Repository snapshots as archives: a canonical tar.gz to store, a safe reader for what users upload.

    data = pack({"pkg/__init__.py": "x = 1\\n"})   # equal files -> equal bytes (sorted, mtime 0, uid 0, mode 0644)
    files = unpack(data)                            # {"pkg/__init__.py": b"x = 1\\n"}; tar, tar.gz or zip
    digest = content_hash(files)                    # sha256 over the files, whatever archive carried them

`unpack` never writes to disk and refuses, with an `ArchiveError` naming the member:
- absolute paths and paths with a '..' component (a zip or tar "slip");
- anything that is not a regular file or a directory: device, fifo and character/block members, and every
  symbolic or hard link. Policy: links are refused even when their target stays inside the tree, because a
  snapshot is a plain map of path -> bytes (no link survives `pack`, a workspace or the sandbox copy); the message
  says whether the link also leaves the tree and that a copy of the target is the fix;
- more than `max_files` files, a file over `max_file_bytes`, more than `max_bytes` in all: checked against each
  member's declared size before it is read and again while reading it in chunks, so a bomb (a few KiB of gzip or
  deflate that expands to gigabytes, or a zip entry that lies about its size) is stopped after at most a cap's
  worth of output, never read whole;
- two members with the same name, a file that is also a directory of another member, names that are not UTF-8.

A directory member adds nothing (the files under it carry their paths). With `strip_top=True` one top-level
directory shared by every member (an sdist's `foo-1.0/`) is removed from the paths; an archive without one is
returned unchanged.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from typing import IO

MiB = 1024 * 1024
MAX_FILES = 20_000
MAX_BYTES = 256 * MiB
MAX_FILE_BYTES = 16 * MiB

_CHUNK = 1024 * 1024
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
_GZIP_MAGIC = b"\x1f\x8b"


class ArchiveError(ValueError):
    """An archive that cannot be accepted; the message names the member and the reason."""

    def __init__(self, reason: str, *, member: str | None = None) -> None:
        self.reason = reason
        self.member = member
        super().__init__(reason)


def _as_bytes(content: bytes | str) -> bytes:
    return content.encode("utf-8") if isinstance(content, str) else bytes(content)


def content_hash(files: Mapping[str, bytes | str]) -> str:
    """sha256 hex over the files: for each path in sorted order, `path NUL sha256(content) LF`.

    Independent of the archive's bytes (compression, order, timestamps): two archives of the same files hash alike.
    Text is hashed as its UTF-8 bytes.
    """
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.encode("utf-8", "surrogateescape"))
        digest.update(b"\0")
        digest.update(hashlib.sha256(_as_bytes(files[path])).hexdigest().encode())
        digest.update(b"\n")
    return digest.hexdigest()


def pack(files: Mapping[str, bytes | str]) -> bytes:
    """A canonical tar.gz of `files` (relative path -> content; text is stored as UTF-8).

    Deterministic: members in sorted path order, regular files only (no directory entries), mtime 0, uid/gid 0, no
    user or group names, mode 0644, PAX format, a gzip header with mtime 0 and no file name. Raises ValueError for
    a path that is absolute, contains '..', or repeats another after normalisation.
    """
    checked: dict[str, bytes] = {}
    for name, content in files.items():
        path = normalize_path(name)
        if path in checked:
            raise ValueError(f"path {name!r} repeats {path!r} after normalisation; give each file once")
        checked[path] = _as_bytes(content)
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=6) as compressed:
        with tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(checked):
                data = checked[path]
                info = tarfile.TarInfo(path)
                info.size = len(data)
                info.mtime = 0
                info.mode = 0o644
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.type = tarfile.REGTYPE
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def normalize_path(name: str) -> str:
    """`name` as a relative POSIX path without '.' or empty components ("./a//b" -> "a/b").

    Raises ValueError naming the path when it is empty, absolute, or has a '..' component.
    """
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ValueError(f"path {name!r} must be a non-empty relative path")
    if name.startswith("/"):
        raise ValueError(f"path {name!r} is absolute; give it relative to the repository root")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"path {name!r} contains '..'; give a path inside the repository")
    if not parts:
        raise ValueError(f"path {name!r} names no file")
    return "/".join(parts)


class _Limits:
    """The caps of one unpack, with running totals."""

    def __init__(self, max_files: int, max_bytes: int, max_file_bytes: int) -> None:
        self.max_files = max_files
        self.max_bytes = max_bytes
        self.max_file_bytes = max_file_bytes
        self.files = 0
        self.bytes = 0

    def admit(self, member: str, declared: int) -> None:
        self.files += 1
        if self.files > self.max_files:
            raise ArchiveError(
                f"more than {self.max_files} files (member {member!r} is one too many); split the repository or "
                "raise the limit",
                member=member,
            )
        self._check_size(member, declared)

    def _check_size(self, member: str, size: int) -> None:
        if size > self.max_file_bytes:
            raise ArchiveError(
                f"member {member!r} is {size} bytes, over the {self.max_file_bytes}-byte limit of one file",
                member=member,
            )
        if self.bytes + size > self.max_bytes:
            raise ArchiveError(f"member {member!r} takes the archive over {self.max_bytes} bytes in all", member=member)

    def read(self, member: str, stream: IO[bytes]) -> bytes:
        """Read a member in chunks, stopping as soon as it passes a cap (a bomb never expands further)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = stream.read(_CHUNK)
            if not chunk:
                break
            size += len(chunk)
            self._check_size(member, size)
            chunks.append(chunk)
        self.bytes += size
        return b"".join(chunks)


def unpack(
    data: bytes,
    *,
    max_files: int = MAX_FILES,
    max_bytes: int = MAX_BYTES,
    max_file_bytes: int = MAX_FILE_BYTES,
    strip_top: bool = False,
) -> dict[str, bytes]:
    """The files of a tar, tar.gz (or other compression tarfile reads) or zip archive: relative path -> bytes.

    Raises `ArchiveError` for anything listed in the module docstring. Sizes are bytes of uncompressed content.
    """
    limits = _Limits(max_files, max_bytes, max_file_bytes)
    if data.startswith(_ZIP_MAGICS):
        members = _unpack_zip(data, limits)
    else:
        members = _unpack_tar(data, limits)
    files: dict[str, bytes] = {}
    for name, content in members:
        if name in files:
            raise ArchiveError(f"member {name!r} appears twice in the archive; keep one", member=name)
        files[name] = content
    check_tree(files)
    if strip_top:
        files = _strip_top(files)
    return files


def _member_path(raw: str) -> str:
    """The member's normalised path, or ArchiveError naming it."""
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        shown = raw.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise ArchiveError(f"member name {shown!r} is not UTF-8; rename it", member=shown) from None
    if not raw or "\x00" in raw:
        raise ArchiveError(f"member name {raw!r} is empty or holds a NUL byte", member=raw)
    if raw.startswith("/") or (len(raw) > 1 and raw[1] == ":" and raw[0].isalpha()):
        raise ArchiveError(f"member {raw!r} has an absolute path; archive paths relative to the root", member=raw)
    parts = [part for part in raw.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise ArchiveError(f"member {raw!r} has a '..' component (it would land outside the tree)", member=raw)
    return "/".join(parts)


def _link_error(name: str, target: str, kind: str) -> ArchiveError:
    base = name.rsplit("/", 1)[0] if "/" in name else ""
    leaves = target.startswith("/") or _climbs_out(base, target)
    where = "leaves the tree" if leaves else "stays inside the tree, but links are not accepted either"
    return ArchiveError(
        f"member {name!r} is a {kind} to {target!r}, which {where}: a snapshot holds regular files only; replace the "
        "link with a copy of its target",
        member=name,
    )


def _climbs_out(base: str, target: str) -> bool:
    depth = len([part for part in base.split("/") if part])
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part not in ("", "."):
            depth += 1
    return False


def _tar_members(tar: tarfile.TarFile, limits: _Limits) -> Iterator[tuple[str, bytes]]:
    for member in tar:
        name = _member_path(member.name)
        if member.isdir():
            continue
        if member.issym():
            raise _link_error(name, member.linkname, "symbolic link")
        if member.islnk():
            raise _link_error(name, member.linkname, "hard link")
        if member.ischr() or member.isblk():
            raise ArchiveError(f"member {name!r} is a device file; a snapshot holds regular files only", member=name)
        if member.isfifo():
            raise ArchiveError(f"member {name!r} is a FIFO; a snapshot holds regular files only", member=name)
        if not member.isreg() or member.issparse():
            raise ArchiveError(
                f"member {name!r} is not a regular file (tar type {member.type!r}); a snapshot holds regular files "
                "only",
                member=name,
            )
        if not name:
            raise ArchiveError(f"member {member.name!r} names no file", member=member.name)
        limits.admit(name, member.size)
        stream = tar.extractfile(member)
        if stream is None:  # pragma: no cover - a regular member always has a stream
            raise ArchiveError(f"member {name!r} could not be read", member=name)
        yield name, limits.read(name, stream)


def _unpack_tar(data: bytes, limits: _Limits) -> list[tuple[str, bytes]]:
    try:
        # "r|*": one pass over the stream (gzip, bz2, xz or none), never seeking back; a member's data is only
        # decompressed once its declared size has passed the caps.
        with tarfile.open(fileobj=io.BytesIO(data), mode="r|*", encoding="utf-8", errors="surrogateescape") as tar:
            return list(_tar_members(tar, limits))
    except ArchiveError:
        raise
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        kind = "a gzip stream" if data.startswith(_GZIP_MAGIC) else "a tar or zip archive"
        raise ArchiveError(f"not {kind} that can be read: {exc}") from None


_S_IFMT = 0o170000


def _unpack_zip(data: bytes, limits: _Limits) -> list[tuple[str, bytes]]:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise ArchiveError(f"not a zip archive that can be read: {exc}") from None
    members: list[tuple[str, bytes]] = []
    with archive:
        for info in archive.infolist():
            name = _member_path(_zip_name(info))
            mode = info.external_attr >> 16
            file_type = mode & _S_IFMT
            if info.is_dir() or file_type == stat.S_IFDIR:
                continue
            if file_type == stat.S_IFLNK:
                target = archive.read(info)[:4096].decode("utf-8", "replace")
                raise _link_error(name, target, "symbolic link")
            if file_type not in (0, stat.S_IFREG):
                raise ArchiveError(
                    f"member {name!r} is not a regular file (mode {oct(mode)}); a snapshot holds regular files only",
                    member=name,
                )
            if info.flag_bits & 0x1:
                raise ArchiveError(f"member {name!r} is encrypted; upload an unencrypted archive", member=name)
            limits.admit(name, info.file_size)
            try:
                with archive.open(info) as stream:
                    members.append((name, limits.read(name, stream)))
            except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, zlib.error) as exc:
                raise ArchiveError(f"member {name!r} could not be read: {exc}", member=name) from None
    return members


def _zip_name(info: zipfile.ZipInfo) -> str:
    """The member's name as UTF-8: flag bit 11 says so; otherwise zipfile decoded cp437, and many tools wrote UTF-8
    without the flag, so the raw bytes are tried as UTF-8 and refused when they are not."""
    if info.flag_bits & 0x800:
        return info.filename
    try:
        raw = info.filename.encode("cp437")
    except UnicodeEncodeError:
        return info.filename
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        shown = raw.decode("utf-8", "backslashreplace")
        raise ArchiveError(f"member name {shown!r} is not UTF-8; rename it", member=shown) from None


def check_tree(files: Mapping[str, object]) -> None:
    """No file may also be a directory of another (`a` and `a/b`): such a tree cannot be written to disk.
    Raises ArchiveError (a ValueError) naming both paths."""
    for name in files:
        parts = name.split("/")
        for depth in range(1, len(parts)):
            prefix = "/".join(parts[:depth])
            if prefix in files:
                raise ArchiveError(f"path {name!r} lies under {prefix!r}, which is also a file", member=name)


def _strip_top(files: dict[str, bytes]) -> dict[str, bytes]:
    tops = {name.split("/", 1)[0] for name in files}
    if len(tops) != 1 or any("/" not in name for name in files):
        return files
    (top,) = tops
    return {name[len(top) + 1 :]: content for name, content in files.items()}
