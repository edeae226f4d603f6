"""workers.coding.verify and workers.coding.task: a task is kept only when its hidden tests prove something."""

from __future__ import annotations

from typing import Any

import pytest

from workers.coding.patches import make_patch
from workers.coding.stats import suite_statistics
from workers.coding.task import SCHEMA, RepoTask, RepoTaskError, is_unverified, parse_repo_task_row
from workers.coding.verify import NO_PATCH, verify_task
from workers.coding.workspace import Snapshot
from workers.envs.base import Environment

BUGGY = {"mathx/__init__.py": "def clamp(x, lo, hi):\n    return max(lo, x)\n", "README.md": "# mathx\n"}
FIXED = {**BUGGY, "mathx/__init__.py": "def clamp(x, lo, hi):\n    return min(hi, max(lo, x))\n"}
T = "tests/test_clamp.py"
TESTS = """\
import pytest
from mathx import clamp


def test_low():
    assert clamp(-1, 0, 5) == 0


@pytest.mark.parametrize("x", [6, 9])
def test_high(x):
    assert clamp(x, 0, 5) == 5
"""


def _row(**overrides: Any) -> dict[str, Any]:
    snapshot = Snapshot.from_files(BUGGY)
    row: dict[str, Any] = {
        "id": "mathx-clamp-1",
        "instruction": "clamp() lets values above the maximum through. Fix it.",
        "snapshot": {"sha256": snapshot.sha256, "uri": "", "file_count": len(snapshot)},
        "hidden_tests": {
            "files": {T: TESTS},
            "fail_to_pass": [f"{T}::test_high[6]", f"{T}::test_high[9]"],
            "pass_to_pass": [f"{T}::test_low"],
        },
        "reference_patch": make_patch(BUGGY, FIXED),
        "family": "repair",
        "provenance": {"kind": "imported", "ids": {"ticket": "ENG-1"}},
    }
    row.update(overrides)
    return row


def _task(**overrides: Any) -> RepoTask:
    return parse_repo_task_row(_row(**overrides), index=1)


def test_a_sound_task_is_verified() -> None:
    verification = verify_task(_task(), Snapshot.from_files(BUGGY))
    assert verification.ok, verification.reason
    assert verification.reason == ""
    assert verification.before is not None and verification.before.fail_to_pass_passed == 0
    assert verification.after is not None and verification.after.resolved


def test_a_vacuous_task_is_refused_naming_the_tests_that_already_pass() -> None:
    task = _task(hidden_tests={"files": {T: TESTS}, "fail_to_pass": [f"{T}::test_low", f"{T}::test_high[9]"]})
    verification = verify_task(task, Snapshot.from_files(BUGGY))
    assert not verification.ok
    assert verification.reason.startswith("vacuous task")
    assert f"{T}::test_low (passed)" in verification.reason and "test_high" not in verification.reason


def test_a_reference_patch_that_does_not_apply_is_refused_with_the_hunk() -> None:
    stale = {"mathx/__init__.py": "def clamp(x, lo, hi):\n    return x\n"}
    patch = make_patch(stale, {"mathx/__init__.py": FIXED["mathx/__init__.py"]})
    verification = verify_task(_task(reference_patch=patch), Snapshot.from_files(BUGGY))
    assert not verification.ok
    assert verification.reason.startswith("the reference patch does not apply: mathx/__init__.py: hunk 1")
    assert verification.before is None  # refused before any test ran


def test_a_reference_patch_that_does_not_fix_the_tests_is_refused() -> None:
    half = {**BUGGY, "mathx/__init__.py": "def clamp(x, lo, hi):\n    return min(hi, x) if x > 7 else max(lo, x)\n"}
    verification = verify_task(_task(reference_patch=make_patch(BUGGY, half)), Snapshot.from_files(BUGGY))
    assert not verification.ok
    assert "do not pass" in verification.reason and f"{T}::test_high[6] (failed)" in verification.reason
    assert f"{T}::test_high[9]" not in verification.reason


@pytest.mark.parametrize("patch", [None, "", "  \n"], ids=["null", "empty", "blank"])
def test_a_task_without_a_reference_patch_is_refused_naming_the_field_and_the_fix(patch: str | None) -> None:
    verification = verify_task(_task(reference_patch=patch), Snapshot.from_files(BUGGY))
    assert not verification.ok and not verification.verified
    assert verification.reason == NO_PATCH
    assert "field 'reference_patch' is missing or empty" in verification.reason
    assert '"unverified": true' in verification.reason
    assert verification.before is None  # refused before any test ran


def test_a_task_with_no_reference_patch_field_at_all_is_refused() -> None:
    row = _row()
    del row["reference_patch"]
    verification = verify_task(parse_repo_task_row(row, index=1), Snapshot.from_files(BUGGY))
    assert not verification.ok and verification.reason == NO_PATCH


def test_an_unverified_task_gets_the_snapshot_check_only_and_is_not_called_verified() -> None:
    verification = verify_task(_task(reference_patch=None, unverified=True), Snapshot.from_files(BUGGY))
    assert verification.ok and verification.after is None and not verification.verified
    assert verification.before is not None and verification.before.fail_to_pass_passed == 0
    # The snapshot check still refuses a vacuous one.
    vacuous = _task(
        reference_patch=None, unverified=True, hidden_tests={"files": {T: TESTS}, "fail_to_pass": [f"{T}::test_low"]}
    )
    assert verify_task(vacuous, Snapshot.from_files(BUGGY)).reason.startswith("vacuous task")


def test_a_verified_task_is_called_verified() -> None:
    assert verify_task(_task(), Snapshot.from_files(BUGGY)).verified


def test_a_snapshot_of_other_files_is_refused() -> None:
    verification = verify_task(_task(), Snapshot.from_files(FIXED))
    assert not verification.ok and "content hash" in verification.reason


# --- task rows -------------------------------------------------------------------------------------------------------


def test_an_unverified_row_round_trips_and_a_verified_row_does_not_carry_the_flag() -> None:
    assert "unverified" not in _task().to_row()  # verified rows are byte-for-byte what they were
    task = _task(reference_patch="", unverified=True)
    row = task.to_row()
    assert row["unverified"] is True and row["reference_patch"] is None
    assert parse_repo_task_row(row, index=1) == task
    assert is_unverified(row) and not is_unverified(_task().to_row())
    legacy = {**_task().to_row(), "reference_patch": None}  # stored before patchless imports were refused
    assert is_unverified(legacy)
    statistics = suite_statistics([row, legacy, _task().to_row()])
    assert statistics["unverified"] == 2 and statistics["tasks"] == 3


def test_a_row_round_trips_and_passes_the_generic_environment_row_check() -> None:
    task = _task()
    row = task.to_row()
    assert row["schema"] == SCHEMA and row["prompt"] == task.instruction and row["answer"] is None
    assert parse_repo_task_row(row, index=1) == task
    checked = _RepoTaskEnvironment.validate_task_row(row, index=1)  # the generic check every environment runs
    assert checked.id == task.id and checked.prompt == task.instruction and checked.answer is None


class _RepoTaskEnvironment(Environment):
    """Only its class attributes matter here: what a repository-task environment requires of a row."""

    name = "repo-task-rows"
    required_task_fields = frozenset({"id", "prompt", "snapshot", "hidden_tests"})


@pytest.mark.parametrize(
    ("overrides", "field", "words"),
    [
        ({"instruction": "   "}, "instruction", "blank"),
        ({"instruction": "x" * 4001}, "instruction", "4000"),
        ({"family": "refactor"}, "family", "'repair'"),
        ({"snapshot": {"sha256": "abc"}}, "snapshot.sha256", "64 lowercase hex"),
        ({"hidden_tests": {"files": {"/abs.py": ""}, "fail_to_pass": ["a.py::t"]}}, "hidden_tests.files", "absolute"),
        ({"hidden_tests": {"files": {"../up.py": ""}, "fail_to_pass": ["a.py::t"]}}, "hidden_tests.files", "'..'"),
        ({"hidden_tests": {"fail_to_pass": []}}, "hidden_tests.fail_to_pass", "at least one"),
        ({"hidden_tests": {"fail_to_pass": ["a.py::t", "a.py::t"]}}, "hidden_tests.fail_to_pass", "twice"),
        ({"hidden_tests": {"fail_to_pass": ["a.py::t"], "pass_to_pass": ["a.py::t"]}}, "hidden_tests", "both"),
        ({"hidden_tests": {"fail_to_pass": ["../a.py::t"]}}, "hidden_tests.fail_to_pass", "'..'"),
        ({"provenance": {"kind": "scraped"}}, "provenance", "'generated'"),
        ({"hidden_test": {}}, "hidden_test", "unknown field"),
        ({"schema": "repo_task/v0"}, "schema", "repo_task/v1"),
        ({"unverified": True}, "unverified", "remove it to have the patch verified"),
        ({"unverified": "yes", "reference_patch": None}, "unverified", "true or false"),
    ],
)
def test_a_bad_row_is_refused_naming_the_row_and_field(overrides: dict[str, Any], field: str, words: str) -> None:
    row = _row(**overrides)
    with pytest.raises(RepoTaskError) as caught:
        parse_repo_task_row(row, index=7)
    assert caught.value.field == field
    assert str(caught.value).startswith("task row 7: ") and words in str(caught.value)


def test_a_row_missing_a_field_names_it_and_the_fix() -> None:
    row = _row()
    del row["hidden_tests"]
    with pytest.raises(RepoTaskError, match="missing field 'hidden_tests'; give"):
        parse_repo_task_row(row, index=2)
