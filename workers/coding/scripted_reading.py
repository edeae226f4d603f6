"""What the scripted coding agent keeps and reads: its notes, the edits it plans from the reference patch's hunks,
and the parsers of what the tools and the task row show it (the tool messages since its last reply, a list_files
listing, search_code line numbers, whether a run passed, the function a row names, a path's module name).

The agent itself (its policy, one reply at a time), its episodes and the SFT teacher glue live in
`workers.coding.scripted`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from workers.envs.base import Message

Observations = list[str]


@dataclass
class Edit:
    """One edit_file call the plan makes: a hunk of the reference patch, with the original line where its old
    text starts (for extending its context upwards)."""

    path: str
    search: str
    replace: str
    first_line: int
    context_added: int = 0


@dataclass
class Notes:
    """What the agent has learned and done, for its messages and its self-summaries."""

    listing: list[str] = field(default_factory=list)
    known: dict[str, dict[int, str]] = field(default_factory=dict)  # path -> original line number -> text
    names: dict[str, list[str]] = field(default_factory=dict)  # path -> functions or classes the patch touches
    edited: list[str] = field(default_factory=list)
    failed_edits: list[str] = field(default_factory=list)
    check: str | None = None
    check_passed: bool | None = None


def observations_since_reply(messages: Sequence[Message]) -> Observations:
    """The tool messages after the last assistant reply, in order."""
    out: Observations = []
    for message in reversed(messages):
        if message["role"] == "assistant":
            break
        if message["role"] == "tool":
            out.append(message["content"])
    return out[::-1]


def listed_paths(observation: str) -> list[str]:
    """The file paths a list_files result shows (its full-listing form; the entries form has none to take)."""
    lines = observation.splitlines()
    if not lines or "file(s) in" not in lines[0]:
        return []
    prefix = ""
    match = re.search(r"file\(s\) in '([^']+)'", lines[0])
    if match:
        prefix = match.group(1).rstrip("/") + "/"
    return [prefix + line.strip() for line in lines[1:] if line.strip() and not line.startswith("[")]


def search_lines(observation: str, path: str) -> list[int]:
    """The line numbers of a search_code result's matches in `path`, in order."""
    prefix = f"{path}:"
    out: list[int] = []
    for line in observation.splitlines():
        if line.startswith(prefix):
            number = line[len(prefix) :].split(":", 1)[0]
            if number.isdigit():
                out.append(int(number))
    return out


def named_target(row: Mapping[str, Any], instruction: str) -> tuple[str, str] | None:
    """(path, qualname) of the function a generated row's `source` names, when its instruction names it too."""
    source = row.get("source")
    if not isinstance(source, Mapping):
        return None
    path, function = source.get("path"), source.get("function")
    if not isinstance(path, str) or not isinstance(function, str) or not path or not function:
        return None
    if path not in instruction or function.rpartition(".")[2] not in instruction:
        return None
    return path, function


def minimal_edit(path: str, hunk: Any) -> Edit:
    """The hunk's edit without its unchanged leading and trailing context lines."""
    old, new = list(hunk.old), list(hunk.new)
    head = 0
    while head < min(len(old), len(new)) and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < min(len(old), len(new)) - head and old[len(old) - 1 - tail] == new[len(new) - 1 - tail]:
        tail += 1
    return Edit(path, "".join(old[head : len(old) - tail]), "".join(new[head : len(new) - tail]), hunk.old_start + head)


def command_passed(observation: str) -> bool:
    head = observation.lower()
    return bool(re.search(r"exit (?:code|status)[: ]+0\b", head)) or (
        "error" not in head and "failed" not in head and "traceback" not in head
    )


def leading_context(hunk: Any) -> int:
    """Lines of leading context before the hunk's first removed or added line."""
    count = 0
    for old_line, new_line in zip(hunk.old, hunk.new, strict=False):
        if old_line != new_line:
            break
        count += 1
    return count


def module_of(path: str) -> str | None:
    """ "pkg/sub/mod.py" -> "pkg.sub.mod" ("pkg/__init__.py" -> "pkg"); None for a name Python cannot import."""
    parts = list(PurePosixPath(path).with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    if parts and parts[0] == "src":
        parts = parts[1:]
    if not parts or not all(part.isidentifier() for part in parts):
        return None
    return ".".join(parts)
