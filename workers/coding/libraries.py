"""The vendored libraries the task generator mutates (`workers.coding.generate`): each library's manifest and files,
and its test suite run in the sandbox with a small pytest plugin that reports every test's outcome and duration
(`run_tests`), three times on the pristine code for the baseline a candidate's run is compared against."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from workers.coding.archive import unpack
from workers.coding.execute import CommandLimits, CommandResult, run_command
from workers.coding.task import DEFAULT_TEST_COMMAND, node_id_file
from workers.coding.workspace import Snapshot, Workspace
from workers.sandbox import Outcome

_PLUGIN = "crucible_codegen_report"
_PLUGIN_DIR = ".crucible_codegen"
_REPORT = f"{_PLUGIN_DIR}/report.jsonl"
SOURCES_DIR = Path(__file__).with_name("sources")
MANIFEST = "manifest.json"


# --- sources ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LibrarySource:
    """One vendored sdist, as `sources/manifest.json` describes it."""

    name: str
    version: str
    filename: str
    sha256: str  # of the .tar.gz as published
    license: str
    url: str
    mutable: tuple[str, ...]  # globs of the files whose functions are mutated
    tests: tuple[str, ...]  # globs of the test files


# What an entry without "tests" or "mutable" gets: pytest's default test file names, and every other module but
# packaging, documentation and configuration files.
DEFAULT_TESTS = ("test_*.py", "*/test_*.py", "*_test.py", "tests.py", "*/tests.py")
DEFAULT_MUTABLE = ("*.py",)
_NEVER_MUTATED = ("setup.py", "conftest.py", "*/conftest.py", "noxfile.py", "docs/*", "doc/*", "*/_version.py")


def vendored_sources(directory: Path = SOURCES_DIR) -> dict[str, LibrarySource]:
    """The manifest's libraries by name (`tests` and `mutable` may be left out: DEFAULT_TESTS, DEFAULT_MUTABLE)."""
    manifest = json.loads((directory / MANIFEST).read_text())
    return {
        entry["name"]: LibrarySource(
            name=entry["name"],
            version=entry["version"],
            filename=entry["filename"],
            sha256=entry["sha256"],
            license=entry.get("license", ""),
            url=entry.get("url", ""),
            mutable=tuple(entry.get("mutable", DEFAULT_MUTABLE)),
            tests=tuple(entry.get("tests", DEFAULT_TESTS)),
        )
        for entry in manifest["sources"]
    }


@dataclass
class Library:
    """An unpacked library: its files, which of them are tests and which may be mutated."""

    source: LibrarySource
    files: dict[str, bytes]
    test_files: list[str]
    mutable_files: list[str]
    snapshot: Snapshot = field(repr=False)

    def text(self, path: str) -> str:
        return self.files[path].decode("utf-8")


def _matches(path: str, globs: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in globs)


def load_library(name: str, directory: Path = SOURCES_DIR) -> Library:
    """Unpack a vendored sdist after checking its sha256 against the manifest (ValueError when it differs)."""
    source = vendored_sources(directory)[name]
    data = (directory / source.filename).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != source.sha256:
        raise ValueError(f"{source.filename} has sha256 {digest}, not the manifest's {source.sha256}")
    files = unpack(data, strip_top=True)
    tests = sorted(p for p in files if _matches(p, source.tests))
    mutable = sorted(
        p
        for p in files
        if p.endswith(".py")
        and _matches(p, source.mutable)
        and p not in tests
        and not _matches(p, _NEVER_MUTATED)
        and not any(part in ("tests", "test") for part in PurePosixPath(p).parts[:-1])
    )
    return Library(source, files, tests, mutable, Snapshot.from_files(files))


# --- test runs -------------------------------------------------------------------------------------------------------


@dataclass
class TestRun:
    """One sandboxed pytest run: an outcome per test that ran, and pytest's crash message of those that failed."""

    __test__ = False  # not a pytest test class

    outcomes: dict[str, str]  # node id -> passed | failed | error | skipped
    messages: dict[str, str]  # node id -> crash message (failed or error)
    collect_errors: dict[str, str]  # test file -> message
    timed_out: bool
    ok: bool  # a report came back
    seconds: float
    detail: str = ""

    @property
    def passed(self) -> set[str]:
        return {node for node, outcome in self.outcomes.items() if outcome == "passed"}


def run_tests(workspace: Workspace, test_files: Sequence[str], limits: CommandLimits) -> TestRun:
    """Run the test files (pytest with our reporting plugin) against a copy of the workspace in the sandbox."""
    started = time.monotonic()
    # --tb=line: the crash message is all we read, and a mutation that fails hundreds of tests spends seconds
    # formatting their tracebacks otherwise.
    command = f"{DEFAULT_TEST_COMMAND} --tb=line {' '.join(test_files)} -p {_PLUGIN}"
    result = run_command(
        workspace,
        command,
        limits=limits,
        extra_files={f"{_PLUGIN_DIR}/{_PLUGIN}.py": _PLUGIN_SOURCE},
        apply_changes=False,
        env={"PYTHONPATH": _PLUGIN_DIR, "CRUCIBLE_CODEGEN_REPORT": _REPORT},
    )
    return _read_run(result, time.monotonic() - started)


def _read_run(result: CommandResult, seconds: float) -> TestRun:
    data = result.changed.get(_REPORT) or b""
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    collect_errors: dict[str, str] = {}
    finished = False
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if not isinstance(item, dict):
            continue
        if "collect_error" in item:
            collect_errors[str(item["collect_error"])] = str(item.get("message", ""))
        elif "exitstatus" in item:
            finished = True
        elif "node" in item:
            node, when, outcome = str(item["node"]), item.get("when"), item.get("outcome")
            if outcome == "failed":
                messages.setdefault(node, str(item.get("message", "")))
            if when == "setup":
                outcomes[node] = "error" if outcome == "failed" else ("skipped" if outcome == "skipped" else "set up")
            elif when == "call":
                outcomes[node] = str(outcome) if outcome in ("passed", "failed", "skipped") else "failed"
            elif when == "teardown" and outcome == "failed":
                outcomes[node] = "error"
    outcomes = {node: ("failed" if outcome == "set up" else outcome) for node, outcome in outcomes.items()}
    timed_out = result.outcome is Outcome.TIMEOUT
    detail = "" if finished else f"pytest did not finish: {result.detail or result.outcome.value}"
    if not data and not timed_out:
        last = next((x for x in reversed(result.stderr.splitlines() + result.stdout.splitlines()) if x), "")
        detail = f"no report from the test run ({result.detail}): {last[:300]}"
    return TestRun(outcomes, messages, collect_errors, timed_out, bool(data), seconds, detail)


@dataclass(frozen=True)
class Baseline:
    """The tests that pass on the pristine library (twice), by file, and how long the suite took."""

    passing: frozenset[str]
    by_file: dict[str, list[str]]
    seconds: float
    unstable: int  # tests that passed in one run and not the other
    failing: int  # tests that never passed in the sandbox


_baselines: dict[tuple[str, str], Baseline] = {}
_baselines_lock = threading.Lock()


BASELINE_RUNS = 3


def test_family(node_id: str) -> str:
    """A test function's id without its parameters: "t.py::test_f[1-2]" -> "t.py::test_f"."""
    return node_id.split("[", 1)[0]


def baseline(library: Library, limits: CommandLimits) -> Baseline:
    """Run the whole suite BASELINE_RUNS times on the pristine tree; cached per process by the tree's content hash.

    Kept: the tests that passed every time, less every parametrized test function whose ids changed between runs
    (isodate builds some parameter lists from sets of strings, whose order, and so the ids pytest numbers them
    by, changes with each run's hash seed: an id that exists in one run may not in the next, and a task naming it
    would find it "missing" after the fix)."""
    key = (library.snapshot.sha256, ",".join(library.test_files))
    with _baselines_lock:
        if key in _baselines:
            return _baselines[key]
    runs = [run_tests(Workspace(library.snapshot), library.test_files, limits) for _ in range(BASELINE_RUNS)]
    for run in runs:
        if not run.ok or run.timed_out:
            raise RuntimeError(f"the pristine {library.source.name} test suite did not run: {run.detail}")
    ever_passed: set[str] = set().union(*(run.passed for run in runs))
    always_passed = runs[0].passed.intersection(*(run.passed for run in runs[1:]))
    ids_by_run = [set(run.outcomes) for run in runs]
    all_ids: set[str] = set().union(*ids_by_run)
    shifting = {test_family(node) for node in all_ids - ids_by_run[0].intersection(*ids_by_run[1:])}
    passing = {node for node in always_passed if test_family(node) not in shifting}
    by_file: dict[str, list[str]] = {}
    for node in sorted(passing):
        by_file.setdefault(node_id_file(node), []).append(node)
    result = Baseline(
        passing=frozenset(passing),
        by_file=by_file,
        seconds=max(run.seconds for run in runs),
        unstable=len(ever_passed - passing),
        failing=len(all_ids - ever_passed),
    )
    with _baselines_lock:
        _baselines[key] = result
    return result


_PLUGIN_SOURCE = r'''
"""Report every test's outcome for Crucible's task generator (see workers/coding/generate.py)."""
import json
import os

_out = open(os.environ["CRUCIBLE_CODEGEN_REPORT"], "a", encoding="utf-8")
_names = {}
_state = {}


def _write(item):
    _out.write(json.dumps(item) + "\n")
    _out.flush()


def _relative(path, config):
    return os.path.relpath(str(path), str(config.invocation_params.dir)).replace(os.sep, "/")


def _message(report):
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message)[:1000]
    return str(report.longrepr or "")[-1000:]


def pytest_configure(config):
    _state["config"] = config


def pytest_collection_modifyitems(session, config, items):
    for item in items:
        rest = item.nodeid.split("::", 1)[1] if "::" in item.nodeid else ""
        _names[item.nodeid] = _relative(item.path, config) + ("::" + rest if rest else "")


def pytest_collectreport(report):
    if report.failed:
        config = _state.get("config")
        path = report.nodeid.split("::", 1)[0]
        if config is not None and path:
            path = _relative(os.path.join(str(config.rootpath), path), config)
        _write({"collect_error": path, "message": _message(report)})


def pytest_runtest_logreport(report):
    item = {"node": _names.get(report.nodeid, report.nodeid), "when": report.when, "outcome": report.outcome}
    if report.failed:
        item["message"] = _message(report)
    _write(item)


def pytest_sessionfinish(session, exitstatus):
    _write({"exitstatus": int(exitstatus)})
'''
