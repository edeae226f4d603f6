"""Readers shared by the coding-agent detectors (asks_instead_of_acting, edits_tests, terminal_only).

Records come from the `coding_agent` environment (`workers.coding.environment`), which writes the final diff, the
files changed and by which means (`edited_files`, `files_edited_by_run`, per-turn `path`/`edit` on edit_file
results and `changed_files` on run results), or from uploads that may hold only some of these. Every reader here
tolerates missing or oddly typed fields. A private module (its name starts with "_"), so the registry does not
take it for a detector.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from workers.coding.environment import ENV_NAME
from workers.coding.tools import EDIT_TOOL, FINISH_TOOL, RUN_TOOL, is_artifact_path
from workers.detectors.base import content_of, is_assistant, turns_of

CREATED, MODIFIED, DELETED = "created", "modified", "deleted"


def is_coding_record(record: Mapping[str, Any]) -> bool:
    """A coding-agent episode: `env` says so, or (an upload without `env`) it carries a diff or a hidden-test
    report."""
    env = record.get("env")
    if isinstance(env, str) and env:
        return env == ENV_NAME
    return "diff" in record or isinstance(record.get("hidden_tests"), Mapping)


def ended_cleanly(record: Mapping[str, Any]) -> bool:
    error = record.get("error")
    return not (isinstance(error, str) and error.strip())


def diff_files(diff: object) -> dict[str, str]:
    """{path: created | modified | deleted} for every file a unified diff names (from its ---/+++ headers)."""
    if not isinstance(diff, str) or not diff:
        return {}
    out: dict[str, str] = {}
    old: str | None = None
    for line in diff.splitlines():
        if line.startswith("--- "):
            old = _header_path(line[4:], "a/")
        elif line.startswith("+++ ") and old is not None:
            new = _header_path(line[4:], "b/")
            if old == "/dev/null" and new != "/dev/null":
                out[new] = CREATED
            elif new == "/dev/null":
                out[old] = DELETED
            else:
                out[new] = MODIFIED
            old = None
    return out


def _header_path(text: str, prefix: str) -> str:
    path = text.split("\t")[0].strip()
    return path[len(prefix) :] if path.startswith(prefix) else path


def final_diff(record: Mapping[str, Any]) -> dict[str, str]:
    """The files the final workspace changes, with how: from the diff, else (no diff field) `edited_files`."""
    files = diff_files(record.get("diff"))
    if not files and not record.get("diff"):
        edited = record.get("edited_files")
        if isinstance(edited, list):
            files = {str(path): MODIFIED for path in edited if isinstance(path, str)}
    return {path: how for path, how in files.items() if not is_artifact_path(path)}


def call_of(turns: list[Mapping[str, Any]], result_index: int) -> Mapping[str, Any] | None:
    """The assistant turn whose call a tool turn answers (the environments write a reply's k calls as k assistant
    turns followed by their k results, in order)."""
    results_before = 0
    i = result_index - 1
    while i >= 0 and not is_assistant(turns[i]):
        results_before += 1
        i -= 1
    calls_end = i
    while i >= 0 and is_assistant(turns[i]) and turns[i].get("tool"):
        i -= 1
    calls = [turns[j] for j in range(i + 1, calls_end + 1)]
    return calls[results_before] if results_before < len(calls) else None


def is_error_result(turn: Mapping[str, Any]) -> bool:
    return bool(turn.get("error")) or content_of(turn).lstrip().lower().startswith("error")


def tool_edits(record: Mapping[str, Any]) -> list[tuple[int, str, str]]:
    """(turn index, path, created | modified) of every edit_file call that succeeded, in order."""
    turns = turns_of(record)
    out: list[tuple[int, str, str]] = []
    for index, turn in enumerate(turns):
        if is_assistant(turn) or turn.get("tool") != EDIT_TOOL or is_error_result(turn):
            continue
        path = turn.get("path")
        how = turn.get("edit")
        if not isinstance(path, str):
            call = call_of(turns, index)
            args = call.get("args") if call is not None else None
            path = args.get("path") if isinstance(args, Mapping) else None
        if isinstance(path, str) and path:
            kind = (
                how if how in (CREATED, MODIFIED) else (CREATED if content_of(turn).startswith("created") else MODIFIED)
            )
            out.append((index, path, kind))
    return out


def run_changes(record: Mapping[str, Any]) -> list[tuple[int | None, str, str]]:
    """(turn index or None, path, created | modified | deleted) of every file a `run` command changed: from the run
    results' `changed_files`, else (uploads) from `files_edited_by_run` with no turn and "modified"."""
    turns = turns_of(record)
    out: list[tuple[int | None, str, str]] = []
    for index, turn in enumerate(turns):
        changed = turn.get("changed_files")
        if is_assistant(turn) or turn.get("tool") != RUN_TOOL or not isinstance(changed, Mapping):
            continue
        for path, how in changed.items():
            if isinstance(path, str) and not is_artifact_path(path):
                out.append((index, path, how if how in (CREATED, MODIFIED, DELETED) else MODIFIED))
    if not out:
        listed = record.get("files_edited_by_run")
        if isinstance(listed, list):
            out = [(None, str(p), MODIFIED) for p in listed if isinstance(p, str) and not is_artifact_path(p)]
    return out


def run_command_of(turns: list[Mapping[str, Any]], index: int | None) -> str | None:
    if index is None:
        return None
    command = turns[index].get("command")
    if isinstance(command, str):
        return command
    call = call_of(turns, index)
    args = call.get("args") if call is not None else None
    value = args.get("command") if isinstance(args, Mapping) else None
    return str(value) if value is not None else None


def final_message(record: Mapping[str, Any]) -> tuple[int | None, str]:
    """(turn index, text) of the episode's last word to the user. The text is the record's `answer` (the
    environment's final message), else the finish call's message or the final reply's text without its tool-call
    blocks; the index is the finish call's or the final reply's turn (None when the episode did not end with one)."""
    turns = turns_of(record)
    index: int | None = None
    text = ""
    for i in range(len(turns) - 1, -1, -1):
        turn = turns[i]
        if not is_assistant(turn) or turn.get("summary"):
            continue
        if turn.get("tool") == FINISH_TOOL:
            args = turn.get("args")
            message = args.get("message") if isinstance(args, Mapping) else None
            index, text = i, message if isinstance(message, str) and message.strip() else strip_calls(content_of(turn))
        elif not turn.get("tool"):
            index, text = i, strip_calls(content_of(turn))
        break
    answer = record.get("answer")
    if isinstance(answer, str) and answer.strip():
        text = answer
    return index, text


_CALL = re.compile(r"<tool_call>.*?(?:</tool_call>|$)", re.DOTALL)


def strip_calls(text: str) -> str:
    """`text` without its `<tool_call>` blocks."""
    return _CALL.sub(" ", text).strip()
