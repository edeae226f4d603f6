"""A repository task, as stored in a dataset (JSONL schema "repo_task/v1") and read back.

    task = parse_repo_task_row(row, index=3)   # raises RepoTaskError naming row 3, the field and the fix
    row = task.to_row()                        # the JSONL row; also carries "prompt" and "answer" (see below)

A row:

    {"schema": "repo_task/v1", "id": "mathx-clamp-1",
     "instruction": "clamp() lets values above the maximum through. Fix it.",
     "snapshot": {"sha256": "<64 hex: workers.coding.archive.content_hash of the files>",
                  "uri": "s3://bucket/snapshots/<sha256>.tar.gz", "file_count": 12, "size_bytes": 3456},
     "hidden_tests": {"files": {"tests/test_clamp.py": "..."},
                      "command": "python -m pytest -q -p no:cacheprovider",
                      "fail_to_pass": ["tests/test_clamp.py::test_upper"], "pass_to_pass": []},
     "reference_patch": "--- a/mathx/__init__.py\\n+++ b/mathx/__init__.py\\n@@ ...",
     "family": "repair", "source": {"library": "mathx", "version": "1.0", "function": "clamp"},
     "provenance": {"kind": "generated", "ids": {"generation": "17"}},
     "prompt": "<the instruction again>", "answer": null}

`unverified` (absent, i.e. false, on a verified task's row) is true only on a task stored without a reference patch,
which its importer asked for explicitly: nothing showed that its hidden tests can pass (see `is_unverified`).

`prompt` and `answer` repeat the instruction and say "no reference answer", so that the generic task-row check of
every environment (`workers.envs.base.Environment.validate_task_row`) accepts the row; they are ignored on reading.

What can be checked without the snapshot is checked here: hidden test paths are relative and stay inside the
repository, node ids are unique and fail_to_pass and pass_to_pass do not overlap. A node id's file (the part before
the first "::") must be one of the hidden test files *or a file of the snapshot*; only the snapshot knows the
latter, so this module accepts any relative file there, and `workers.coding.verify.verify_task` is what finds an id
that names no test (it never passes, so the task is refused with the outcomes it got).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from workers.coding.archive import normalize_path

SCHEMA = "repo_task/v1"
MAX_INSTRUCTION_CHARS = 4000
DEFAULT_TEST_COMMAND = "python -m pytest -q -p no:cacheprovider"

Family = Literal["repair", "implement", "imported", "session"]
ProvenanceKind = Literal["generated", "imported", "promoted"]

_SHA256 = re.compile(r"[0-9a-f]{64}")


class RepoTaskError(ValueError):
    """A task row is malformed; the message names the row, the field and how to fix it."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(message)


def check_relative_path(path: str, *, what: str = "path") -> str:
    """`path` as a normalised relative POSIX path (`archive.normalize_path`); ValueError naming `what` and the path
    when it is empty, absolute or climbs out with '..'."""
    try:
        return normalize_path(path)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None


def node_id_file(node_id: str) -> str:
    """The file part of a pytest node id: "tests/test_a.py::TestX::test_y[1-2]" -> "tests/test_a.py"."""
    return node_id.split("::", 1)[0]


class HiddenTests(BaseModel):
    """Tests the agent never sees: written over the final workspace after `finish`, then run.

    `command` is the base pytest command (run with /bin/sh -c in the repository root); the node ids are given to it
    by `workers.coding.hidden_tests.run_hidden_tests`, so it must be a pytest invocation.
    """

    model_config = ConfigDict(extra="forbid")

    files: dict[str, str] = Field(default_factory=dict)
    command: str = DEFAULT_TEST_COMMAND
    fail_to_pass: list[str] = Field(min_length=1)
    pass_to_pass: list[str] = Field(default_factory=list)

    @field_validator("files")
    @classmethod
    def _relative_files(cls, files: dict[str, str]) -> dict[str, str]:
        checked: dict[str, str] = {}
        for path, text in files.items():
            normal = check_relative_path(path, what="hidden test file")
            if normal in checked:
                raise ValueError(f"hidden test file {path!r} is given twice (as {normal!r}); keep one")
            checked[normal] = text
        return checked

    @field_validator("command")
    @classmethod
    def _command(cls, command: str) -> str:
        if not command.strip():
            raise ValueError(f"the test command is blank; use e.g. {DEFAULT_TEST_COMMAND!r}")
        return command

    @field_validator("fail_to_pass", "pass_to_pass")
    @classmethod
    def _node_ids(cls, ids: list[str]) -> list[str]:
        seen: set[str] = set()
        for node_id in ids:
            if not node_id.strip() or node_id != node_id.strip():
                raise ValueError(f"node id {node_id!r} is blank or has surrounding spaces; give 'path::test_name'")
            check_relative_path(node_id_file(node_id), what=f"the file of node id {node_id!r}")
            if node_id in seen:
                raise ValueError(f"node id {node_id!r} is listed twice; list each test once")
            seen.add(node_id)
        return ids

    @model_validator(mode="after")
    def _disjoint(self) -> HiddenTests:
        both = sorted(set(self.fail_to_pass) & set(self.pass_to_pass))
        if both:
            raise ValueError(
                f"node id(s) {', '.join(both[:5])} are in both fail_to_pass and pass_to_pass; a test either goes "
                "from failing to passing or keeps passing: keep each in one list"
            )
        return self

    @property
    def node_ids(self) -> list[str]:
        """fail_to_pass then pass_to_pass."""
        return [*self.fail_to_pass, *self.pass_to_pass]


class SnapshotRef(BaseModel):
    """Where a task's repository snapshot is: its content hash (workers.coding.archive.content_hash) and the uri of
    its canonical tar.gz (a file path or a storage URI read with `workers.storage.read_bytes`)."""

    model_config = ConfigDict(extra="forbid")

    sha256: str
    uri: str = ""
    file_count: int = Field(default=0, ge=0)
    size_bytes: int = Field(default=0, ge=0)

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str) -> str:
        if not _SHA256.fullmatch(value):
            raise ValueError(
                f"{value[:80]!r} is not a sha256: give 64 lowercase hex digits (workers.coding.archive.content_hash "
                "of the snapshot's files)"
            )
        return value


class RepoTask(BaseModel):
    """One repository task (see the module docstring for its row)."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    instruction: str
    snapshot: SnapshotRef
    hidden_tests: HiddenTests
    reference_patch: str | None = None
    unverified: bool = Field(default=False, strict=True)
    family: Family
    source: dict[str, Any] = Field(default_factory=dict)
    provenance: dict[str, Any] = Field(default_factory=lambda: {"kind": "generated", "ids": {}})

    @field_validator("instruction")
    @classmethod
    def _instruction(cls, text: str) -> str:
        if not text.strip():
            raise ValueError("the instruction is blank; write what the user asks for, as a user would")
        if len(text) > MAX_INSTRUCTION_CHARS:
            raise ValueError(
                f"the instruction has {len(text)} characters, over the {MAX_INSTRUCTION_CHARS} allowed; shorten it"
            )
        return text

    @field_validator("reference_patch")
    @classmethod
    def _patch(cls, patch: str | None) -> str | None:
        if patch is not None and not patch.strip():
            return None  # an empty patch is no patch
        return patch

    @field_validator("unverified")
    @classmethod
    def _unverified(cls, unverified: bool, info: ValidationInfo) -> bool:
        if unverified and info.data.get("reference_patch") is not None:
            raise ValueError(
                "true with a reference patch; 'unverified' is only for a task without one: remove it to have the "
                "patch verified, or remove the patch"
            )
        return unverified

    @field_validator("provenance")
    @classmethod
    def _provenance(cls, provenance: dict[str, Any]) -> dict[str, Any]:
        kind = provenance.get("kind")
        if kind not in ("generated", "imported", "promoted"):
            raise ValueError(f"provenance.kind is {kind!r}; it must be one of 'generated', 'imported', 'promoted'")
        ids = provenance.get("ids", {})
        if not isinstance(ids, dict):
            raise ValueError(f"provenance.ids must be an object of name -> id, got {type(ids).__name__}")
        return {**provenance, "ids": ids}

    def to_row(self) -> dict[str, Any]:
        """The JSONL row (schema "repo_task/v1"), with "prompt" (the instruction) and "answer" (None) for the
        generic environment row check."""
        row = self.model_dump(mode="json")
        if not self.unverified:
            del row["unverified"]  # a verified task's row is as it was before the flag existed
        return {"schema": SCHEMA, **row, "prompt": self.instruction, "answer": None}


def is_unverified(row: Mapping[str, Any]) -> bool:
    """Whether nothing showed that a stored repo_task row is solvable: it is marked `"unverified": true`, or it has
    no reference patch (a row stored before import refused such tasks). Verification (`workers.coding.verify`)
    shows a task solvable by running its hidden tests with the reference patch applied."""
    patch = row.get("reference_patch")
    return row.get("unverified") is True or not (isinstance(patch, str) and patch.strip())


_IGNORED_ON_READ = ("schema", "prompt", "answer")


def parse_repo_task_row(row: object, *, index: int | None = None) -> RepoTask:
    """Check one row (a JSON object) and turn it into a `RepoTask`; `index` (1-based) names the row in errors.

    Raises `RepoTaskError` with `.field` set to the dotted field path ("hidden_tests.fail_to_pass") of the first
    problem found.
    """
    where = f"task row {index}" if index is not None else "task row"
    if not isinstance(row, dict):
        raise RepoTaskError(f"{where}: expected a JSON object, got {type(row).__name__}", field=None)
    schema = row.get("schema", SCHEMA)
    if schema != SCHEMA:
        raise RepoTaskError(
            f"{where}: field 'schema' is {schema!r}; this version reads {SCHEMA!r} rows (or rows without 'schema')",
            field="schema",
        )
    fields = {key: value for key, value in row.items() if key not in _IGNORED_ON_READ}
    if isinstance(fields.get("id"), int) and not isinstance(fields.get("id"), bool):
        fields["id"] = str(fields["id"])
    try:
        return RepoTask.model_validate(fields)
    except ValidationError as exc:
        raise _row_error(where, exc) from None


_FIXES = {
    "id": "give a non-empty string",
    "instruction": "give the request as a user would write it",
    "snapshot": 'give {"sha256": ..., "uri": ...} of the repository archive',
    "hidden_tests": 'give {"files": {...}, "fail_to_pass": [...]}',
    "hidden_tests.fail_to_pass": "list at least one pytest node id ('tests/test_x.py::test_y') that must go from "
    "failing to passing",
    "family": "use one of 'repair', 'implement', 'imported', 'session'",
    "unverified": "give true or false (JSON booleans)",
}


def _row_error(where: str, exc: ValidationError) -> RepoTaskError:
    error = exc.errors(include_url=False)[0]
    loc = [str(part) for part in error["loc"]]
    field = ".".join(loc) if loc else None
    message = str(error["msg"]).removeprefix("Value error, ")
    kind = error["type"]
    if kind == "missing":
        problem = f"missing field '{field}'"
    elif kind == "extra_forbidden":
        problem = f"unknown field '{field}'; remove it or check its spelling"
    elif kind.endswith("_type") or kind in ("literal_error", "too_short", "string_too_short"):
        got = type(error.get("input")).__name__
        problem = f"field '{field}': {message.rstrip('.')} (got {got})"
    else:
        problem = f"field '{field}': {message}"
    fix = _FIXES.get(field or "") if kind in ("missing", "too_short", "string_too_short", "literal_error") else None
    if kind.endswith("_type") and field in _FIXES:
        fix = _FIXES[field]
    return RepoTaskError(f"{where}: {problem}" + (f"; {fix}" if fix else ""), field=field)
