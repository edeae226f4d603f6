"""Repository tasks as a user uploads them: the import format, parsed into tasks and the files of their snapshots.

Two forms, told apart by their first bytes:

* **JSONL**, one task per line, the repository given inline (what a person writes by hand):

      {"id": "clamp-upper", "instruction": "clamp() lets values above the maximum through. Fix it.",
       "repo": {"files": {"mathx/__init__.py": "def clamp(x, lo, hi):\\n    return max(lo, x)\\n"}},
       "hidden_tests": {"files": {"tests/test_clamp.py": "from mathx import clamp\\n\\ndef test_upper():\\n ..."},
                        "fail_to_pass": ["tests/test_clamp.py::test_upper"], "pass_to_pass": []},
       "reference_patch": "--- a/mathx/__init__.py\\n+++ b/mathx/__init__.py\\n@@ -1,2 +1,2 @@\\n ...",
       "provenance": {"kind": "imported", "ids": {"ticket": "ENG-12"}}}

* **A bundle** (zip or tar.gz) holding `tasks.jsonl` at its root and the repositories next to it; a row names its
  repository with `"snapshot_path"`: an archive in the bundle (`"snapshots/mathx.tar.gz"`, tar.gz or zip) or a
  folder of it (`"repos/mathx/"`, ending in "/"). Paths inside a snapshot archive are the repository's paths (no
  top folder is stripped).

A row may also be a SWE-bench / SWE-Gym instance as published (`instance_id`, `repo`, `base_commit`, `patch`,
`test_patch`, `FAIL_TO_PASS`, ...), its repository a git bundle in the same upload (`workers.coding.swebench`).

Every other field is that of `workers.coding.task.RepoTask` (family defaults to "imported", provenance to
{"kind": "imported"}); the snapshot reference is computed here from the files (content hash, count, size). Archives
are read with `workers.coding.archive.unpack`, which refuses absolute paths, '..', device files and links.
Nothing here runs code: the sandbox check of every task (hidden tests fail on the snapshot, pass with the reference
patch) is `workers.coding.verify`, run by the import job.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workers.coding import swebench
from workers.coding.archive import ArchiveError, content_hash, pack, unpack
from workers.coding.task import RepoTask, RepoTaskError, parse_repo_task_row

TASKS_FILE = "tasks.jsonl"
MAX_TASKS = 1000
MAX_PROBLEMS = 50
_ZIP_MAGIC = b"PK\x03\x04"
_GZIP_MAGIC = b"\x1f\x8b"


class BundleError(ValueError):
    """The upload cannot be imported; `problems` lists every reason found (row numbers are 1-based lines)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


@dataclass(frozen=True)
class ImportedTask:
    row: int
    task: RepoTask
    files: dict[str, bytes]


def is_archive(data: bytes) -> bool:
    """A zip or gzip file (a tar.gz bundle), or an uncompressed tar (the "ustar" magic at offset 257)."""
    return data.startswith((_ZIP_MAGIC, _GZIP_MAGIC)) or data[257:262] == b"ustar"


def parse_upload(data: bytes) -> list[ImportedTask]:
    """Every task of an upload with its snapshot files; raises `BundleError` listing what is wrong (all of it, up
    to 50 problems), so an upload is imported whole or not at all."""
    members: dict[str, bytes] = {}
    if is_archive(data):
        try:
            members = unpack(data)
        except ArchiveError as exc:
            raise BundleError([f"the bundle: {exc}"]) from None
        if TASKS_FILE not in members:
            tops = sorted({name.split("/", 1)[0] for name in members})[:10]
            raise BundleError(
                [
                    f"the bundle has no {TASKS_FILE} at its root (found: {', '.join(tops) or 'nothing'}); put the task "
                    f"rows in {TASKS_FILE} beside the repositories"
                ]
            )
        lines = members[TASKS_FILE]
    else:
        lines = data
    rows = _rows(lines)
    problems: list[str] = []
    tasks: list[ImportedTask] = []
    seen: dict[str, int] = {}
    for number, row in rows:
        try:
            imported = _task(number, row, members)
        except (BundleError, RepoTaskError) as exc:
            problems.extend(exc.problems if isinstance(exc, BundleError) else [str(exc)])
        else:
            if imported.task.id in seen:
                problems.append(f"line {number}: id {imported.task.id!r} repeats line {seen[imported.task.id]}")
            else:
                seen[imported.task.id] = number
                tasks.append(imported)
        if len(problems) >= MAX_PROBLEMS:
            problems.append(f"(stopped after {MAX_PROBLEMS} problems)")
            break
    if problems:
        raise BundleError(problems)
    return tasks


def _rows(data: bytes) -> list[tuple[int, dict[str, Any]]]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BundleError([f"the task rows are not UTF-8 text ({exc}); upload JSONL, one task per line"]) from None
    rows: list[tuple[int, dict[str, Any]]] = []
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            problems.append(f"line {number}: invalid JSON ({exc})")
            continue
        if not isinstance(row, dict):
            problems.append(f"line {number}: expected a JSON object (one task), got {type(row).__name__}")
            continue
        rows.append((number, row))
        if len(rows) > MAX_TASKS:
            raise BundleError([f"more than {MAX_TASKS} tasks in one upload; split it into several"])
        if len(problems) >= MAX_PROBLEMS:
            break
    if problems:
        raise BundleError(problems)
    if not rows:
        raise BundleError(["the upload holds no task rows; upload JSONL, one task per line (see docs/recipes.md)"])
    return rows


def _task(number: int, row: dict[str, Any], members: Mapping[str, bytes]) -> ImportedTask:
    where = f"line {number}"
    if swebench.is_instance(row):  # a SWE-bench / SWE-Gym instance as published, its repository a git bundle
        try:
            fields, files = swebench.task_fields(row, members, where=where)
        except swebench.InstanceError as exc:
            raise BundleError([str(exc)]) from None
    else:
        files = _snapshot_files(where, row, members)
        fields = {k: v for k, v in row.items() if k not in ("repo", "snapshot_path", "snapshot", "prompt", "answer")}
        if "instruction" not in fields and isinstance(row.get("prompt"), str):
            fields["instruction"] = row["prompt"]  # the generic task-row spelling
    fields.setdefault("family", "imported")
    provenance = fields.get("provenance")
    if provenance is None:
        fields["provenance"] = {"kind": "imported", "ids": {}}
    fields["snapshot"] = {
        "sha256": content_hash(files),
        "file_count": len(files),
        "size_bytes": sum(len(content) for content in files.values()),
    }
    return ImportedTask(row=number, task=parse_repo_task_row(fields, index=number), files=files)


def _snapshot_files(where: str, row: Mapping[str, Any], members: Mapping[str, bytes]) -> dict[str, bytes]:
    repo = row.get("repo")
    path = row.get("snapshot_path")
    if (repo is None) == (path is None):
        raise BundleError(
            [
                f'{where}: give the repository either inline as "repo": {{"files": {{path: text}}}} or, in a '
                'bundle, as "snapshot_path" (an archive or a folder of the bundle); not both, not neither'
            ]
        )
    if repo is not None:
        raw = repo.get("files") if isinstance(repo, dict) else None
        if not isinstance(raw, dict) or not raw:
            raise BundleError([f"{where}: field 'repo.files' must be a non-empty object of path -> file text"])
        bad = [name for name, content in raw.items() if not isinstance(content, str)]
        if bad:
            raise BundleError([f"{where}: field 'repo.files' holds non-text content for {', '.join(bad[:5])}"])
        try:
            # Through the archive's own checks, so an inline tree obeys the same rules as an uploaded one.
            return unpack(pack({name: content.encode() for name, content in raw.items()}))
        except (ArchiveError, ValueError) as exc:
            raise BundleError([f"{where}: field 'repo.files': {exc}"]) from None
    if not members:
        raise BundleError([f"{where}: 'snapshot_path' names a file of a bundle; upload a zip or tar.gz bundle"])
    if not isinstance(path, str) or not path:
        raise BundleError([f"{where}: field 'snapshot_path' must be a path inside the bundle"])
    if path.endswith("/"):
        files = {name[len(path) :]: content for name, content in members.items() if name.startswith(path)}
        if not files:
            raise BundleError([f"{where}: the bundle has no files under {path!r}"])
        return files
    if path not in members:
        raise BundleError([f"{where}: the bundle has no file {path!r} (snapshot_path)"])
    try:
        return unpack(members[path])
    except ArchiveError as exc:
        raise BundleError([f"{where}: snapshot {path!r}: {exc}"]) from None
