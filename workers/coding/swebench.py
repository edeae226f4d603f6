"""SWE-bench and SWE-Gym instances, as they are published, read into repository-task rows (`workers.coding.task`).

An instance row (one line of `tasks.jsonl` in an import bundle, `workers.coding.bundle`) holds `instance_id`,
`repo` ("owner/name"), `base_commit`, `patch` (the reference fix), `test_patch` (the tests the fix makes pass),
`problem_statement`, `FAIL_TO_PASS` and `PASS_TO_PASS` (lists of pytest node ids, or those lists JSON-encoded as
strings, as the Hugging Face exports hold them); other fields (`hints_text`, `created_at`, `version`, ...) are
kept in the task's `source`. The repository comes in the same bundle as a git bundle, at
`repos/<owner>__<name>.bundle` (made with `git bundle create repos/<owner>__<name>.bundle --all`), or wherever the
row's `snapshot_path` names it.

The task: its snapshot is the repository's tree at `base_commit` (`git archive`, no history); its instruction is the
problem statement; its hidden tests are the files `test_patch` adds or changes, as they are once it is applied to
that tree; `fail_to_pass` and `pass_to_pass` are the instance's own lists; its reference patch is `patch`; its
provenance `{"kind": "imported", "ids": {"instance_id", "repo", "base_commit"}}`. The import then verifies it in the
sandbox like any repository task (`workers.coding.verify`). Every problem names the row's line and the field.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workers.coding.archive import ArchiveError, unpack
from workers.coding.patches import PatchError, apply_patch
from workers.coding.workspace import Snapshot, Workspace

REQUIRED = ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement", "FAIL_TO_PASS")
SOURCE_KIND = "swe-bench"
GIT_TIMEOUT_SECONDS = 300
# Fields of an instance that become the task's own; every other one is kept in `source`.
_OWN = {*REQUIRED, "PASS_TO_PASS", "snapshot_path"}


class InstanceError(ValueError):
    """A SWE-bench instance that cannot become a task: the message names the line and the field."""


def is_instance(row: Mapping[str, Any]) -> bool:
    """A SWE-bench / SWE-Gym instance (rather than a Crucible task row): it has `instance_id` and `base_commit`."""
    return "instance_id" in row and "base_commit" in row


def bundle_path(repo: str) -> str:
    """Where an import bundle holds the git bundle of `repo` ("owner/name")."""
    return f"repos/{repo.replace('/', '__')}.bundle"


def _test_ids(row: Mapping[str, Any], field: str, where: str) -> list[str]:
    value = row.get(field, [])
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except ValueError:
            raise InstanceError(f"{where}: field {field!r} is a string but not a JSON list of test ids") from None
    if not isinstance(value, list) or not all(isinstance(item, str) and item.strip() for item in value):
        raise InstanceError(f"{where}: field {field!r} must be a list of pytest node ids (or that list as JSON)")
    return [item.strip() for item in value]


def _git(*args: str, cwd: Path) -> bytes:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1"}
    done = subprocess.run(
        ["git", "-c", "core.hooksPath=/dev/null", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        timeout=GIT_TIMEOUT_SECONDS,
        check=False,
    )
    if done.returncode != 0:
        lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise InstanceError(lines[-1] if lines else f"git exited with status {done.returncode}")
    return done.stdout


def checkout(bundle: bytes, commit: str, *, where: str, bundle_name: str) -> dict[str, bytes]:
    """The files of `commit` in a git bundle (its tree only, through the archive's checks)."""
    if not commit or any(c not in "0123456789abcdefABCDEF" for c in commit) or not 7 <= len(commit) <= 40:
        raise InstanceError(f"{where}: field 'base_commit' must be a commit hash (7-40 hex digits), got {commit!r}")
    with tempfile.TemporaryDirectory(prefix="crucible-swebench-") as tmp:
        root = Path(tmp)
        (root / "repo.bundle").write_bytes(bundle)
        try:
            _git("clone", "--quiet", "--bare", "repo.bundle", "repo.git", cwd=root)
            tree = _git("--git-dir=repo.git", "archive", "--format=tar", f"{commit}^{{commit}}", cwd=root)
        except InstanceError as exc:
            raise InstanceError(
                f"{where}: base_commit {commit} could not be read from {bundle_name} ({exc}); make the bundle with "
                f"`git bundle create {bundle_name} --all` in a clone that has the commit"
            ) from None
        except subprocess.TimeoutExpired:
            raise InstanceError(f"{where}: reading {bundle_name} took over {GIT_TIMEOUT_SECONDS} s") from None
    try:
        files = unpack(tree)
    except ArchiveError as exc:
        raise InstanceError(f"{where}: the tree of {commit} in {bundle_name}: {exc}") from None
    if not files:
        raise InstanceError(f"{where}: the tree of {commit} in {bundle_name} holds no files")
    return files


def hidden_test_files(files: Mapping[str, bytes], test_patch: str, *, where: str) -> dict[str, str]:
    """The files `test_patch` adds or changes, with their text once it is applied to `files`."""
    workspace = Workspace(Snapshot.from_files(files))
    try:
        touched = apply_patch(workspace, test_patch)
    except PatchError as exc:
        raise InstanceError(f"{where}: field 'test_patch' does not apply to base_commit: {exc}") from None
    out: dict[str, str] = {}
    for path in touched:
        if not workspace.exists(path):
            raise InstanceError(
                f"{where}: field 'test_patch' deletes {path}; hidden tests can only add or change files"
            )
        out[path] = workspace.read_text(path)
    if not out:
        raise InstanceError(f"{where}: field 'test_patch' changes no file")
    return out


def task_fields(
    row: Mapping[str, Any], members: Mapping[str, bytes], *, where: str
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(the task row's fields, the snapshot's files) of one instance (module docstring)."""
    missing = [name for name in REQUIRED if name not in row]
    if missing:
        raise InstanceError(f"{where}: a SWE-bench instance needs field(s) {', '.join(missing)}")
    for name in ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement"):
        if not isinstance(row[name], str) or not row[name].strip():
            raise InstanceError(f"{where}: field {name!r} must be a non-empty string")
    repo = row["repo"].strip()
    name = row.get("snapshot_path") or bundle_path(repo)
    if not isinstance(name, str):
        raise InstanceError(f"{where}: field 'snapshot_path' must be the path of a git bundle in the upload")
    if not members:
        raise InstanceError(
            f"{where}: a SWE-bench instance needs its repository: upload a zip or tar.gz bundle holding tasks.jsonl "
            f"and {name} (git bundle create {name} --all)"
        )
    if name not in members:
        raise InstanceError(f"{where}: the upload has no {name} for repo {repo!r} (git bundle create {name} --all)")
    files = checkout(members[name], row["base_commit"].strip(), where=where, bundle_name=name)
    fail_to_pass = _test_ids(row, "FAIL_TO_PASS", where)
    pass_to_pass = _test_ids(row, "PASS_TO_PASS", where)
    source = {key: value for key, value in row.items() if key not in _OWN}
    fields: dict[str, Any] = {
        "id": row["instance_id"].strip(),
        "instruction": row["problem_statement"].strip(),
        "family": "imported",
        "hidden_tests": {
            "files": hidden_test_files(files, row["test_patch"], where=where),
            "fail_to_pass": fail_to_pass,
            "pass_to_pass": pass_to_pass,
        },
        "reference_patch": row["patch"],
        "source": {"kind": SOURCE_KIND, "repo": repo, **source},
        "provenance": {
            "kind": "imported",
            "ids": {"instance_id": row["instance_id"].strip(), "repo": repo, "base_commit": row["base_commit"]},
        },
    }
    return fields, files
