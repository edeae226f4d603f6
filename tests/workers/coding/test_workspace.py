"""workers.coding.workspace: snapshots, copy-on-write workspaces and their forks."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from workers.coding.archive import pack
from workers.coding.patches import apply_patch
from workers.coding.task import SnapshotRef
from workers.coding.workspace import Snapshot, SnapshotError, Workspace

FILES = {
    "pkg/__init__.py": "from .mod import f\n",
    "pkg/mod.py": "def f(x):\n    return x + 1\n",
    "tests/test_mod.py": "from pkg import f\n\ndef test_f():\n    assert f(1) == 2\n",
    "README.md": "# pkg\n",
}


@pytest.fixture
def snapshot() -> Snapshot:
    return Snapshot.from_files(FILES)


def test_a_snapshot_hashes_its_files_and_reads_back_from_its_archive(snapshot: Snapshot, tmp_path: Path) -> None:
    archive = tmp_path / "snap.tar.gz"
    archive.write_bytes(pack(FILES))
    assert Snapshot.from_archive(archive.read_bytes()).sha256 == snapshot.sha256
    loaded = Snapshot.load(SnapshotRef(sha256=snapshot.sha256, uri=str(archive)))
    assert loaded.files == snapshot.files
    assert Snapshot.load(SnapshotRef(sha256=snapshot.sha256, uri="/nowhere")) is loaded  # cached by hash


def test_loading_a_snapshot_whose_archive_changed_names_both_hashes(tmp_path: Path) -> None:
    archive = tmp_path / "snap.tar.gz"
    archive.write_bytes(pack({**FILES, "extra.py": "x = 1\n"}))
    expected = "0" * 64
    with pytest.raises(SnapshotError) as caught:
        Snapshot.load(SnapshotRef(sha256=expected, uri=str(archive)))
    assert expected in str(caught.value) and Snapshot.from_archive(archive.read_bytes()).sha256 in str(caught.value)
    with pytest.raises(SnapshotError, match="has no uri"):
        Snapshot.load(SnapshotRef(sha256="1" * 64))


def test_writes_land_in_the_workspace_and_never_in_the_snapshot(snapshot: Snapshot) -> None:
    ws = Workspace(snapshot)
    ws.write_text("pkg/mod.py", "def f(x):\n    return x + 2\n")
    ws.write_bytes("data/blob.bin", b"\xff\x00")
    assert ws.read_text("pkg/mod.py").endswith("x + 2\n")
    assert snapshot.files["pkg/mod.py"] == FILES["pkg/mod.py"].encode()
    assert ws.changed_paths() == ["data/blob.bin", "pkg/mod.py"]
    with pytest.raises(UnicodeDecodeError, match="'data/blob.bin' is not UTF-8"):
        ws.read_text("data/blob.bin")


def test_forks_are_isolated_both_ways(snapshot: Snapshot) -> None:
    parent = Workspace(snapshot)
    parent.write_text("a.txt", "parent before fork\n")
    child = parent.fork()
    assert child.read_text("a.txt") == "parent before fork\n"
    parent.write_text("a.txt", "parent after fork\n")
    child.write_text("a.txt", "child\n")
    child.write_text("only_child.txt", "c\n")
    parent.delete("README.md")
    assert parent.read_text("a.txt") == "parent after fork\n"
    assert child.read_text("a.txt") == "child\n"
    assert not parent.exists("only_child.txt")
    assert child.exists("README.md") and not parent.exists("README.md")
    sibling = parent.fork()
    assert sibling.read_text("a.txt") == "parent after fork\n" and not sibling.exists("only_child.txt")


def test_delete_then_recreate_and_deleting_what_is_missing(snapshot: Snapshot) -> None:
    ws = Workspace(snapshot)
    ws.delete("pkg/mod.py")
    assert not ws.exists("pkg/mod.py") and "pkg/mod.py" not in ws.list_files()
    with pytest.raises(FileNotFoundError, match="pkg/mod.py"):
        ws.read_bytes("pkg/mod.py")
    with pytest.raises(FileNotFoundError):
        ws.delete("pkg/mod.py")
    fork = ws.fork()
    fork.write_text("pkg/mod.py", FILES["pkg/mod.py"])
    assert fork.changed_paths() == []  # back to the snapshot's content: no change
    assert ws.changed_paths() == ["pkg/mod.py"]
    ws.write_text("new.py", "")
    ws.delete("new.py")
    assert ws.changed_paths() == ["pkg/mod.py"]


def test_listing_merges_layers_and_treats_the_prefix_as_a_directory(snapshot: Snapshot) -> None:
    ws = Workspace(snapshot)
    ws.write_text("pkg2/x.py", "")
    ws.write_text("pkg/new.py", "")
    ws.delete("pkg/__init__.py")
    assert ws.list_files("pkg") == ["pkg/mod.py", "pkg/new.py"]
    assert ws.list_files("pkg/") == ["pkg/mod.py", "pkg/new.py"]
    assert ws.list_files() == ["README.md", "pkg/mod.py", "pkg/new.py", "pkg2/x.py", "tests/test_mod.py"]
    assert ws.is_dir("pkg") and ws.is_dir("") and not ws.is_dir("pkg/mod.py") and not ws.is_dir("nothing")
    assert set(ws.files()) == set(ws.list_files())


def test_paths_are_normalised_and_escapes_refused(snapshot: Snapshot) -> None:
    ws = Workspace(snapshot)
    assert ws.read_text("./pkg//mod.py") == FILES["pkg/mod.py"]
    for bad in ("/etc/passwd", "../outside.py", "pkg/../../x", ""):
        with pytest.raises(ValueError, match="absolute|'\\.\\.'|non-empty"):
            ws.write_text(bad, "x")
    with pytest.raises(ValueError, match="'pkg/mod.py' is a file"):
        ws.write_text("pkg/mod.py/inner.py", "x")
    with pytest.raises(ValueError, match="it is a directory"):
        ws.write_text("pkg", "x")
    with pytest.raises(IsADirectoryError):
        ws.read_bytes("pkg")


def test_diff_round_trips_through_apply_patch(snapshot: Snapshot) -> None:
    ws = Workspace(snapshot)
    ws.write_text("pkg/mod.py", "def f(x):\n    # one more\n    return x + 1\n")
    ws.write_text("pkg/crlf.txt", "a\r\nb\r\nno newline")
    ws.write_text("empty.txt", "")
    ws.delete("README.md")
    patch = ws.diff()
    fresh = Workspace(snapshot)
    assert apply_patch(fresh, patch) == ["README.md", "empty.txt", "pkg/crlf.txt", "pkg/mod.py"]
    assert fresh.files() == ws.files()
    assert ws.lines_changed() == 1 + 3 + 1  # one added line, three new lines, one deleted line
    assert "tests" not in ws.diff(exclude=["pkg/*", "README.md", "empty.txt"])
    assert ws.diff(exclude=["pkg/*", "README.md", "empty.txt"]) == ""


def test_a_deep_fork_chain_stays_correct_and_compact(snapshot: Snapshot) -> None:
    ws = Workspace(snapshot)
    lineage = []
    for generation in range(100):
        ws.write_text("counter.txt", f"{generation}\n")
        ws.write_text(f"gen/{generation}.txt", "x")
        lineage.append(ws)
        ws = ws.fork()
    assert ws.read_text("counter.txt") == "99\n"
    assert len(ws.list_files("gen")) == 100
    assert ws.chain_length <= 17
    assert lineage[10].read_text("counter.txt") == "10\n"
    assert not lineage[10].exists("gen/11.txt")


def test_materialize_writes_the_merged_tree(snapshot: Snapshot, tmp_path: Path) -> None:
    ws = Workspace(snapshot)
    ws.write_text("pkg/deep/new.py", "n = 1\n")
    ws.delete("README.md")
    root = ws.materialize(tmp_path / "tree")
    written = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert written == ws.list_files()
    assert (root / "pkg/deep/new.py").read_text() == "n = 1\n"


def test_fork_of_a_large_repository_is_cheap() -> None:
    big = Snapshot.from_files({f"src/pkg{i // 100}/mod{i}.py": f"x = {i}\n" * 20 for i in range(5000)})
    ws = Workspace(big)
    for i in range(50):
        ws.write_text(f"src/pkg0/mod{i}.py", "changed\n")
    started = time.perf_counter()
    forks = [ws.fork() for _ in range(100)]
    per_fork = (time.perf_counter() - started) / 100
    started = time.perf_counter()
    copied = ws.files()
    copy_time = time.perf_counter() - started
    assert per_fork < 0.005, per_fork  # the target is 50 ms; a fork is microseconds
    assert per_fork * 20 < copy_time or per_fork < 1e-4, (per_fork, copy_time)
    assert forks[-1].read_text("src/pkg0/mod1.py") == "changed\n" and len(copied) == 5000


def test_apply_changes_is_all_or_nothing_and_lets_files_and_directories_trade_places(snapshot: Snapshot) -> None:
    ws = Workspace(snapshot)
    ws.apply_changes(
        {"pkg": b"now a file\n", "pkg/__init__.py": None, "pkg/mod.py": None, "README.md/x": b"x", "README.md": None}
    )
    assert ws.read_text("pkg") == "now a file\n" and ws.read_text("README.md/x") == "x"
    before = ws.files()
    with pytest.raises(ValueError, match="is a file"):
        ws.apply_changes({"fine.py": b"ok", "pkg/inner.py": b"no: pkg is a file"})
    assert ws.files() == before
