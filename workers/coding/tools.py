"""The coding agent's six tools (`workers.coding.environment`): what each does to the episode's workspace, the
limits on what it shows, and the episode state they keep. `CodingAgentEnv` inherits `CodingTools` and holds the
workspace, the limits and the state; the tool specs and the dispatch stay with it."""

from __future__ import annotations

import difflib
import time
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from workers.coding.archive import normalize_path
from workers.coding.execute import CommandLimits, run_command
from workers.coding.workspace import Snapshot, Workspace
from workers.envs.base import ToolError
from workers.envs.grep import GrepError, compile_pattern

LIST_TOOL, READ_TOOL, SEARCH_TOOL, EDIT_TOOL, RUN_TOOL, FINISH_TOOL = (
    "list_files",
    "read_file",
    "search_code",
    "edit_file",
    "run",
    "finish",
)
TOOL_NAMES = (LIST_TOOL, READ_TOOL, SEARCH_TOOL, EDIT_TOOL, RUN_TOOL, FINISH_TOOL)

ARTIFACT_DIRS = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis"})
ARTIFACT_SUFFIXES = (".pyc", ".pyo")


MAX_LINE_CHARS = 400
"""read_file and search_code cut longer lines (minified files would otherwise fill the output)."""
MAX_SEARCH_FILE_BYTES = 1_000_000
SEARCH_TIMEOUT_S = 1.0


def is_artifact_path(path: str) -> bool:
    """Whether `path` is a by-product of running code (bytecode, tool caches), not an edit: such files are left
    out of `files_edited_by_run`, `edited_files` and the detectors' view."""
    parts = PurePosixPath(path).parts
    return any(part in ARTIFACT_DIRS or part.endswith(".egg-info") for part in parts[:-1]) or path.endswith(
        ARTIFACT_SUFFIXES
    )


def is_test_path(path: str) -> bool:
    """Whether `path` is a test file or test configuration: `test_*.py`, `*_test.py`, anything under a `tests/` or
    `test/` directory, or a `conftest.py` (which can change how every test runs)."""
    parts = PurePosixPath(path).parts
    if not parts:
        return False
    name = parts[-1]
    if name == "conftest.py":
        return True
    if name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py")):
        return True
    return any(part in ("tests", "test") for part in parts[:-1])


def truncate_middle(text: str, limit: int) -> str:
    """`text` within `limit` characters: its head and tail around a marker that says how much was cut (command
    output: the start says what ran, the end holds the error)."""
    if len(text) <= limit:
        return text
    head = max(0, limit * 2 // 5)
    tail = max(0, limit - head)
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... output truncated: {cut:,} characters not shown ...]\n{text[len(text) - tail :]}"


def truncate_head(text: str, limit: int, hint: str) -> str:
    """The first `limit` characters of `text` (cut at a line end when one is near), then a marker with `hint`."""
    if len(text) <= limit:
        return text
    kept = text[:limit]
    newline = kept.rfind("\n")
    if newline > limit // 2:
        kept = kept[:newline]
    return f"{kept}\n[... truncated: {len(text) - len(kept):,} more characters; {hint}]"


@dataclass
class EpisodeLengths:
    """Running totals of `workers.trajectories.LengthStats`."""

    thinking_tokens: int = 0
    tool_call_tokens: int = 0
    tool_output_tokens: int = 0
    final_message_tokens: int = 0
    summary_tokens: int = 0


@dataclass
class EpisodeState:
    """What a coding episode holds beyond the base class's conversation and counts (deep-copied by `fork_from`)."""

    lengths: EpisodeLengths = field(default_factory=EpisodeLengths)
    tool_counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TOOL_NAMES, 0))
    edited_by_tool: list[str] = field(default_factory=list)
    edited_by_run: list[str] = field(default_factory=list)
    run_limit_hits: int = 0
    awaiting_summary: bool = False
    summaries: list[dict[str, Any]] = field(default_factory=list)
    segments: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    finish_message: str | None = None
    hidden: dict[str, Any] | None = None
    tests_passed: float | None = None
    diff: str | None = None
    edited_files: list[str] = field(default_factory=list)


class CodingTools:
    """The tools' work; the environment that inherits it sets these (its constructor checks their ranges)."""

    max_output_chars: int
    max_read_lines: int
    max_search_matches: int
    max_list_entries: int
    command_wall_seconds: float
    command_cpu_seconds: int
    command_memory_mb: int
    _snapshot: Snapshot | None
    _state: EpisodeState

    @property
    def workspace(self) -> Workspace:
        raise NotImplementedError

    def _path(self, raw: str, *, allow_root: bool = False) -> str:
        text = raw.strip()
        if allow_root and text in ("", ".", "./", "/"):
            return ""
        try:
            return normalize_path(text)
        except ValueError as exc:
            raise ToolError(f"{exc} (paths are relative to the repository root, e.g. 'src/pkg/module.py')") from None

    def _files(self, directory: str = "") -> list[str]:
        return [p for p in self.workspace.list_files(directory) if not is_artifact_path(p)]

    def _is_dir(self, path: str) -> bool:
        return bool(path) and self.workspace.is_dir(path)

    def _missing(self, path: str, kind: str = "file") -> ToolError:
        close = difflib.get_close_matches(path, self._files(), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; use {LIST_TOOL} to see the files"
        return ToolError(f"no {kind} '{path}' in the repository{hint}")

    def _list(self, raw: str) -> str:
        path = self._path(raw, allow_root=True)
        if path and self.workspace.exists(path):
            raise ToolError(f"'{path}' is a file, not a directory; read it with {READ_TOOL}")
        prefix = f"{path}/" if path else ""
        files = self._files(path)
        if not files:
            if path:
                raise self._missing(path, "directory")
            return "the repository is empty"
        where = f"'{path}'" if path else "the repository"
        if len(files) <= self.max_list_entries:
            listing = "\n".join(f[len(prefix) :] for f in files)
            return truncate_head(
                f"{len(files)} file(s) in {where}:\n{listing}", self.max_output_chars, "list a subdirectory"
            )
        # Too many to list: the directory's own entries, each subdirectory with its file count.
        entries: dict[str, int] = {}
        for name in files:
            rest = name[len(prefix) :]
            head, sep, _ = rest.partition("/")
            key = head + "/" if sep else head
            entries[key] = entries.get(key, 0) + 1
        lines = [f"{key} ({n} files)" if key.endswith("/") else key for key, n in sorted(entries.items())]
        shown = lines[: self.max_list_entries]
        more = len(lines) - len(shown)
        text = f"{len(files)} files in {where}, too many to list; its entries:\n" + "\n".join(shown)
        if more:
            text += f"\n[... {more} more entries not shown]"
        return truncate_head(
            text + "\nList a subdirectory to see its files.", self.max_output_chars, "list a subdirectory"
        )

    def _text_of(self, path: str) -> str:
        if not self.workspace.exists(path):
            if self._is_dir(path):
                raise ToolError(f"'{path}' is a directory; list it with {LIST_TOOL}")
            raise self._missing(path)
        try:
            return self.workspace.read_text(path)
        except UnicodeDecodeError:
            raise ToolError(f"'{path}' is not a UTF-8 text file") from None

    def _read(self, raw: str, start: int | None, end: int | None) -> str:
        path = self._path(raw)
        text = self._text_of(path)
        lines = text.splitlines()
        if not lines:
            return f"{path} is empty"
        first = 1 if start is None else start
        if first < 1:
            raise ToolError(f"start_line must be >= 1, got {first}")
        if first > len(lines):
            raise ToolError(f"start_line {first} is past the end of {path}, which has {len(lines)} lines")
        last = len(lines) if end is None else min(end, len(lines))
        if last < first:
            raise ToolError(f"end_line ({end}) is before start_line ({first})")
        shown_last = min(last, first + self.max_read_lines - 1)
        width = len(str(shown_last))
        body = "\n".join(f"{n:>{width}}| {_cut_line(lines[n - 1])}" for n in range(first, shown_last + 1))
        header = f"{path} (lines {first}-{shown_last} of {len(lines)})"
        text_out = f"{header}\n{body}"
        if shown_last < last:
            text_out += (
                f"\n[... lines {shown_last + 1}-{last} not shown (at most {self.max_read_lines} lines per read); "
                f"read them with start_line={shown_last + 1}]"
            )
        return truncate_head(text_out, self.max_output_chars, "read a smaller range of lines")

    def _search(self, pattern: str, raw_path: str) -> str:
        try:
            compiled = compile_pattern(pattern)
        except GrepError as exc:
            raise ToolError(
                f"{exc}; escape special characters such as ( [ . * + ? with a backslash to search for them literally"
            ) from None
        path = self._path(raw_path, allow_root=True)
        if path and self.workspace.exists(path):
            candidates = [path]
        else:
            candidates = self._files(path)
            if path and not candidates:
                raise self._missing(path, "file or directory")
        deadline = time.monotonic() + SEARCH_TIMEOUT_S
        matches: list[str] = []
        total = 0
        files_with = 0
        for name in candidates:
            try:
                text = self.workspace.read_text(name)
            except UnicodeDecodeError:
                continue
            if len(text) > MAX_SEARCH_FILE_BYTES:
                continue
            found = False
            for number, line in enumerate(text.splitlines(), start=1):
                remaining = deadline - time.monotonic()
                try:
                    if remaining <= 0:
                        raise TimeoutError
                    hit = compiled.search(line, timeout=remaining)
                except TimeoutError:
                    raise ToolError(
                        f"the search took longer than {SEARCH_TIMEOUT_S:g} s; use a simpler pattern or a narrower path"
                    ) from None
                if hit is None:
                    continue
                found = True
                total += 1
                if len(matches) < self.max_search_matches:
                    matches.append(f"{name}:{number}: {_cut_line(line.strip())}")
            files_with += found
        if not matches:
            where = f" under '{path}'" if path else ""
            return f"no match for {pattern!r}{where}"
        text_out = f"{total} match(es) in {files_with} file(s):\n" + "\n".join(matches)
        if total > len(matches):
            text_out += f"\n[... {total - len(matches)} more matches not shown; narrow the pattern or the path]"
        return truncate_head(text_out, self.max_output_chars, "narrow the pattern or the path")

    def _edit(self, raw: str, search: str, replace: str) -> tuple[str, dict[str, Any]]:
        path = self._path(raw)
        exists = self.workspace.exists(path)
        if not exists and self._is_dir(path):
            raise ToolError(f"'{path}' is a directory; give a file path")
        if not search:
            if exists and self._text_of(path):
                raise ToolError(
                    f"{path} already exists; an empty search only creates a new file. To change it, put the exact "
                    "text to replace in search"
                )
            self.workspace.write_text(path, replace)
            self._note_edit(path)
            lines = replace.count("\n") + (1 if replace and not replace.endswith("\n") else 0)
            if exists:  # an empty file: filling it is an edit
                return f"wrote {lines} lines into the empty file {path}", {"path": path, "edit": "modified"}
            return f"created {path} ({lines} lines)", {"path": path, "edit": "created"}
        if not exists:
            raise ToolError(
                f"no file '{path}' to edit; to create it, call {EDIT_TOOL} with an empty search"
                + self._close_hint(path)
            )
        text = self._text_of(path)
        occurrences = text.count(search)
        if occurrences == 0:
            raise ToolError(f"the search text was not found in {path}. " + _near_miss(text, search))
        if occurrences > 1:
            at_lines = _occurrence_lines(text, search)
            shown = ", ".join(map(str, at_lines[:10])) + (", ..." if len(at_lines) > 10 else "")
            raise ToolError(
                f"the search text matches {occurrences} times in {path} (at lines {shown}); include more "
                "surrounding lines in search so that it matches exactly once"
            )
        if search == replace:
            raise ToolError("search and replace are the same text; nothing would change")
        at = text.index(search)
        start_line = text.count("\n", 0, at) + 1
        updated = text[:at] + replace + text[at + len(search) :]
        self.workspace.write_text(path, updated)
        self._note_edit(path)
        old_lines = search.count("\n") + (0 if search.endswith("\n") else 1)
        new_lines = replace.count("\n") + (0 if replace.endswith("\n") or not replace else 1)
        snippet = _numbered_window(updated, start_line, max(new_lines, 1), context=2, limit=12)
        content = (
            f"edited {path}: replaced {old_lines} line(s) at line {start_line} with {new_lines} line(s)\n{snippet}"
        )
        return truncate_head(content, self.max_output_chars, "read the file to see the rest"), {
            "path": path,
            "edit": "modified",
        }

    def _close_hint(self, path: str) -> str:
        close = difflib.get_close_matches(path, self._files(), n=3, cutoff=0.6)
        return f" (did you mean {', '.join(close)}?)" if close else ""

    def _note_edit(self, path: str) -> None:
        if path not in self._state.edited_by_tool:
            self._state.edited_by_tool.append(path)

    def _status(self, path: str, content: bytes | None) -> str:
        """How a command's change stands against the snapshot: created, modified or deleted."""
        assert self._snapshot is not None
        if content is None:
            return "deleted"
        return "modified" if _snapshot_has(self._snapshot, path) else "created"

    def _command(self, command: str) -> tuple[str, dict[str, Any]]:
        if not command.strip():
            raise ToolError("the command is empty; give a shell command such as 'python -m pytest -q'")
        limits = CommandLimits(
            wall_seconds=self.command_wall_seconds,
            cpu_seconds=self.command_cpu_seconds,
            memory_bytes=self.command_memory_mb * 1024 * 1024,
            max_output_chars=self.max_output_chars,
        )
        result = run_command(self.workspace, command, limits=limits, apply_changes=True)
        changed = {
            path: self._status(path, content)
            for path, content in sorted(result.changed.items())
            if not is_artifact_path(path)
        }
        for path in changed:
            if path not in self._state.edited_by_run:
                self._state.edited_by_run.append(path)
        outcome = str(getattr(result.outcome, "value", result.outcome))
        if outcome not in ("ok", "failed"):  # timeout, memory, killed, error: a limit or the sandbox stopped it
            self._state.run_limit_hits += 1
        text = result.as_observation(self.max_output_chars)
        if changed:
            listed = ", ".join(f"{path} ({status})" for path, status in list(changed.items())[:20])
            text += f"\n[files changed by the command: {listed}]"
        detail = {
            "command": command,
            "exit_code": result.exit_code,
            "outcome": outcome,
            "seconds": round(float(result.seconds), 3),
            "changed_files": changed,
        }
        return truncate_middle(text, self.max_output_chars + 400), detail


def _snapshot_has(snapshot: Snapshot, path: str) -> bool:
    return path in snapshot


def _cut_line(line: str) -> str:
    return line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] + " …[line cut]"


def _occurrence_lines(text: str, search: str) -> list[int]:
    lines: list[int] = []
    at = text.find(search)
    while at >= 0:
        lines.append(text.count("\n", 0, at) + 1)
        at = text.find(search, at + 1)
    return lines


def _near_miss(text: str, search: str) -> str:
    """Why an absent search text might not match: the same lines with other indentation or spacing."""
    wanted = [line.strip() for line in search.strip("\n").splitlines()]
    lines = text.splitlines()
    if wanted and wanted[0]:
        for start in range(len(lines) - len(wanted) + 1):
            if all(lines[start + i].strip() == wanted[i] for i in range(len(wanted))):
                return (
                    f"The same lines appear at line {start + 1} with different indentation or spacing; copy them "
                    f"exactly (read_file shows them after the 'N| ' prefix)."
                )
    return (
        "It must match the file exactly, including indentation and blank lines: read the file with read_file and "
        "copy the lines (without the line-number prefix)."
    )


def _numbered_window(text: str, start_line: int, count: int, *, context: int, limit: int) -> str:
    lines = text.splitlines()
    first = max(1, start_line - context)
    last = min(len(lines), start_line + count - 1 + context, first + limit - 1)
    width = len(str(last))
    return "\n".join(f"{n:>{width}}| {_cut_line(lines[n - 1])}" for n in range(first, last + 1))
