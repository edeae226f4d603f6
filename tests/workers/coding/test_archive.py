"""workers.coding.archive: canonical packing, and every way an uploaded archive may try to escape or explode."""

from __future__ import annotations

import gzip
import io
import tarfile
import zipfile

import pytest

from workers.coding.archive import ArchiveError, content_hash, pack, unpack

FILES = {"pkg/__init__.py": "x = 1\n", "pkg/mod.py": b"def f():\n    return 2\n", "README.md": "héllo\n"}


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]], *, compress: bool = True) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if compress else "w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _special(name: str, kind: bytes, target: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, None


def _zip(entries: dict[str, bytes], *, symlink: str | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
        if symlink is not None:
            info = zipfile.ZipInfo("link")
            info.external_attr = 0o120777 << 16
            archive.writestr(info, symlink)
    return buffer.getvalue()


def test_pack_and_unpack_round_trip_the_files_as_bytes() -> None:
    assert unpack(pack(FILES)) == {
        "pkg/__init__.py": b"x = 1\n",
        "pkg/mod.py": b"def f():\n    return 2\n",
        "README.md": "héllo\n".encode(),
    }


def test_pack_is_deterministic_whatever_the_insertion_order() -> None:
    reordered = dict(reversed(list(FILES.items())))
    assert pack(FILES) == pack(reordered)
    with tarfile.open(fileobj=io.BytesIO(pack(FILES)), mode="r:gz") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == sorted(FILES)
    assert {(m.mtime, m.uid, m.gid, m.mode, m.uname) for m in members} == {(0, 0, 0, 0o644, "")}
    assert gzip.decompress(pack(FILES))  # a plain gzip stream
    assert pack(FILES)[4:8] == b"\0\0\0\0"  # gzip header mtime 0


def test_content_hash_depends_on_files_not_on_the_archive() -> None:
    as_zip = _zip({name: content.encode() if isinstance(content, str) else content for name, content in FILES.items()})
    assert content_hash(unpack(as_zip)) == content_hash(unpack(pack(FILES))) == content_hash(FILES)
    assert content_hash(FILES) != content_hash({**FILES, "pkg/mod.py": b"changed"})
    assert content_hash({"a": b"bc"}) != content_hash({"ab": b"c"})


def test_pack_refuses_paths_that_leave_the_tree() -> None:
    with pytest.raises(ValueError, match="absolute"):
        pack({"/etc/passwd": "x"})
    with pytest.raises(ValueError, match=r"'\.\.'"):
        pack({"a/../../b": "x"})


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ([_file("/etc/cron.d/evil")], "absolute path"),
        ([_file("pkg/../../evil.py")], "'..' component"),
        ([_special("dev/sda", tarfile.BLKTYPE)], "device file"),
        ([_special("dev/tty", tarfile.CHRTYPE)], "device file"),
        ([_special("pipe", tarfile.FIFOTYPE)], "FIFO"),
        ([_special("escape", tarfile.SYMTYPE, "../../etc/passwd")], "leaves the tree"),
        ([_special("abs", tarfile.SYMTYPE, "/etc/passwd")], "leaves the tree"),
        ([_file("a.py"), _special("inside", tarfile.SYMTYPE, "a.py")], "stays inside the tree"),
        ([_file("a.py"), _special("hard", tarfile.LNKTYPE, "a.py")], "hard link"),
        ([_file("same.py"), _file("same.py")], "appears twice"),
        ([_file("a"), _file("a/b")], "also a file"),
    ],
)
def test_unpack_refuses_a_dangerous_tar_member_and_names_it(members: list, message: str) -> None:
    with pytest.raises(ArchiveError, match=message) as caught:
        unpack(_tar(members))
    assert caught.value.member


def test_unpack_refuses_a_zip_slip_and_a_zip_symlink() -> None:
    with pytest.raises(ArchiveError, match=r"'\.\.' component"):
        unpack(_zip({"../evil.py": b"x"}))
    with pytest.raises(ArchiveError, match="absolute path"):
        unpack(_zip({"/abs.py": b"x"}))
    with pytest.raises(ArchiveError, match="symbolic link to '/etc/passwd', which leaves the tree"):
        unpack(_zip({}, symlink="/etc/passwd"))


def test_unpack_refuses_a_non_utf8_name() -> None:
    info = tarfile.TarInfo("caf\udce9.py")  # the byte 0xe9 alone, as surrogateescape carries it
    buffer = io.BytesIO()
    with tarfile.open(
        fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT, encoding="utf-8", errors="surrogateescape"
    ) as tar:
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(ArchiveError, match="not UTF-8"):
        unpack(buffer.getvalue())


def test_unpack_stops_a_gzip_bomb_before_expanding_it() -> None:
    # 64 MiB of zeros compress to ~64 KiB; the 16 MiB per-file cap refuses it from the declared size.
    bomb = _tar([_file("zeros.bin", bytes(64 * 1024 * 1024))])
    assert len(bomb) < 200_000
    with pytest.raises(ArchiveError, match="over the 16777216-byte limit"):
        unpack(bomb)


def test_unpack_stops_a_zip_entry_that_lies_about_its_size() -> None:
    # A deflated entry whose central directory claims 10 bytes but which expands to 8 MiB: it is read in capped
    # chunks, never whole, and refused (zipfile stops at the declared size, and the CRC then fails).
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("big.bin", bytes(8 * 1024 * 1024))
    data = bytearray(buffer.getvalue())
    central = data.rfind(b"PK\x01\x02")
    data[central + 24 : central + 28] = (10).to_bytes(4, "little")  # uncompressed size in the central directory
    with pytest.raises(ArchiveError):
        unpack(bytes(data), max_file_bytes=1024 * 1024)


def test_unpack_enforces_the_file_count_and_total_size() -> None:
    many = {f"f{i}.txt": b"x" for i in range(11)}
    with pytest.raises(ArchiveError, match="more than 10 files"):
        unpack(pack(many), max_files=10)
    with pytest.raises(ArchiveError, match="over 100 bytes in all"):
        unpack(pack({"a": bytes(60), "b": bytes(60)}), max_bytes=100)


def test_unpack_strips_one_top_directory_only_when_asked() -> None:
    sdist = pack({"foo-1.0/setup.py": "", "foo-1.0/foo/__init__.py": ""})
    assert set(unpack(sdist)) == {"foo-1.0/setup.py", "foo-1.0/foo/__init__.py"}
    assert set(unpack(sdist, strip_top=True)) == {"setup.py", "foo/__init__.py"}
    flat = pack({"setup.py": "", "foo/__init__.py": ""})
    assert set(unpack(flat, strip_top=True)) == {"setup.py", "foo/__init__.py"}


def test_unpack_reads_plain_tar_and_skips_directory_members() -> None:
    directory = tarfile.TarInfo("pkg")
    directory.type = tarfile.DIRTYPE
    data = _tar([(directory, None), _file("pkg/a.py", b"a")], compress=False)
    assert unpack(data) == {"pkg/a.py": b"a"}


def test_unpack_names_garbage_as_unreadable() -> None:
    with pytest.raises(ArchiveError, match="can be read"):
        unpack(b"\x1f\x8bthis is not gzip")
    with pytest.raises(ArchiveError, match="can be read"):
        unpack(b"PK\x03\x04 truncated zip")
