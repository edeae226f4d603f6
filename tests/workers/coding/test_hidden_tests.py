"""workers.coding.hidden_tests: per-test outcomes of a task's hidden tests, read from a real pytest run."""

from __future__ import annotations

import pytest

from workers.coding.execute import CommandLimits
from workers.coding.hidden_tests import run_hidden_tests
from workers.coding.task import HiddenTests
from workers.coding.workspace import Snapshot, Workspace

MODULE = "def clamp(x, lo, hi):\n    return max(lo, x)\n"  # the bug: the upper bound is ignored
TESTS = """\
import pytest
from mathx import clamp


def test_low():
    assert clamp(-1, 0, 5) == 0


def test_high():
    assert clamp(9, 0, 5) == 5


@pytest.mark.parametrize("x, expected", [(1, 1), (7, 5)])
def test_param(x, expected):
    assert clamp(x, 0, expected if x < 5 else 5) == expected


@pytest.fixture
def broken():
    raise RuntimeError("fixture broke")


def test_with_broken_fixture(broken):
    pass


@pytest.mark.skip(reason="not today")
def test_skipped():
    pass
"""
T = "tests/test_clamp.py"


@pytest.fixture
def workspace() -> Workspace:
    return Workspace(Snapshot.from_files({"mathx/__init__.py": MODULE, "README.md": "# mathx\n"}))


def test_each_listed_id_gets_its_outcome_and_parametrized_ids_map_back(workspace: Workspace) -> None:
    tests = HiddenTests(
        files={T: TESTS},
        fail_to_pass=[f"{T}::test_high", f"{T}::test_param[7-5]", f"{T}::test_no_such_test"],
        pass_to_pass=[
            f"{T}::test_low",
            f"{T}::test_param[1-1]",
            f"{T}::test_with_broken_fixture",
            f"{T}::test_skipped",
        ],
    )
    report = run_hidden_tests(workspace, tests)
    assert report.outcomes == {
        f"{T}::test_high": "failed",
        f"{T}::test_param[7-5]": "failed",
        f"{T}::test_no_such_test": "missing",
        f"{T}::test_low": "passed",
        f"{T}::test_param[1-1]": "passed",
        f"{T}::test_with_broken_fixture": "error",
        f"{T}::test_skipped": "skipped",
    }
    assert (report.fail_to_pass_passed, report.fail_to_pass_total) == (0, 3)
    assert (report.pass_to_pass_passed, report.pass_to_pass_total) == (2, 4)
    assert report.fraction == pytest.approx(2 / 7)
    assert not report.resolved
    assert report.detail == ""
    assert workspace.changed_paths() == []  # the hidden tests went to a fork


def test_an_id_without_parameters_stands_for_all_its_cases(workspace: Workspace) -> None:
    workspace.write_text("mathx/__init__.py", "def clamp(x, lo, hi):\n    return min(hi, max(lo, x))\n")
    tests = HiddenTests(files={T: TESTS}, fail_to_pass=[f"{T}::test_param", f"{T}::test_high"])
    report = run_hidden_tests(workspace, tests)
    assert report.outcomes == {f"{T}::test_param": "passed", f"{T}::test_high": "passed"}
    assert report.resolved and report.fraction == 1.0


def test_hidden_files_overwrite_what_the_agent_wrote(workspace: Workspace) -> None:
    workspace.write_text(T, "def test_high():\n    pass\n")  # the agent "fixed" the test instead of the code
    report = run_hidden_tests(workspace, HiddenTests(files={T: TESTS}, fail_to_pass=[f"{T}::test_high"]))
    assert report.outcomes == {f"{T}::test_high": "failed"}
    assert workspace.read_text(T) == "def test_high():\n    pass\n"


def test_a_collection_error_is_an_error_with_the_reason(workspace: Workspace) -> None:
    broken = "import nonexistent_module\n\ndef test_high():\n    pass\n"
    report = run_hidden_tests(workspace, HiddenTests(files={T: broken}, fail_to_pass=[f"{T}::test_high"]))
    assert report.outcomes == {f"{T}::test_high": "error"}
    assert "collection error in tests/test_clamp.py" in report.detail and "nonexistent_module" in report.detail


def test_a_run_that_times_out_passes_nothing_and_says_so(workspace: Workspace) -> None:
    hanging = "import time\n\ndef test_low():\n    pass\n\ndef test_hang():\n    time.sleep(60)\n"
    tests = HiddenTests(files={T: hanging}, fail_to_pass=[f"{T}::test_hang"], pass_to_pass=[f"{T}::test_low"])
    report = run_hidden_tests(workspace, tests, limits=CommandLimits(wall_seconds=3))
    assert report.outcomes[f"{T}::test_hang"] == "missing"
    assert report.outcomes[f"{T}::test_low"] == "passed"  # written before the kill: the report is flushed per test
    assert "timed out" in report.detail
    assert not report.resolved


def test_a_test_file_that_is_nowhere_leaves_its_ids_missing(workspace: Workspace) -> None:
    report = run_hidden_tests(workspace, HiddenTests(files={}, fail_to_pass=["tests/test_absent.py::test_x"]))
    assert report.outcomes == {"tests/test_absent.py::test_x": "missing"}
    assert "not in the workspace: tests/test_absent.py" in report.detail
