"""The repository-task generator (issue 17 §1): tasks from real libraries' source distributions and their own tests.

    params = CodegenParams(sources=["toolz"], max_tasks=10, seed=0)
    result = generate_tasks(params, on_progress=lambda checked, kept, dropped: ...)
    result.tasks        # [RepoTask], verified; snapshot.uri left empty (the job names where each archive goes)
    result.snapshots    # {sha256: canonical tar.gz bytes}, one per distinct snapshot
    result.report       # JSON-able: kept and dropped candidates by reason, per source, family and operator; stats

How, in the manner of SWE-smith (repair) and Commit0 (implement):

1. Each library is a vendored sdist under `sources/` (`manifest.json` names the file, its sha256, its licence, the
   files that may be mutated and the test files). It is unpacked with `archive.unpack(strip_top=True)` and its
   whole test suite runs three times in the sandbox on the pristine tree; the tests that passed every time are
   the baseline (cached per process by the tree's content hash). A test that fails in the sandbox (toolz's
   multiprocessing test: no /dev/shm there), passes only sometimes, or whose parametrized id changes between runs
   is never used.
2. Candidates. Every function and method of the mutable files (`mutations.find_functions`). *repair*: up to
   `mutations_per_function` single-site mutations per function (`mutations.repair_mutations`, distinct operators
   first), plus, for a share of them, a mutation of two functions of one file at once. *implement*: the body
   after the docstring replaced by `raise NotImplementedError` (functions with a docstring only: it is where the
   instruction comes from). Each library's and family's list is shuffled by the seed, then the lists are
   interleaved, so a small `max_tasks` still spreads over sources and families.
3. Check (`workers` candidates at a time, each a sandboxed pytest run, so threads are enough): the mutated tree's
   related tests run (the test files named after the module or that mention the function, or its class for a
   method; all of them when none does, or with `test_scope="all"`). The baseline tests that no longer pass are
   fail_to_pass; none: dropped, "tests do not catch it". The test files holding them are the hidden tests, removed
   from the snapshot the agent gets; pass_to_pass is a seeded sample of up to `max_pass_to_pass` tests of those
   files that still pass. The reference patch is the diff that restores the original. The instruction is written
   by `instructions.write_instruction` from the failing tests' names and pytest's crash messages, never their
   source.
4. Every kept task goes through `verify.verify_task` (its hidden tests fail on the snapshot and pass with the
   reference patch): a second, independent run. A fail_to_pass test that passes there is "flaky (passes on rerun)".

Drop reasons (the report's keys): "mutation does not parse", "equivalent (no code change)", "duplicate" (the same
mutated file as an earlier candidate), "function already has a task" (`max_tasks_per_function`), "tests do not
catch it", "too broad" (more than `max_fail_to_pass` test functions fail, a parametrized one counting once), "too
slow" (the test run hit its time limit), "test run failed" (no report came back from the sandbox), "flaky (passes
on rerun)", "verification failed".

Determinism: candidates are enumerated and shuffled from (sources, params, seed) alone, checked concurrently but
consumed in queue order, and the run stops at the first `max_tasks` kept in that order, so the same inputs give
the same tasks, rows and report (timings aside) whatever the number of workers.
"""

from __future__ import annotations

import logging
import random
import statistics
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.coding.archive import content_hash, pack
from workers.coding.candidates import Candidate, CodegenParams, candidate_queue, related_test_files
from workers.coding.instructions import InstructionFacts, write_instruction
from workers.coding.libraries import (
    SOURCES_DIR,
    Baseline,
    Library,
    TestRun,
    baseline,
    load_library,
    run_tests,
    test_family,
)
from workers.coding.mutations import (
    changes_code,
    find_functions,
)
from workers.coding.patches import make_patch
from workers.coding.stats import suite_statistics
from workers.coding.task import DEFAULT_TEST_COMMAND, HiddenTests, RepoTask, SnapshotRef, node_id_file
from workers.coding.verify import verify_task
from workers.coding.workspace import Snapshot, Workspace

log = logging.getLogger("crucible.codegen")

REPORT_SCHEMA = "codegen_report/v1"

# Drop reasons, in the order the checks meet them.
NO_PARSE = "mutation does not parse"
EQUIVALENT = "equivalent (no code change)"
DUPLICATE = "duplicate"
FUNCTION_TAKEN = "function already has a task"
NOT_CAUGHT = "tests do not catch it"
TOO_BROAD = "too broad"
TOO_SLOW = "too slow"
RUN_FAILED = "test run failed"
FLAKY = "flaky (passes on rerun)"
VERIFY_FAILED = "verification failed"
DROP_REASONS = (
    NO_PARSE,
    EQUIVALENT,
    DUPLICATE,
    FUNCTION_TAKEN,
    NOT_CAUGHT,
    TOO_BROAD,
    TOO_SLOW,
    RUN_FAILED,
    FLAKY,
    VERIFY_FAILED,
)


# --- checking one candidate ------------------------------------------------------------------------------------------


@dataclass
class CandidateOutcome:
    """What became of one candidate: kept (with its task and snapshot archive) or dropped with a reason."""

    candidate: Candidate
    reason: str | None  # None: kept
    detail: str = ""
    task: RepoTask | None = None
    archive: bytes | None = None
    fail_to_pass: int = 0
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)  # seconds of the test run and of the verification

    def entry(self) -> dict[str, Any]:
        """The report's line for this candidate."""
        mutation = self.candidate.mutation
        return {
            "id": self.candidate.id,
            "library": self.candidate.library,
            "family": self.candidate.family,
            "operator": mutation.operator,
            "path": mutation.path,
            "function": mutation.function,
            "line": mutation.line,
            "mutation": mutation.detail,
            "outcome": "kept" if self.reason is None else self.reason,
            "detail": self.detail,
            "fail_to_pass": self.fail_to_pass,
            "task_id": self.task.id if self.task is not None else None,
            "seconds": round(self.seconds, 2),
            "timings": {name: round(value, 2) for name, value in self.timings.items()},
        }


def check_candidate(library: Library, base: Baseline, candidate: Candidate, params: CodegenParams) -> CandidateOutcome:
    """Run the library's related tests on the mutated tree; build, verify and return the task if they catch it."""
    started = time.monotonic()

    timings: dict[str, float] = {}

    def dropped(reason: str, detail: str = "", fail_to_pass: int = 0) -> CandidateOutcome:
        elapsed = time.monotonic() - started
        return CandidateOutcome(candidate, reason, detail, fail_to_pass=fail_to_pass, seconds=elapsed, timings=timings)

    path = candidate.mutation.path
    original = library.text(path)
    try:
        mutated = candidate.mutation.apply(original)
    except ValueError as exc:
        return dropped(NO_PARSE, str(exc))
    if not changes_code(original, mutated):
        try:
            compile(mutated, path, "exec")
        except (SyntaxError, ValueError) as exc:
            return dropped(NO_PARSE, f"{type(exc).__name__}: {exc}")
        return dropped(EQUIVALENT, "the mutated file has the same syntax tree")
    runnable = sorted(base.by_file)
    scope = related_test_files(library, candidate, params.test_scope, runnable)
    workspace = Workspace(library.snapshot)
    workspace.write_text(path, mutated)
    limits = params.limits(base.seconds)
    run = run_tests(workspace, scope, limits)
    timings["tests"] = run.seconds
    if run.timed_out:
        return dropped(TOO_SLOW, f"the tests ran past {limits.wall_seconds:g} s")
    if not run.ok:
        return dropped(RUN_FAILED, run.detail)
    expected = [node for file in scope for node in base.by_file.get(file, [])]
    failing = [node for node in expected if run.outcomes.get(node) != "passed"]
    if not failing:
        return dropped(NOT_CAUGHT, f"{len(expected)} tests in {len(scope)} file(s) still pass")
    broken = {test_family(node) for node in failing}  # test functions: a parametrized one counts once
    if len(broken) > params.max_fail_to_pass:
        detail = f"{len(broken)} test functions fail ({len(failing)} tests; limit {params.max_fail_to_pass})"
        return dropped(TOO_BROAD, detail, len(failing))
    task, snapshot = build_task(library, candidate, mutated, failing, run, base, params)
    verifying = time.monotonic()
    verification = verify_task(task, snapshot, limits=limits)
    timings["verify"] = time.monotonic() - verifying
    if not verification.ok:
        reason = FLAKY if verification.reason.startswith("vacuous") else VERIFY_FAILED
        return dropped(reason, verification.reason[:500], len(failing))
    return CandidateOutcome(
        candidate,
        None,
        f"{len(failing)} failing, {len(task.hidden_tests.pass_to_pass)} kept passing",
        task=task,
        archive=pack(snapshot.files),
        fail_to_pass=len(failing),
        seconds=time.monotonic() - started,
        timings=timings,
    )


def build_task(
    library: Library,
    candidate: Candidate,
    mutated: str,
    failing: list[str],
    run: TestRun,
    base: Baseline,
    params: CodegenParams,
) -> tuple[RepoTask, Snapshot]:
    """The task for a caught candidate: its snapshot (the mutated tree less the hidden test files), hidden tests,
    reference patch and instruction."""
    source = library.source
    path = candidate.mutation.path
    hidden_paths = sorted({node_id_file(node) for node in failing})
    hidden = {p: library.text(p) for p in hidden_paths}
    still_passing = [
        node
        for p in hidden_paths
        for node in base.by_file.get(p, [])
        if node not in failing and run.outcomes.get(node) == "passed"
    ]
    rng = random.Random(f"{params.seed}:{candidate.id}:pass_to_pass")
    pass_to_pass = sorted(rng.sample(still_passing, min(params.max_pass_to_pass, len(still_passing))))
    files = {p: content for p, content in library.files.items() if p not in hidden}
    files[path] = mutated.encode("utf-8")
    snapshot = Snapshot.from_files(files)
    reference = make_patch({path: mutated}, {path: library.text(path)})
    first = candidate.functions[0]
    facts = InstructionFacts(
        family=candidate.family,
        function=first.qualname,
        path=path,
        failing_tests=failing,
        messages=[run.messages.get(node) or run.collect_errors.get(node_id_file(node), "") for node in failing],
        docstring=first.docstring,
        library=source.name,
        functions=tuple(f.qualname for f in candidate.functions),
    )
    task = RepoTask(
        id=candidate.id,
        instruction=write_instruction(
            facts, seed=params.seed, key=candidate.id, hidden_files=hidden, style=params.instruction_style
        ),
        snapshot=SnapshotRef(sha256=snapshot.sha256, file_count=len(snapshot), size_bytes=snapshot.size_bytes),
        hidden_tests=HiddenTests(
            files=hidden, command=DEFAULT_TEST_COMMAND, fail_to_pass=failing, pass_to_pass=pass_to_pass
        ),
        reference_patch=reference,
        family=candidate.family,  # type: ignore[arg-type]
        source={
            "library": source.name,
            "version": source.version,
            "sdist_sha256": source.sha256,
            "path": path,
            "function": candidate.mutation.function,
            "operator": candidate.mutation.operator,
            "mutation": candidate.mutation.detail,
            "line": candidate.mutation.line,
        },
        provenance={
            "kind": "generated",
            "ids": {"generator": "workers.coding.generate", "seed": str(params.seed), "candidate": candidate.id},
        },
    )
    return task, snapshot


# --- the run ---------------------------------------------------------------------------------------------------------


@dataclass
class GenerationResult:
    tasks: list[RepoTask]
    snapshots: dict[str, bytes]  # sha256 (content hash of the files) -> canonical tar.gz
    report: dict[str, Any]


ProgressCallback = Callable[[int, int, Mapping[str, int]], None]  # checked, kept, dropped by reason


def generate_tasks(
    params: CodegenParams,
    *,
    sources_dir: Path = SOURCES_DIR,
    on_progress: ProgressCallback | None = None,
    say: Callable[[str], None] | None = None,
) -> GenerationResult:
    """Generate up to `params.max_tasks` verified tasks (see the module docstring); deterministic in (sources,
    params), timings aside."""
    started = time.monotonic()
    tell = say or log.info
    libraries = [load_library(name, sources_dir) for name in params.sources]
    limits = params.limits()
    baselines: dict[str, Baseline] = {}
    sources_report: dict[str, dict[str, Any]] = {}
    for library in libraries:
        base = baseline(library, limits)
        baselines[library.source.name] = base
        functions = sum(len(find_functions(p, library.text(p))) for p in library.mutable_files)
        sources_report[library.source.name] = {
            "version": library.source.version,
            "sdist": library.source.filename,
            "sdist_sha256": library.source.sha256,
            "license": library.source.license,
            "files": len(library.files),
            "mutable_files": library.mutable_files,
            "test_files": len(base.by_file),
            "functions": functions,
            "baseline": {
                "passing": len(base.passing),
                "unstable": base.unstable,
                "failing_in_sandbox": base.failing,
                "seconds": round(base.seconds, 2),
            },
        }
        tell(
            f"{library.source.name} {library.source.version}: {len(base.passing)} tests pass in the sandbox "
            f"({base.seconds:.1f} s), {functions} functions in {len(library.mutable_files)} files"
        )
    queue = deque(candidate_queue(libraries, params))
    total_candidates = len(queue)
    tell(f"{total_candidates} candidates; checking up to {params.max_candidates}, {params.workers} at a time")
    by_name = {library.source.name: library for library in libraries}

    outcomes: list[CandidateOutcome] = []
    kept_keys: Counter[str] = Counter()
    seen_trees: set[str] = set()
    dropped: Counter[str] = Counter()
    kept: list[CandidateOutcome] = []
    stopped = "candidates exhausted"

    # (candidate, its check or None when it is not run, the reason decided at submission)
    in_flight: deque[tuple[Candidate, Future[CandidateOutcome] | None, str | None]] = deque()
    drawn = 0
    with ThreadPoolExecutor(max_workers=params.workers, thread_name_prefix="codegen") as pool:

        def submit_more() -> None:
            nonlocal drawn
            while queue and len(in_flight) < params.workers * 2 and drawn < params.max_candidates:
                candidate = queue.popleft()
                drawn += 1
                library = by_name[candidate.library]
                try:
                    tree = content_hash(
                        {candidate.mutation.path: candidate.mutation.apply(library.text(candidate.mutation.path))}
                    )
                except ValueError:
                    tree = candidate.id
                if tree in seen_trees:
                    in_flight.append((candidate, None, DUPLICATE))
                    continue
                seen_trees.add(tree)
                if kept_keys[candidate.key] >= params.max_tasks_per_function:
                    in_flight.append((candidate, None, FUNCTION_TAKEN))  # known now; decided again below
                    continue
                future = pool.submit(check_candidate, library, baselines[candidate.library], candidate, params)
                in_flight.append((candidate, future, None))

        submit_more()
        while in_flight:
            candidate, future, reason = in_flight.popleft()
            # Decided in queue order: a function that got its task from an earlier candidate takes no more, whether
            # or not this one's check had already started.
            if reason is None and kept_keys[candidate.key] >= params.max_tasks_per_function:
                reason = FUNCTION_TAKEN
            if reason is not None or future is None:
                if future is not None:
                    future.cancel()
                detail = (
                    "an earlier candidate made the same file" if reason == DUPLICATE else candidate.mutation.function
                )
                outcome = CandidateOutcome(candidate, reason or FUNCTION_TAKEN, detail)
            else:
                outcome = future.result()
            outcomes.append(outcome)
            if outcome.reason is None:
                kept.append(outcome)
                kept_keys[candidate.key] += 1
            else:
                dropped[outcome.reason] += 1
            if on_progress is not None:
                on_progress(len(outcomes), len(kept), dict(dropped))
            if len(kept) >= params.max_tasks:
                stopped = "target reached"
                for _, rest, _ in in_flight:
                    if rest is not None:
                        rest.cancel()
                in_flight.clear()
                break
            submit_more()
        if stopped != "target reached" and drawn >= params.max_candidates and queue:
            stopped = "candidate limit reached"

    tasks = [outcome.task for outcome in kept if outcome.task is not None]
    snapshots = {
        outcome.task.snapshot.sha256: outcome.archive
        for outcome in kept
        if outcome.task is not None and outcome.archive is not None
    }
    seconds = time.monotonic() - started
    report = build_report(params, sources_report, outcomes, tasks, total_candidates, stopped, seconds)
    return GenerationResult(tasks, snapshots, report)


def _breakdown(outcomes: Iterable[CandidateOutcome], key: Callable[[CandidateOutcome], str]) -> dict[str, Any]:
    groups: dict[str, dict[str, Any]] = {}
    for outcome in outcomes:
        group = groups.setdefault(key(outcome), {"candidates": 0, "kept": 0, "dropped": {}})
        group["candidates"] += 1
        if outcome.reason is None:
            group["kept"] += 1
        else:
            group["dropped"][outcome.reason] = group["dropped"].get(outcome.reason, 0) + 1
    return dict(sorted(groups.items()))


def build_report(
    params: CodegenParams,
    sources: dict[str, dict[str, Any]],
    outcomes: list[CandidateOutcome],
    tasks: list[RepoTask],
    total_candidates: int,
    stopped: str,
    seconds: float,
) -> dict[str, Any]:
    """The generation report (schema "codegen_report/v1"); see workers.jobs.codegen for its layout."""
    dropped = Counter(o.reason for o in outcomes if o.reason is not None)
    checked = [o for o in outcomes if o.reason not in (DUPLICATE, FUNCTION_TAKEN)]
    run_seconds = [o.seconds for o in checked if o.seconds > 0]
    stats = suite_statistics(task.to_row() for task in tasks)
    return {
        "schema": REPORT_SCHEMA,
        "kind": "generate",
        "params": params.model_dump(mode="json"),
        "sources": sources,
        "target": params.max_tasks,
        "available_candidates": total_candidates,
        "candidates": len(outcomes),
        "kept": len(tasks),
        "dropped": {reason: dropped[reason] for reason in DROP_REASONS if dropped[reason]},
        "per_source": _breakdown(outcomes, lambda o: o.candidate.library),
        "per_family": _breakdown(outcomes, lambda o: o.candidate.family),
        "per_operator": _breakdown(outcomes, lambda o: o.candidate.mutation.operator),
        "statistics": stats,
        "stopped": stopped,
        "seconds": round(seconds, 1),
        "candidates_per_minute": round(60 * len(outcomes) / seconds, 1) if seconds > 0 else None,
        "median_check_seconds": round(statistics.median(run_seconds), 2) if run_seconds else None,
        "checked": [o.entry() for o in outcomes],
    }


# The pytest plugin imported by `-p crucible_codegen_report` inside the sandbox: one JSON line per test phase (with
# pytest's one-line crash message for a failure) and per collection error. Standard library and pytest only.
