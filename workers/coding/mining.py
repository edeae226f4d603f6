"""Repository tasks mined from a git history (issue 40 part 3): a CursorBench analogue from real work.

Each commit that changes code and tests becomes a SWE-bench-style instance (`workers.coding.swebench`), which the
import then verifies in the sandbox like any other (`workers.jobs.repoimport`):
- its snapshot is the parent commit's tree; its instruction is the commit message, the under-specified request a
  developer actually wrote (subject and body);
- its hidden tests are the test files the commit adds or changes (`test_pattern`), its reference patch the rest
  of the commit (code, docs, data: every file that is not a test), multi-file changes kept;
- `FAIL_TO_PASS` and `PASS_TO_PASS` are found by running: the tests the changed test files hold are collected on
  the commit's tree, then run on the parent's tree with the new tests and on the commit's tree, each `runs` times
  (2 by default). A test that fails (or errors, or is missing) before and passes after is fail-to-pass; one that
  passes in every run of both is pass-to-pass; one whose outcome changes between runs of the same tree is flaky
  and left out. A commit with no fail-to-pass test is dropped ("no_fail_to_pass"), and so is one with a flaky
  fail-to-pass test.

Filters, each counted by reason in the report: merges and root commits; no code file changed; no test file added
or changed; the patch (non-test lines added + removed) outside `[min_lines, max_lines]`; more than `max_files`
files. Commits are read newest first, up to `max_commits`; `max_tasks` stops the mining once that many are kept.
Every instance records its commit time (`created_at`, kept in the task's `source`), so a benchmark pinned from the
suite keeps time order (`apps.datasets.services.dataset_version_split(by_time=True)`: train on older commits,
evaluate on newer ones).
"""

from __future__ import annotations

import re
import shlex
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from workers.coding.execute import CommandLimits, run_command
from workers.coding.hidden_tests import run_hidden_tests
from workers.coding.patches import PatchError, apply_patch
from workers.coding.swebench import _git, checkout
from workers.coding.task import DEFAULT_TEST_COMMAND, HiddenTests
from workers.coding.workspace import Snapshot, Workspace

DROP_REASONS = (
    "merge_or_root",
    "no_code_change",
    "no_test_change",
    "too_small",
    "too_large",
    "too_many_files",
    "patch_does_not_apply",
    "no_tests_collected",
    "no_fail_to_pass",
    "flaky",
)
_COLLECTED = re.compile(r"^(\S+\.py::\S.*?)\s*$", re.MULTILINE)


class MineParams(BaseModel):
    """What a mining run takes from a history (module docstring)."""

    model_config = ConfigDict(extra="forbid")
    max_commits: int = Field(default=200, ge=1, le=100_000, description="commits read, newest first")
    max_tasks: int = Field(default=50, ge=1, le=10_000, description="stop once this many tasks are kept")
    min_lines: int = Field(default=1, ge=1, description="fewest non-test lines changed (added + removed)")
    max_lines: int = Field(default=2_000, ge=1, description="most non-test lines changed")
    max_files: int = Field(default=40, ge=1, description="most files a commit changes")
    test_pattern: str = Field(
        default=r"(^|/)(tests?/.*\.py|test_[^/]*\.py|[^/]*_test\.py|conftest\.py)$",
        description="a path matching this is a test file (Python regular expression)",
    )
    code_pattern: str = Field(default=r"\.py$", description="a non-test path matching this is code")
    runs: int = Field(default=2, ge=1, le=5, description="runs of each tree, to find flaky tests")
    test_command: str = Field(default=DEFAULT_TEST_COMMAND, description="the pytest command the tests run with")
    ref: str = Field(default="HEAD", description="the branch, tag or commit whose history is mined")


@dataclass
class Candidate:
    commit: str
    parent: str
    timestamp: int
    message: str
    test_files: list[str]
    other_files: list[str]
    lines: int


@dataclass
class MineResult:
    instances: list[dict[str, Any]]
    report: dict[str, Any]
    dropped: Counter[str] = field(default_factory=Counter)


def git(git_dir: Path, *args: str) -> str:
    """git's output for `args` on the repository at `git_dir` (the import's runner: no hooks, no system config)."""
    return _git(f"--git-dir={git_dir}", *args, cwd=git_dir).decode("utf-8", "replace")


def resolve_git_dir(path: str | Path) -> Path:
    """The git directory of a clone (its `.git`) or of a bare repository; ValueError naming the path otherwise."""
    root = Path(path)
    for candidate in (root / ".git", root):
        if (candidate / "HEAD").is_file() and (candidate / "objects").is_dir():
            return candidate
    raise ValueError(f"{path} is not a git repository (no .git, and not a bare repository)")


def candidates(git_dir: Path, params: MineParams, dropped: Counter[str]) -> list[Candidate]:
    """The commits that pass the cheap filters (module docstring), newest first; `dropped` counts the others."""
    tests, code = re.compile(params.test_pattern), re.compile(params.code_pattern)
    log = git(git_dir, "log", f"-n{params.max_commits}", "--format=%x1e%H%x00%P%x00%ct%x00%B", params.ref)
    out: list[Candidate] = []
    for entry in log.split("\x1e")[1:]:
        commit, parents, stamp, message = entry.split("\x00", 3)
        if len(parents.split()) != 1:
            dropped["merge_or_root"] += 1
            continue
        parent = parents.strip()
        stats = git(git_dir, "diff", "--no-renames", "--numstat", parent, commit)
        deleted = set(git(git_dir, "diff", "--no-renames", "--name-only", "--diff-filter=D", parent, commit).split())
        rows = [line.split("\t", 2) for line in stats.splitlines() if line.count("\t") >= 2]
        test_files = [p for _, _, p in rows if tests.search(p) and p not in deleted]
        others = [(a, r, p) for a, r, p in rows if not tests.search(p)]
        if not any(code.search(p) for _, _, p in others):
            dropped["no_code_change"] += 1
            continue
        if not test_files:
            dropped["no_test_change"] += 1
            continue
        lines = sum(int(a) + int(r) for a, r, _ in others if a.isdigit() and r.isdigit())
        if len(rows) > params.max_files:
            dropped["too_many_files"] += 1
        elif lines < params.min_lines:
            dropped["too_small"] += 1
        elif lines > params.max_lines:
            dropped["too_large"] += 1
        else:
            out.append(
                Candidate(commit, parent, int(stamp), message.strip(), test_files, [p for *_, p in others], lines)
            )
    return out


def collected_ids(workspace: Workspace, test_files: Sequence[str], command: str, limits: CommandLimits) -> list[str]:
    """The node ids pytest collects from `test_files` in `workspace` (in the sandbox)."""
    present = [path for path in test_files if workspace.exists(path)]
    if not present:
        return []
    quoted = " ".join(shlex.quote(path) for path in present)
    quiet = len(re.findall(r"(?:^|\s)-q\b", command))  # one -q lists node ids; -qq only counts them per file
    flags = "--collect-only" + ("" if quiet == 1 else " -q" if quiet == 0 else "")
    result = run_command(workspace, f"{command} {flags} {quoted}", limits=limits, apply_changes=False)
    return list(dict.fromkeys(m.group(1) for m in _COLLECTED.finditer(result.stdout)))


def _outcomes(workspace: Workspace, tests: HiddenTests, runs: int, limits: CommandLimits) -> list[dict[str, str]]:
    return [run_hidden_tests(workspace, tests, limits=limits).outcomes for _ in range(runs)]


def classify(
    ids: Sequence[str], runs_before: Sequence[dict[str, str]], runs_after: Sequence[dict[str, str]]
) -> tuple[list[str], list[str], list[str]]:
    """(fail_to_pass, pass_to_pass, flaky) from each test's outcomes in repeated runs of the parent's tree (with the
    new tests) and of the commit's tree. A test whose outcome differs between runs of one tree is flaky and in
    neither list; "failed", "error" and "missing" before all count as not passing."""

    def outcome(runs: Sequence[dict[str, str]], node_id: str) -> str | None:
        seen = {run.get(node_id, "missing") for run in runs}
        return seen.pop() if len(seen) == 1 else None

    fail_to_pass: list[str] = []
    pass_to_pass: list[str] = []
    flaky: list[str] = []
    for node_id in ids:
        before, after = outcome(runs_before, node_id), outcome(runs_after, node_id)
        if before is None or after is None:
            flaky.append(node_id)
        elif after == "passed":
            (pass_to_pass if before == "passed" else fail_to_pass).append(node_id)
    return fail_to_pass, pass_to_pass, flaky


def mine_candidate(
    git_dir: Path, candidate: Candidate, params: MineParams, limits: CommandLimits
) -> tuple[dict[str, Any] | None, str | None]:
    """(the instance row, None), or (None, the reason it was dropped)."""
    where = f"commit {candidate.commit[:12]}"
    patch = git(git_dir, "diff", "--no-renames", candidate.parent, candidate.commit, "--", *candidate.other_files)
    test_patch = git(git_dir, "diff", "--no-renames", candidate.parent, candidate.commit, "--", *candidate.test_files)
    bundle = _bundle_of(git_dir)
    files = checkout(bundle, candidate.parent, where=where, bundle_name="history")
    before = Workspace(Snapshot.from_files(files))
    after = before.fork()
    try:
        apply_patch(before, test_patch)
        apply_patch(after, test_patch)
        apply_patch(after, patch)
    except PatchError:
        return None, "patch_does_not_apply"
    ids = collected_ids(after, candidate.test_files, params.test_command, limits)
    if not ids:
        return None, "no_tests_collected"
    hidden = HiddenTests(
        files={p: after.read_text(p) for p in candidate.test_files if after.exists(p)},
        command=params.test_command,
        fail_to_pass=ids,
    )
    runs_before = _outcomes(before, hidden, params.runs, limits)
    runs_after = _outcomes(after, hidden, params.runs, limits)
    fail_to_pass, pass_to_pass, flaky = classify(ids, runs_before, runs_after)
    if not fail_to_pass:
        return None, "flaky" if flaky else "no_fail_to_pass"
    created = datetime.fromtimestamp(candidate.timestamp, tz=UTC).isoformat()
    return {
        "instance_id": f"commit-{candidate.commit[:12]}",
        "repo": "",
        "base_commit": candidate.parent,
        "patch": patch,
        "test_patch": test_patch,
        "problem_statement": candidate.message or f"(commit {candidate.commit[:12]} has no message)",
        "FAIL_TO_PASS": fail_to_pass,
        "PASS_TO_PASS": pass_to_pass,
        "created_at": created,
        "commit": candidate.commit,
        "lines_changed": candidate.lines,
        "files_changed": len(candidate.other_files),
        "flaky_tests_left_out": flaky,
    }, None


_BUNDLES: dict[Path, bytes] = {}


def _bundle_of(git_dir: Path) -> bytes:
    """The repository as one git bundle (made once per repository and process), what an import bundle holds."""
    if git_dir not in _BUNDLES:
        with tempfile.TemporaryDirectory(prefix="crucible-mine-") as tmp:
            target = Path(tmp) / "history.bundle"
            git(git_dir, "bundle", "create", "-q", str(target), "--all")
            _BUNDLES[git_dir] = target.read_bytes()
    return _BUNDLES[git_dir]


def mine(
    path: str | Path,
    params: MineParams,
    *,
    repo: str,
    limits: CommandLimits | None = None,
    progress: Callable[[int, int, int], object] | None = None,
) -> MineResult:
    """Mine the history at `path` (module docstring). `repo` ("owner/name") names it in the instances.
    `progress(done, total, kept)` after each candidate."""
    git_dir = resolve_git_dir(path)
    limits = limits or CommandLimits(wall_seconds=120, cpu_seconds=120)
    dropped: Counter[str] = Counter({reason: 0 for reason in DROP_REASONS})
    found = candidates(git_dir, params, dropped)
    instances: list[dict[str, Any]] = []
    for done, candidate in enumerate(found, start=1):
        if len(instances) >= params.max_tasks:
            break
        row, reason = mine_candidate(git_dir, candidate, params, limits)
        if row is None:
            dropped[str(reason)] += 1
        else:
            instances.append({**row, "repo": repo})
        if progress is not None:
            progress(done, len(found), len(instances))
    report = {
        "commits_read": params.max_commits,
        "candidates": len(found),
        "kept": len(instances),
        "dropped": dict(dropped),
        "params": params.model_dump(mode="json"),
    }
    return MineResult(instances=instances, report=report, dropped=dropped)


def bundle_bytes(path: str | Path) -> bytes:
    """The git bundle of the repository at `path` (for the import's `repos/<owner>__<name>.bundle`)."""
    return _bundle_of(resolve_git_dir(path))
