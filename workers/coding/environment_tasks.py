"""The coding agent's task rows: a repo_task/v1 row (`workers.coding.task`) or a hand-written one with its files
inline, checked into a `RepoTask` (`parse_task_fields`), the instruction of a generic task (`prompt_text`) and the
per-process cache of inline repositories' snapshots (`inline_snapshot`). The environment that reads them is
`workers.coding.environment`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workers.coding.archive import content_hash
from workers.coding.task import RepoTask, RepoTaskError, parse_repo_task_row
from workers.coding.workspace import Snapshot
from workers.envs.base import Task, TaskFieldError
from workers.envs.toolcalls import json_kind


def parse_task_fields(fields: Mapping[str, Any], *, environment: str, index: int | None = None) -> RepoTask:
    """The `RepoTask` of a task's fields (its metadata with `id` and `instruction`): a repo_task/v1 row, or one
    whose repository is inline (`{"repo": {"files": {path: text}}}` instead of `snapshot`; its family defaults to
    "imported"). Raises `TaskFieldError` naming the field and `environment`."""
    where = f"task row {index}" if index is not None else "task row"
    row = {key: value for key, value in fields.items() if key not in ("repo", "prompt", "answer", "aliases")}
    repo = fields.get("repo")
    if repo is not None:
        files = repo.get("files") if isinstance(repo, Mapping) else None
        if (
            not isinstance(files, Mapping)
            or not files
            or not all(isinstance(path, str) and isinstance(text, str) for path, text in files.items())
        ):
            raise TaskFieldError(
                f"{where}: field 'repo' must be {{\"files\": {{path: text, ...}}}} with at least one file, got "
                f"{json_kind(repo)}",
                field="repo",
                environment=environment,
            )
        if fields.get("snapshot") is not None:
            raise TaskFieldError(
                f"{where}: give either 'snapshot' or an inline 'repo', not both",
                field="repo",
                environment=environment,
            )
        row["snapshot"] = {"sha256": content_hash(dict(files)), "file_count": len(files)}
        row.setdefault("family", "imported")
        row.setdefault("provenance", {"kind": "imported", "ids": {}})
    elif fields.get("snapshot") is None:
        raise TaskFieldError(
            f"{where}: missing field 'snapshot', which environment '{environment}' needs (or give the files inline "
            'as "repo": {"files": {...}})',
            field="snapshot",
            environment=environment,
        )
    try:
        return parse_repo_task_row(row, index=index)
    except RepoTaskError as exc:
        raise TaskFieldError(str(exc), field=exc.field, environment=environment) from None


_INLINE_SNAPSHOTS: dict[str, Snapshot] = {}
_INLINE_CACHE_SIZE = 8


def inline_snapshot(sha256: str, files: Mapping[str, str]) -> Snapshot:
    """The snapshot of a task's inline files, built once per process for the episodes of one task (like
    `Snapshot.load`'s cache for stored ones)."""

    snapshot = _INLINE_SNAPSHOTS.get(sha256)
    if snapshot is None:
        snapshot = Snapshot.from_files(dict(files))
        _INLINE_SNAPSHOTS[sha256] = snapshot
        while len(_INLINE_SNAPSHOTS) > _INLINE_CACHE_SIZE:
            _INLINE_SNAPSHOTS.pop(next(iter(_INLINE_SNAPSHOTS)))
    return snapshot


def prompt_text(task: Task) -> str:
    if isinstance(task.prompt, str):
        return task.prompt
    return next((m["content"] for m in reversed(task.prompt) if m["role"] == "user"), "")
