"""Unified diffs: make one from two file maps, apply one to a workspace.

    patch = make_patch(before, after)          # git-style: "diff --git a/p b/p", "--- a/p", "+++ b/p", hunks
    touched = apply_patch(workspace, patch)    # every file or nothing; PatchError names the file and the hunk

What `apply_patch` reads: `git diff` output (new files from /dev/null, deleted files, renames with "rename from" /
"rename to", empty new files given by their header alone, "\\ No newline at end of file") and plain `diff -u`
output (timestamps after the names are ignored; the a/ and b/ prefixes are stripped when both names carry them).
Context must match exactly (no fuzz), but a hunk may sit at another line than its header says, as with `git apply`
and `patch`: it is placed at the matching position nearest to the one stated, after the previous hunk. Binary
patches are refused. Nothing here runs `patch` or `git`.

Lines are split on "\\n" only, so a "\\r" stays part of its line and CRLF files round-trip.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from workers.coding.archive import normalize_path

if TYPE_CHECKING:
    from workers.coding.workspace import Workspace

CONTEXT_LINES = 3
_NO_NEWLINE = "\\ No newline at end of file"
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(ValueError):
    """A patch that cannot be read or does not apply; names the file and, where one is at fault, the hunk."""

    def __init__(self, message: str, *, path: str | None = None, hunk: int | None = None) -> None:
        self.path = path
        self.hunk = hunk
        super().__init__(message)


def split_lines(text: str) -> list[str]:
    """Lines with their "\\n" (the last may lack one); only "\\n" separates lines."""
    if not text:
        return []
    lines = text.split("\n")
    result = [line + "\n" for line in lines[:-1]]
    if lines[-1]:
        result.append(lines[-1])
    return result


# --- making ----------------------------------------------------------------------------------------------------------


def _text(content: bytes | str) -> str | None:
    if isinstance(content, str):
        return content
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _range(start: int, count: int) -> str:
    # Unified-diff convention: an empty range is given by the line before it ("-0,0" at the top of a file).
    if count == 0:
        return f"{start},0"
    return f"{start + 1}" if count == 1 else f"{start + 1},{count}"


def _body_line(sign: str, line: str) -> list[str]:
    if line.endswith("\n"):
        return [sign + line]
    return [sign + line + "\n", _NO_NEWLINE + "\n"]


def _hunks(old: list[str], new: list[str]) -> list[str]:
    out: list[str] = []
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for group in matcher.get_grouped_opcodes(CONTEXT_LINES):
        first, last = group[0], group[-1]
        i1, i2, j1, j2 = first[1], last[2], first[3], last[4]
        out.append(f"@@ -{_range(i1, i2 - i1)} +{_range(j1, j2 - j1)} @@\n")
        for tag, a1, a2, b1, b2 in group:
            if tag == "equal":
                for line in old[a1:a2]:
                    out += _body_line(" ", line)
                continue
            for line in old[a1:a2]:
                out += _body_line("-", line)
            for line in new[b1:b2]:
                out += _body_line("+", line)
    return out


def make_patch(before: Mapping[str, bytes | str], after: Mapping[str, bytes | str]) -> str:
    """A git-style unified diff turning the files `before` into the files `after` ("" when equal).

    A path only in `after` is a new file (from /dev/null), one only in `before` a deleted file. Content that is not
    UTF-8 gives git's "Binary files ... differ" line, which `apply_patch` refuses.
    """
    out: list[str] = []
    for path in sorted(set(before) | set(after)):
        old = before.get(path)
        new = after.get(path)
        if old is not None and new is not None and (old == new or _as_bytes(old) == _as_bytes(new)):
            continue
        header = [f"diff --git a/{path} b/{path}\n"]
        if old is None:
            header.append("new file mode 100644\n")
        elif new is None:
            header.append("deleted file mode 100644\n")
        old_text = "" if old is None else _text(old)
        new_text = "" if new is None else _text(new)
        minus = "/dev/null" if old is None else f"a/{path}"
        plus = "/dev/null" if new is None else f"b/{path}"
        if old_text is None or new_text is None:
            out += header
            out.append(f"Binary files {minus} and {plus} differ\n")
            continue
        hunks = _hunks(split_lines(old_text), split_lines(new_text))
        out += header
        if hunks:  # an empty file created or deleted has its header alone, as in git
            out += [f"--- {minus}\n", f"+++ {plus}\n", *hunks]
    return "".join(out)


def _as_bytes(content: bytes | str) -> bytes:
    return content.encode("utf-8") if isinstance(content, str) else content


def lines_changed(patch: str) -> int:
    """Lines added plus lines removed in a unified diff (headers not counted)."""
    count = 0
    for line in split_lines(patch):
        if line.startswith(("+++ ", "--- ")):
            continue
        if line.startswith(("+", "-")):
            count += 1
    return count


# --- reading ---------------------------------------------------------------------------------------------------------


@dataclass
class _Hunk:
    number: int  # 1-based, within its file
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    old: list[str] = field(default_factory=list)  # context and removed lines, as in the old file
    new: list[str] = field(default_factory=list)  # context and added lines, as in the new file


@dataclass
class FilePatch:
    old_path: str | None  # None: created
    new_path: str | None  # None: deleted
    hunks: list[_Hunk] = field(default_factory=list)
    binary: bool = False

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or "?"


def _strip_name(name: str) -> str:
    name = name.rstrip("\n").rstrip("\r")
    if "\t" in name:  # diff -u: "--- a/x.py\t2024-01-01 10:00:00"
        name = name.split("\t", 1)[0]
    if len(name) >= 2 and name[0] == name[-1] == '"':
        # git quotes names with special characters, escaping bytes in octal ("\\303\\251" for "é")
        try:
            name = name[1:-1].encode("latin-1").decode("unicode_escape").encode("latin-1").decode("utf-8")
        except (UnicodeError, ValueError):
            name = name[1:-1]
    return name


def _git_header_paths(line: str) -> tuple[str, str] | None:
    rest = line[len("diff --git ") :].rstrip("\n")
    # "a/X b/X": for equal names the split point is the middle; otherwise the first " b/".
    half = (len(rest) - 1) // 2
    if len(rest) % 2 == 1 and rest[half] == " " and rest[:half][2:] == rest[half + 1 :][2:]:
        return rest[:half], rest[half + 1 :]
    if " b/" in rest:
        old, new = rest.split(" b/", 1)
        return old, "b/" + new
    return None


class _Reader:
    def __init__(self, patch: str) -> None:
        self.lines = split_lines(patch)
        self.index = 0
        self.files: list[FilePatch] = []

    def parse(self) -> list[FilePatch]:
        while self.index < len(self.lines):
            line = self.lines[self.index]
            if line.startswith("diff --git "):
                self._git_file()
            elif line.startswith("--- ") and self._peek(1).startswith("+++ "):
                self._plain_file(None)
            else:
                self.index += 1  # commit messages, "Index:" lines and other text around the diffs
        return self.files

    def _peek(self, offset: int) -> str:
        at = self.index + offset
        return self.lines[at] if at < len(self.lines) else ""

    def _git_file(self) -> None:
        header = self.lines[self.index]
        paths = _git_header_paths(header)
        self.index += 1
        created = deleted = False
        rename_from = rename_to = None
        binary = False
        while self.index < len(self.lines):
            line = self.lines[self.index]
            if line.startswith(("diff --git ", "--- ", "@@")):
                break
            if line.startswith("new file mode"):
                created = True
            elif line.startswith("deleted file mode"):
                deleted = True
            elif line.startswith("rename from "):
                rename_from = _strip_name(line[len("rename from ") :])
            elif line.startswith("rename to "):
                rename_to = _strip_name(line[len("rename to ") :])
            elif line.startswith(("Binary files ", "GIT binary patch")):
                binary = True
            self.index += 1
        if self.index < len(self.lines) and self.lines[self.index].startswith("--- "):
            self._plain_file((created, deleted, rename_from, rename_to))
            return
        # A header alone: an empty file created or deleted, a pure rename, a mode change or a binary file.
        if paths is None:
            raise PatchError(f"cannot read the file names in {header.strip()!r}")
        old = _unprefix(paths[0], "a/")
        new = _unprefix(paths[1], "b/")
        if rename_from and rename_to:
            old, new = rename_from, rename_to
        self.files.append(FilePatch(None if created else old, None if deleted else new, binary=binary))

    def _plain_file(self, git: tuple[bool, bool, str | None, str | None] | None) -> None:
        minus = _strip_name(self.lines[self.index][4:])
        plus = _strip_name(self._peek(1)[4:]) if self._peek(1).startswith("+++ ") else None
        if plus is None:
            raise PatchError(f"line {self.index + 1}: '--- {minus}' is not followed by a '+++' line")
        self.index += 2
        strip = git is not None or (
            (minus == "/dev/null" or minus.startswith("a/")) and (plus == "/dev/null" or plus.startswith("b/"))
        )
        old = None if minus == "/dev/null" else (_unprefix(minus, "a/") if strip else minus)
        new = None if plus == "/dev/null" else (_unprefix(plus, "b/") if strip else plus)
        if git is not None:
            created, deleted, rename_from, rename_to = git
            if created:
                old = None
            if deleted:
                new = None
            if rename_from and rename_to:
                old, new = rename_from, rename_to
        file_patch = FilePatch(old, new)
        while self.index < len(self.lines) and self.lines[self.index].startswith("@@"):
            file_patch.hunks.append(self._hunk(file_patch, len(file_patch.hunks) + 1))
        self.files.append(file_patch)

    def _hunk(self, file_patch: FilePatch, number: int) -> _Hunk:
        header = self.lines[self.index]
        match = _HUNK.match(header)
        if match is None:
            raise PatchError(
                f"{file_patch.path}: hunk {number}: cannot read its header {header.strip()!r}",
                path=file_patch.path,
                hunk=number,
            )
        old_start, new_start = int(match.group(1)), int(match.group(3))
        old_count = 1 if match.group(2) is None else int(match.group(2))
        new_count = 1 if match.group(4) is None else int(match.group(4))
        hunk = _Hunk(number, old_start, old_count, new_start, new_count)
        self.index += 1
        old_left, new_left = old_count, new_count
        last: str | None = None  # the side(s) of the previous line, for "\ No newline at end of file"
        while self.index < len(self.lines) and (old_left > 0 or new_left > 0 or self._at_no_newline()):
            line = self.lines[self.index]
            if line.startswith("\\"):
                if last in (" ", "-") and hunk.old:
                    hunk.old[-1] = hunk.old[-1].removesuffix("\n")
                if last in (" ", "+") and hunk.new:
                    hunk.new[-1] = hunk.new[-1].removesuffix("\n")
                self.index += 1
                continue
            sign, body = line[:1], line[1:]
            if line in ("\n", ""):  # an empty context line whose leading space was lost (editors strip it)
                sign, body = " ", "\n"
            if sign == " ":
                hunk.old.append(body)
                hunk.new.append(body)
                old_left -= 1
                new_left -= 1
            elif sign == "-":
                hunk.old.append(body)
                old_left -= 1
            elif sign == "+":
                hunk.new.append(body)
                new_left -= 1
            else:
                break
            last = sign
            self.index += 1
        if old_left != 0 or new_left != 0:
            raise PatchError(
                f"{file_patch.path}: hunk {number} is cut short: its header {header.strip()!r} announces "
                f"{old_count} old and {new_count} new lines, the body has {old_count - old_left} and "
                f"{new_count - new_left}",
                path=file_patch.path,
                hunk=number,
            )
        return hunk

    def _at_no_newline(self) -> bool:
        return self.index < len(self.lines) and self.lines[self.index].startswith("\\")


def _unprefix(name: str, prefix: str) -> str:
    return name[len(prefix) :] if name.startswith(prefix) else name


def parse_patch(patch: str) -> list[FilePatch]:
    """The file patches of a unified diff, in order; PatchError when it holds none or cannot be read."""
    files = _Reader(patch).parse()
    if not files:
        raise PatchError("the patch holds no file diff ('--- a/path' / '+++ b/path' lines followed by '@@' hunks)")
    return files


# --- applying --------------------------------------------------------------------------------------------------------


def _find(lines: list[str], block: list[str], expected: int, start: int) -> int | None:
    """The index >= start where `block` matches `lines` exactly, nearest to `expected`; None when nowhere."""
    if not block:
        return min(max(expected, start), len(lines))
    last = len(lines) - len(block)
    if last < start:
        return None
    expected = min(max(expected, start), last)
    for distance in range(max(expected - start, last - expected) + 1):
        for at in (expected - distance, expected + distance) if distance else (expected,):
            if start <= at <= last and lines[at : at + len(block)] == block:
                return at
    return None


def _apply_hunks(path: str, text: str, hunks: list[_Hunk]) -> str:
    lines = split_lines(text)
    result: list[str] = []
    position = 0  # lines[:position] are done
    for hunk in hunks:
        expected = hunk.old_start - 1 if hunk.old_count else hunk.old_start
        at = _find(lines, hunk.old, expected, position)
        if at is None:
            shown = next((line for line in hunk.old if line.strip()), hunk.old[0] if hunk.old else "")
            raise PatchError(
                f"{path}: hunk {hunk.number} (@@ -{hunk.old_start},{hunk.old_count} @@) does not apply: its "
                f"{len(hunk.old)} context/removed line(s) starting {shown.rstrip()!r} are not in the file"
                + (" after the previous hunk" if hunk.number > 1 else ""),
                path=path,
                hunk=hunk.number,
            )
        result += lines[position:at]
        result += hunk.new
        position = at + len(hunk.old)
    result += lines[position:]
    return "".join(result)


def apply_patch(workspace: Workspace, patch: str) -> list[str]:
    """Apply a unified diff to `workspace`; returns the paths touched (sorted; both names of a rename).

    All or nothing: the files are worked out first and written in one step, so on a `PatchError` (unreadable
    patch, missing or existing file, a hunk whose context is not found, a binary patch, non-UTF-8 content) the
    workspace is unchanged.
    """
    files = parse_patch(patch)
    state: dict[str, str | None] = {}  # path -> text after the file patches so far (None: deleted)

    def current(path: str) -> str | None:
        if path in state:
            return state[path]
        if not workspace.exists(path):
            return None
        try:
            return workspace.read_text(path)
        except UnicodeDecodeError:
            raise PatchError(f"{path}: the file is not UTF-8 text; a text patch cannot change it", path=path) from None

    for file_patch in files:
        shown = file_patch.path
        if file_patch.binary:
            raise PatchError(f"{shown}: a binary patch; only text patches can be applied", path=shown)
        try:
            old_path = None if file_patch.old_path is None else normalize_path(file_patch.old_path)
            new_path = None if file_patch.new_path is None else normalize_path(file_patch.new_path)
        except ValueError as exc:
            raise PatchError(f"{shown}: {exc}", path=shown) from None
        if old_path is None:
            assert new_path is not None
            if current(new_path) is not None:
                raise PatchError(f"{new_path}: the patch creates it, but it already exists", path=new_path)
            text = ""
        else:
            existing = current(old_path)
            if existing is None:
                raise PatchError(f"{old_path}: the patch changes it, but there is no such file", path=old_path)
            text = existing
        new_text = _apply_hunks(new_path or old_path or shown, text, file_patch.hunks)
        if new_path is None:
            if new_text:
                raise PatchError(
                    f"{old_path}: the patch deletes it, but the file holds more than the patch removes",
                    path=old_path,
                )
            assert old_path is not None
            state[old_path] = None
            continue
        if old_path is not None and old_path != new_path:
            if current(new_path) is not None:
                raise PatchError(f"{new_path}: the patch renames {old_path} to it, but it exists", path=new_path)
            state[old_path] = None
        state[new_path] = new_text
    changes = {path: (None if text is None else text.encode("utf-8")) for path, text in state.items()}
    try:
        workspace.apply_changes(changes)
    except (ValueError, FileNotFoundError) as exc:
        raise PatchError(f"the patch cannot be written: {exc}") from None
    return sorted(changes)
