"""Run a task's hidden tests against a workspace, in a fresh sandbox, and read one outcome per listed test.

    report = run_hidden_tests(workspace, task.hidden_tests)
    report.fraction, report.resolved, report.outcomes["tests/test_x.py::test_y[1-2]"]

How. On a fork of the workspace (the caller's is never changed), the hidden test files are written over whatever
the agent left at those paths; then `tests.command` runs through `execute.run_command` with the *files* of the
listed node ids appended, and a small pytest plugin (`-p crucible_hidden_report`, written beside the tests in a
`.crucible_hidden/` folder) keeps only the listed tests and appends one JSON line per test phase to a report file,
flushed as it goes, so a run killed half-way still tells what ran. Giving pytest files rather than node ids means
an id that no longer exists is reported "missing" instead of failing the whole run (pytest refuses unknown ids),
and no id ever passes through a shell.

Outcomes: "passed", "failed" (the test body failed), "error" (its setup or teardown failed, or its file could not
be collected), "skipped" (skip or xfail), "missing" (it never ran: not collected, or the run ended first). A node id
is matched as pytest prints it relative to the directory the command runs in (the repository root); an id
without parameters ("t.py::test_p") that the file only has parametrized ("t.py::test_p[1]", ...) stands for all of
them: passed when every one passed.

The command must be a pytest invocation (it receives `-p` and file paths). A timeout or a crash leaves the ids
that did not finish "missing" and says why in `detail`.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, field

from workers.coding.execute import CommandLimits, CommandResult, run_command
from workers.coding.task import HiddenTests, node_id_file
from workers.coding.workspace import Workspace
from workers.sandbox import Outcome

PLUGIN = "crucible_hidden_report"
_DIR = ".crucible_hidden"
_IDS = f"{_DIR}/ids.json"
_REPORT = f"{_DIR}/report.jsonl"

_PASSED = "passed"
_ORDER = {"passed": 0, "skipped": 1, "failed": 2, "error": 3, "missing": 4}  # worse is higher


@dataclass
class TestReport:
    """Per-test outcomes of one hidden-test run, and the counts a reward reads."""

    __test__ = False  # not a pytest test class, whatever its name

    outcomes: dict[str, str]  # node id -> passed | failed | error | skipped | missing
    fail_to_pass_passed: int
    fail_to_pass_total: int
    pass_to_pass_passed: int
    pass_to_pass_total: int
    seconds: float
    detail: str = ""  # one line when the run itself went wrong (timeout, collection error, no report)
    command_result: CommandResult | None = field(default=None, repr=False)

    @property
    def fraction(self) -> float:
        """Passed listed tests over all listed tests (fail_to_pass and pass_to_pass alike)."""
        total = self.fail_to_pass_total + self.pass_to_pass_total
        return (self.fail_to_pass_passed + self.pass_to_pass_passed) / total if total else 0.0

    @property
    def resolved(self) -> bool:
        """Every fail_to_pass and every pass_to_pass test passed (SWE-bench's "resolved")."""
        return (
            self.fail_to_pass_passed == self.fail_to_pass_total and self.pass_to_pass_passed == self.pass_to_pass_total
        )

    def not_passed(self, ids: list[str]) -> dict[str, str]:
        """The ids of `ids` that did not pass, with their outcome."""
        return {
            node_id: self.outcomes.get(node_id, "missing") for node_id in ids if self.outcomes.get(node_id) != _PASSED
        }


def run_hidden_tests(workspace: Workspace, tests: HiddenTests, *, limits: CommandLimits | None = None) -> TestReport:
    """Run `tests` against a fork of `workspace` in a fresh sandbox (see the module docstring)."""
    started = time.monotonic()
    trial = workspace.fork()
    for path, text in tests.files.items():
        if trial.is_dir(path):
            for inner in trial.list_files(path):  # the agent made a directory where a test file goes
                trial.delete(inner)
        parts = path.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if trial.exists(parent):  # ... or a file where the tests need a directory
                trial.delete(parent)
        trial.write_text(path, text)
    listed = tests.node_ids
    files = sorted({node_id_file(node_id) for node_id in listed})
    absent = [path for path in files if not trial.exists(path)]
    present = [path for path in files if path not in absent]
    outcomes: dict[str, str] = {node_id: "missing" for node_id in listed}
    detail = ""
    result: CommandResult | None = None
    if present:
        command = f"{tests.command} {' '.join(shlex.quote(path) for path in present)} -p {PLUGIN}"
        result = run_command(
            trial,
            command,
            limits=limits or CommandLimits(),
            extra_files={f"{_DIR}/{PLUGIN}.py": _PLUGIN_SOURCE, _IDS: json.dumps(listed)},
            apply_changes=False,
            env={"PYTHONPATH": _DIR, "CRUCIBLE_HIDDEN_IDS": _IDS, "CRUCIBLE_HIDDEN_REPORT": _REPORT},
        )
        lines = _report_lines(result)
        outcomes.update(_fold(lines, listed))
        detail = _detail(result, lines, outcomes)
    if absent:
        missing = f"test file(s) not in the workspace: {', '.join(absent[:5])}"
        detail = f"{detail}; {missing}" if detail else missing
    f2p = sum(outcomes[node_id] == _PASSED for node_id in tests.fail_to_pass)
    p2p = sum(outcomes[node_id] == _PASSED for node_id in tests.pass_to_pass)
    return TestReport(
        outcomes=outcomes,
        fail_to_pass_passed=f2p,
        fail_to_pass_total=len(tests.fail_to_pass),
        pass_to_pass_passed=p2p,
        pass_to_pass_total=len(tests.pass_to_pass),
        seconds=time.monotonic() - started,
        detail=detail,
        command_result=result,
    )


def _report_lines(result: CommandResult) -> list[dict[str, object]]:
    data = result.changed.get(_REPORT)
    if not data:
        return []
    lines: list[dict[str, object]] = []
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue  # a line cut by a kill
        if isinstance(item, dict):
            lines.append(item)
    return lines


def _fold(lines: list[dict[str, object]], listed: list[str]) -> dict[str, str]:
    """One outcome per listed id from the plugin's phase lines."""
    per_node: dict[str, str] = {}  # the node id as run (parametrized ones apart) -> outcome
    owner: dict[str, str] = {}  # that node id -> the listed id it counts for
    collect_errors: set[str] = set()
    for item in lines:
        if "collect_error" in item:
            collect_errors.add(str(item["collect_error"]))
            continue
        node, listed_id, phase, outcome = (str(item.get(k, "")) for k in ("node", "listed", "when", "outcome"))
        if not node or not listed_id:
            continue
        owner[node] = listed_id
        previous = per_node.get(node)
        if phase == "setup":
            per_node[node] = "error" if outcome == "failed" else ("skipped" if outcome == "skipped" else "running")
        elif phase == "call":
            per_node[node] = outcome if outcome in ("passed", "failed", "skipped") else "failed"
        elif phase == "teardown" and outcome == "failed" and previous in ("passed", "running", None):
            per_node[node] = "error"
    folded: dict[str, str] = {}
    for node, outcome in per_node.items():
        outcome = "missing" if outcome == "running" else outcome  # set up, never finished: the run was cut
        listed_id = owner[node]
        if listed_id not in folded or _ORDER[outcome] > _ORDER[folded[listed_id]]:
            folded[listed_id] = outcome
    for node_id in listed:
        if node_id not in folded and node_id_file(node_id) in collect_errors:
            folded[node_id] = "error"
    return folded


def _detail(result: CommandResult, lines: list[dict[str, object]], outcomes: dict[str, str]) -> str:
    reasons: list[str] = []
    if result.outcome is Outcome.TIMEOUT:
        reasons.append(f"the test run timed out: {result.detail}")
    elif result.outcome in (Outcome.MEMORY, Outcome.KILLED, Outcome.ERROR):
        reasons.append(f"the test run ended abnormally: {result.detail}")
    errors = [str(item["collect_error"]) for item in lines if "collect_error" in item]
    for item in lines:
        if "collect_error" in item:
            message = str(item.get("message", "")).strip().splitlines()
            reasons.append(f"collection error in {item['collect_error']}: {message[-1] if message else '?'}")
    exit_status = next((item.get("exitstatus") for item in lines if "exitstatus" in item), None)
    if not lines and result.outcome is not Outcome.TIMEOUT:
        last = next((line for line in reversed(result.stderr.splitlines() + result.stdout.splitlines()) if line), "")
        reasons.append(f"the test run produced no report (exit status {result.exit_code}): {last[:300]}")
    elif exit_status in (2, 3, 4) and not errors:
        reasons.append(f"pytest stopped early (exit status {exit_status})")
    if not reasons and all(outcome == "missing" for outcome in outcomes.values()):
        reasons.append("none of the listed tests ran (are the node ids right?)")
    return "; ".join(reasons)


# The pytest plugin, imported by `-p crucible_hidden_report` inside the sandbox. Standard library and pytest only.
_PLUGIN_SOURCE = r'''
"""Keep only the tests Crucible lists; one JSON line per test phase (see workers/coding/hidden_tests.py)."""
import json
import os

import pytest

_listed = set(json.load(open(os.environ["CRUCIBLE_HIDDEN_IDS"], encoding="utf-8")))
_out = open(os.environ["CRUCIBLE_HIDDEN_REPORT"], "a", encoding="utf-8")
_owner = {}  # pytest's node id -> the listed id it counts for
_state = {}


def _write(item):
    _out.write(json.dumps(item) + "\n")
    _out.flush()


def _relative(path, config):
    return os.path.relpath(str(path), str(config.invocation_params.dir)).replace(os.sep, "/")


def pytest_configure(config):
    _state["config"] = config


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    kept, dropped = [], []
    for item in items:
        rest = item.nodeid.split("::", 1)[1] if "::" in item.nodeid else ""
        name = _relative(item.path, config) + ("::" + rest if rest else "")
        base = name.split("[", 1)[0] if "[" in name else None
        if name in _listed:
            _owner[item.nodeid] = name
        elif base is not None and base in _listed:
            _owner[item.nodeid] = base
        else:
            dropped.append(item)
            continue
        kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept


def pytest_collectreport(report):
    if report.failed:
        config = _state.get("config")
        path = report.nodeid.split("::", 1)[0]
        if config is not None and path:
            path = _relative(os.path.join(str(config.rootpath), path), config)
        _write({"collect_error": path, "message": str(report.longrepr)[-2000:]})


def pytest_runtest_logreport(report):
    listed = _owner.get(report.nodeid)
    if listed is not None:
        _write({"node": report.nodeid, "listed": listed, "when": report.when, "outcome": report.outcome})


def pytest_sessionfinish(session, exitstatus):
    _write({"exitstatus": int(exitstatus)})
'''
