"""workers.coding.patches: making and applying unified diffs; git itself is the oracle for the format."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from workers.coding.patches import PatchError, apply_patch, lines_changed, make_patch
from workers.coding.workspace import Snapshot, Workspace

BEFORE = {
    "calc.py": "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(20)),
    "notes.txt": "one\ntwo\nthree",
    "old.txt": "gone\n",
}
AFTER = {
    "calc.py": BEFORE["calc.py"].replace("return x + 3\n", "return x - 3\n").replace("def f17", "def g17"),
    "notes.txt": "one\n2\nthree\n",
    "new/file.py": "print('hi')\n",
}


def _workspace(files: dict[str, str]) -> Workspace:
    return Workspace(Snapshot.from_files(files))


def test_make_patch_then_apply_gives_the_after_files() -> None:
    ws = _workspace(BEFORE)
    touched = apply_patch(ws, make_patch(BEFORE, AFTER))
    assert touched == ["calc.py", "new/file.py", "notes.txt", "old.txt"]
    assert ws.files() == {name: text.encode() for name, text in AFTER.items()}


@pytest.mark.skipif(shutil.which("git") is None, reason="git is the oracle here and is not installed")
def test_git_apply_accepts_our_patches_and_we_accept_gits(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    for name, text in BEFORE.items():
        (repo / name).write_text(text)

    def git(*args: str, stdin: str | None = None) -> str:
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
            cwd=repo,
            input=stdin,
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "before")
    git("apply", "--check", "-", stdin=make_patch(BEFORE, AFTER))  # ours, read by git
    for name in BEFORE:
        (repo / name).unlink()
    for name, text in AFTER.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git("add", "-A")
    theirs = git("diff", "--cached", "-M")  # git's, read by us
    ws = _workspace(BEFORE)
    apply_patch(ws, theirs)
    assert ws.files() == {name: text.encode() for name, text in AFTER.items()}


def test_a_hunk_that_does_not_fit_names_the_file_and_hunk_and_changes_nothing() -> None:
    ws = _workspace(BEFORE)
    ws.write_text("notes.txt", "one\nTWO\nthree")  # the second file's context no longer matches
    before = ws.files()
    with pytest.raises(PatchError, match=r"notes.txt: hunk 1 .* does not apply") as caught:
        apply_patch(ws, make_patch(BEFORE, AFTER))
    assert caught.value.path == "notes.txt" and caught.value.hunk == 1
    assert ws.files() == before  # calc.py, patched first, was not written either


def test_creating_an_existing_file_or_changing_a_missing_one_is_refused() -> None:
    ws = _workspace({**BEFORE, "new/file.py": "exists\n"})
    with pytest.raises(PatchError, match="new/file.py: the patch creates it, but it already exists"):
        apply_patch(ws, make_patch(BEFORE, AFTER))
    with pytest.raises(PatchError, match="calc.py: the patch changes it, but there is no such file"):
        apply_patch(_workspace({"other.py": ""}), make_patch(BEFORE, AFTER))


def test_a_hunk_found_at_an_offset_still_applies_exactly() -> None:
    patch = make_patch({"a.py": "x = 1\ny = 2\nz = 3\n"}, {"a.py": "x = 1\ny = 20\nz = 3\n"})
    ws = _workspace({"a.py": "# header\n# more\nx = 1\ny = 2\nz = 3\n"})
    apply_patch(ws, patch)
    assert ws.read_text("a.py") == "# header\n# more\nx = 1\ny = 20\nz = 3\n"


def test_plain_diff_u_output_with_timestamps_applies() -> None:
    patch = (
        "--- calc.py\t2024-01-01 00:00:00.000000000 +0000\n"
        "+++ calc.py\t2024-01-02 00:00:00.000000000 +0000\n"
        "@@ -1,2 +1,2 @@\n"
        " def f0(x):\n"
        "-    return x + 0\n"
        "+    return x\n"
    )
    ws = _workspace(BEFORE)
    assert apply_patch(ws, patch) == ["calc.py"]
    assert ws.read_text("calc.py").startswith("def f0(x):\n    return x\n")


def test_unreadable_and_binary_patches_are_refused_with_a_reason() -> None:
    ws = _workspace(BEFORE)
    with pytest.raises(PatchError, match="holds no file diff"):
        apply_patch(ws, "just some text\n")
    with pytest.raises(PatchError, match="cut short"):
        apply_patch(ws, "--- a/calc.py\n+++ b/calc.py\n@@ -1,3 +1,3 @@\n def f0(x):\n")
    binary = make_patch({"b.bin": b"\xff\x00"}, {"b.bin": b"\xfe\x00"})
    assert "Binary files a/b.bin and b/b.bin differ" in binary
    with pytest.raises(PatchError, match="binary patch"):
        apply_patch(_workspace({}), binary)
    with pytest.raises(PatchError, match="'\\.\\.'"):
        apply_patch(ws, make_patch({}, {"x": "y\n"}).replace("b/x", "b/../x").replace("a/x", "a/../x"))


def test_lines_changed_counts_added_and_removed_lines() -> None:
    patch = make_patch(BEFORE, AFTER)
    # calc.py: 2 lines replaced (4), notes.txt: "two" and "three" (no newline) replaced (4), old.txt 1, new 1
    assert lines_changed(patch) == 4 + 4 + 1 + 1
    assert make_patch(BEFORE, BEFORE) == ""
