"""The repository-task generator on a vendored library, in the real sandbox: what it keeps verifies on its own,
what it drops says why, and the same seed gives the same tasks."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from workers.coding.archive import pack
from workers.coding.candidates import Candidate, CodegenParams, candidate_queue, related_test_files
from workers.coding.generate import (
    DROP_REASONS,
    EQUIVALENT,
    FUNCTION_TAKEN,
    NO_PARSE,
    NOT_CAUGHT,
    GenerationResult,
    check_candidate,
    generate_tasks,
)
from workers.coding.instructions import leaked_lines
from workers.coding.libraries import baseline, load_library
from workers.coding.mutation_operators import repair_mutations
from workers.coding.mutations import Edit, Mutation, find_functions
from workers.coding.patches import apply_patch
from workers.coding.task import node_id_file, parse_repo_task_row
from workers.coding.verify import verify_task
from workers.coding.workspace import Snapshot, Workspace

# webcolors: the quickest suite of the vendored four (about a second in the sandbox).
SMALL = {"sources": ["webcolors"], "max_tasks": 2, "max_candidates": 5, "seed": 2, "workers": 2}


@pytest.fixture(scope="module")
def small_run() -> GenerationResult:
    return generate_tasks(CodegenParams(**SMALL))


def _without_timings(report: dict[str, Any]) -> dict[str, Any]:
    timing = ("seconds", "candidates_per_minute", "median_check_seconds")
    kept = {k: v for k, v in report.items() if k not in (*timing, "checked", "sources", "params")}
    kept["params"] = {k: v for k, v in report["params"].items() if k != "workers"}
    kept["checked"] = [
        {k: v for k, v in entry.items() if k not in ("seconds", "timings")} for entry in report["checked"]
    ]
    return kept


def test_kept_tasks_verify_on_their_own_and_never_show_the_hidden_tests(small_run: GenerationResult) -> None:
    assert 1 <= len(small_run.tasks) <= SMALL["max_tasks"]
    for task in small_run.tasks:
        parse_repo_task_row(task.to_row())  # a valid repo_task/v1 row
        snapshot = Snapshot.from_archive(small_run.snapshots[task.snapshot.sha256])
        assert snapshot.sha256 == task.snapshot.sha256 and len(snapshot) == task.snapshot.file_count
        for path in task.hidden_tests.files:
            assert path not in snapshot  # the agent never sees them
        assert {node_id_file(n) for n in task.hidden_tests.fail_to_pass} <= set(task.hidden_tests.files)
        assert len(task.hidden_tests.pass_to_pass) <= 20
        assert leaked_lines(task.instruction, task.hidden_tests.files) == []
        assert task.source["library"] == "webcolors" and task.provenance["kind"] == "generated"
        # The reference patch restores the library's file exactly.
        library = load_library("webcolors")
        patched = Workspace(snapshot)
        [path] = apply_patch(patched, task.reference_patch or "")
        assert patched.read_text(path) == library.text(path)
        # An independent check, as the import path does it: fails on the snapshot, passes with the patch.
        verification = verify_task(task, snapshot)
        assert verification.ok, verification.reason


def test_the_report_accounts_for_every_candidate(small_run: GenerationResult) -> None:
    report = small_run.report
    assert report["schema"] == "codegen_report/v1" and report["kept"] == len(small_run.tasks)
    outcomes = Counter(entry["outcome"] for entry in report["checked"])
    assert len(report["checked"]) == report["candidates"] <= SMALL["max_candidates"]
    assert outcomes["kept"] == report["kept"]
    assert {k: v for k, v in outcomes.items() if k != "kept"} == report["dropped"]
    assert set(report["dropped"]) <= set(DROP_REASONS)
    assert report["stopped"] in ("target reached", "candidate limit reached", "candidates exhausted")
    assert report["per_source"]["webcolors"]["candidates"] == report["candidates"]
    assert sum(group["kept"] for group in report["per_family"].values()) == report["kept"]
    baseline_info = report["sources"]["webcolors"]["baseline"]
    assert baseline_info["passing"] > 400 and baseline_info["unstable"] == 0
    stats = report["statistics"]
    assert stats["tasks"] == report["kept"] and stats["cursorbench"]["median_lines_changed"] == 181
    assert stats["median_lines_changed"] >= 1 and stats["median_instruction_chars"] > 20
    assert report["candidates_per_minute"] > 0


@pytest.mark.slow  # a second generation run (tens of seconds); make test-slow runs it
def test_the_same_seed_gives_the_same_tasks_whatever_the_workers(small_run: GenerationResult) -> None:
    again = generate_tasks(CodegenParams(**{**SMALL, "workers": 1}))
    assert [t.to_row() for t in again.tasks] == [t.to_row() for t in small_run.tasks]
    assert _without_timings(again.report) == _without_timings(small_run.report)
    assert again.snapshots == small_run.snapshots  # byte-identical archives


def test_the_candidate_queue_is_seeded_and_spreads_over_families() -> None:
    library = load_library("webcolors")
    first = [c.id for c in candidate_queue([library], CodegenParams(sources=["webcolors"], seed=1))]
    assert first == [c.id for c in candidate_queue([library], CodegenParams(sources=["webcolors"], seed=1))]
    assert first != [c.id for c in candidate_queue([library], CodegenParams(sources=["webcolors"], seed=2))]
    assert len(set(first)) == len(first)
    assert {"-repair-", "-implement-"} == {("-repair-" if "-repair-" in i else "-implement-") for i in first[:2]}
    only = candidate_queue([library], CodegenParams(sources=["webcolors"], families=["implement"]))
    assert only and all(c.family == "implement" and c.functions[0].docstring for c in only)


def test_single_site_keeps_functions_with_one_mutation_and_no_pairs() -> None:
    library = load_library("webcolors")
    operators = ["compare", "negate"]
    params = CodegenParams(sources=["webcolors"], families=["repair"], operators=operators, single_site=True)
    queue = candidate_queue([library], params)
    assert queue and all(len(c.functions) == 1 and c.mutation.operator in operators for c in queue)
    for candidate in queue:  # the one site of its operator in its function
        path = candidate.mutation.path
        [info] = [f for f in find_functions(path, library.text(path)) if f.qualname == candidate.mutation.function]
        assert len(repair_mutations(library.text(path), info, [candidate.mutation.operator])) == 1
    wider = candidate_queue([library], params.model_copy(update={"single_site": False, "multi_function_share": 0.5}))
    assert len(wider) > len(queue) and any(len(c.functions) == 2 for c in wider)
    with pytest.raises(ValueError, match="instruction_style"):
        CodegenParams(instruction_style="exact")  # type: ignore[arg-type]


def test_related_tests_are_the_modules_own_test_file() -> None:
    library = load_library("toolz")
    [candidate] = [
        c
        for c in candidate_queue([library], CodegenParams(sources=["toolz"], families=["implement"]))
        if c.mutation.function == "sliding_window"
    ]
    runnable = [p for p in library.test_files if "sandbox" not in p]
    assert related_test_files(library, candidate, "related", runnable) == ["toolz/tests/test_itertoolz.py"]
    assert related_test_files(library, candidate, "all", runnable) == runnable


def _candidate(library_name: str, path: str, function: str, mutation: Mutation) -> Candidate:
    library = load_library(library_name)
    [info] = [f for f in find_functions(path, library.text(path)) if f.name == function]
    return Candidate(f"probe-{mutation.operator}", library_name, "repair", mutation, (info,))


def test_candidates_the_tests_miss_or_that_change_nothing_are_dropped_with_their_reason() -> None:
    library = load_library("webcolors")
    params = CodegenParams(sources=["webcolors"])
    base = baseline(library, params.limits())
    path = "src/webcolors/_normalization.py"
    source = library.text(path)
    [function] = [f for f in find_functions(path, source) if f.name == "_percent_to_integer"]
    [uncaught] = [m for m in repair_mutations(source, function, ["off_by_one"]) if "`0` -> `-1`" in m.detail]
    outcome = check_candidate(library, base, _candidate("webcolors", path, function.name, uncaught), params)
    assert outcome.reason == NOT_CAUGHT and "still pass" in outcome.detail and outcome.task is None

    start = source.index("def _percent_to_integer")
    spaced = Mutation("compare", path, function.name, 1, "layout only", (Edit(start, start, "\n"),))
    outcome = check_candidate(library, base, _candidate("webcolors", path, function.name, spaced), params)
    assert outcome.reason == EQUIVALENT

    broken = Mutation("compare", path, function.name, 1, "broken", (Edit(start, start + 3, "df"),))
    outcome = check_candidate(library, base, _candidate("webcolors", path, function.name, broken), params)
    assert outcome.reason == NO_PARSE and "SyntaxError" in outcome.detail
    assert outcome.entry()["outcome"] == NO_PARSE


def test_bad_parameters_name_what_is_known() -> None:
    with pytest.raises(ValueError, match="unknown source"):
        CodegenParams(sources=["inflection"])
    with pytest.raises(ValueError, match="unknown operator"):
        CodegenParams(operators=["teleport"])


MATHX = '''\
"""A tiny library for the generator's own tests."""


def clamp(x, lo, hi):
    """Clamp x into the closed interval [lo, hi]."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def untested(x):
    """Nothing checks this."""
    return x + 1
'''
MATHX_TESTS = """\
import pytest
from mathx import clamp


def test_inside():
    assert clamp(2, 0, 5) == 2


def test_below():
    assert clamp(-1, 0, 5) == 0


def test_above():
    assert clamp(9, 0, 5) == 5


# Ids numbered in the order of a set of strings: they change with each run's hash seed, so no task may name them.
@pytest.mark.parametrize("name,box", [(name, [name]) for name in {"alpha", "beta", "gamma", "delta", "epsilon"}])
def test_inside_by_name(name, box):
    assert clamp(len(name), 0, 10) == len(box[0])
"""


def test_a_library_of_ones_own_needs_only_a_manifest_entry(tmp_path: Path) -> None:
    """How a library outside sources/ is used (an independent check): an sdist and a manifest naming it; the
    test and mutable files default to pytest's names and every other module."""
    data = pack({"mathx-1.0/mathx/__init__.py": MATHX, "mathx-1.0/tests/test_mathx.py": MATHX_TESTS})
    (tmp_path / "mathx-1.0.tar.gz").write_bytes(data)
    entry = {
        "name": "mathx",
        "version": "1.0",
        "filename": "mathx-1.0.tar.gz",
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    (tmp_path / "manifest.json").write_text(json.dumps({"sources": [entry]}))
    with pytest.raises(ValueError, match="unknown source"):
        CodegenParams(sources=["mathx"])
    params = CodegenParams.model_validate(
        {"sources": ["mathx"], "max_tasks": 50, "seed": 0, "multi_function_share": 0.0, "mutations_per_function": 50},
        context={"sources_dir": tmp_path},
    )
    result = generate_tasks(params, sources_dir=tmp_path)
    report = result.report
    assert report["sources"]["mathx"]["mutable_files"] == ["mathx/__init__.py"]
    baseline_info = report["sources"]["mathx"]["baseline"]
    # The five shifting ids of each run are left out (the union over the runs holds more than five).
    assert baseline_info["passing"] == 3 and baseline_info["unstable"] >= 5 and baseline_info["failing_in_sandbox"] == 0
    assert report["stopped"] == "candidates exhausted" and report["kept"] == len(result.tasks) == 2
    families = {(task.family, task.source["function"]) for task in result.tasks}
    assert families == {("repair", "clamp"), ("implement", "clamp")}  # one task per function and family
    untested = [e for e in report["checked"] if e["function"] == "untested"]
    assert untested and {e["outcome"] for e in untested} == {NOT_CAUGHT}
    assert report["dropped"][FUNCTION_TAKEN] >= 1
    for task in result.tasks:
        assert task.hidden_tests.files == {"tests/test_mathx.py": MATHX_TESTS}
        assert set(task.hidden_tests.fail_to_pass) | set(task.hidden_tests.pass_to_pass) <= {
            f"tests/test_mathx.py::test_{name}" for name in ("inside", "below", "above")
        }
