"""What the task generator is asked for (`CodegenParams`) and its candidates (`workers.coding.generate` checks
them): every mutation of every vendored library's functions the params allow, as a seeded queue spread over the
families, and the test files each candidate runs."""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from workers.coding.execute import CommandLimits
from workers.coding.libraries import (
    SOURCES_DIR,
    Library,
    vendored_sources,
)
from workers.coding.mutation_operators import REPAIR_OPERATORS, repair_mutations
from workers.coding.mutations import (
    FunctionInfo,
    Mutation,
    combine,
    find_functions,
    implement_mutation,
)

Family = Literal["repair", "implement"]
FAMILIES: tuple[Family, ...] = ("repair", "implement")
DEFAULT_SOURCES = ("toolz", "isodate", "cachetools", "webcolors")
MIN_CHECK_SECONDS = 15.0
CHECK_SLACK = 10.0  # a candidate's test run may take this many times the pristine suite's


class CodegenParams(BaseModel):
    """What a user chooses for one generation run (the codegen job spec adds its outputs)."""

    model_config = ConfigDict(extra="forbid")

    sources: list[str] = Field(
        default_factory=lambda: list(DEFAULT_SOURCES),
        min_length=1,
        description="Vendored libraries to mutate (workers/coding/sources/manifest.json)",
    )
    families: list[Family] = Field(default_factory=lambda: list(FAMILIES), min_length=1)
    operators: list[str] = Field(
        default_factory=lambda: list(REPAIR_OPERATORS), min_length=1, description="Repair mutation operators"
    )
    max_tasks: int = Field(default=60, ge=1, le=10_000, description="Tasks to keep")
    max_candidates: int = Field(default=400, ge=1, le=100_000, description="Candidates to check at most")
    seed: int = Field(default=0, ge=0)
    mutations_per_function: int = Field(default=2, ge=1, le=50, description="repair candidates per function")
    multi_function_share: float = Field(
        default=0.15, ge=0.0, le=1.0, description="Share of repair candidates that mutate two functions of a file"
    )
    max_tasks_per_function: int = Field(default=1, ge=1, le=100, description="Kept tasks per function and family")
    single_site: bool = Field(
        default=False,
        description="Repair: an operator mutates a function only where it has exactly one site there (its only "
        "comparison, its only condition), and no two-function candidates: a family a small model can learn to "
        "fix (with operators ['compare']: the function's one comparison, flipped back)",
    )
    instruction_style: Literal["varied", "pinpoint"] = Field(
        default="varied",
        description="varied: CursorBench-like templates, some naming only a test file or module; pinpoint: every "
        "instruction names the function and its file, with the failing test's assertion when pytest shows it",
    )
    max_fail_to_pass: int = Field(
        default=30, ge=1, le=10_000, description="More failing test functions: dropped as too broad"
    )
    max_pass_to_pass: int = Field(default=20, ge=0, le=1000)
    test_scope: Literal["related", "all"] = Field(
        default="related", description="related: the test files that name the module or function; all: the suite"
    )
    test_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Per sandboxed test run (a candidate's: at most 10x the pristine suite's)",
    )
    workers: int = Field(default=2, ge=1, le=64, description="Candidates checked at once")

    @field_validator("sources")
    @classmethod
    def _known_sources(cls, names: list[str], info: ValidationInfo) -> list[str]:
        # A caller with sources of its own (generate_tasks(sources_dir=...)) validates with that folder in the
        # context: CodegenParams.model_validate(data, context={"sources_dir": folder}).
        folder = (info.context or {}).get("sources_dir", SOURCES_DIR)
        known = vendored_sources(Path(folder))
        unknown = [name for name in names if name not in known]
        if unknown:
            raise ValueError(f"unknown source(s) {unknown}; vendored: {', '.join(sorted(known))}")
        return list(dict.fromkeys(names))

    @field_validator("operators")
    @classmethod
    def _known_operators(cls, names: list[str]) -> list[str]:
        unknown = sorted(set(names) - set(REPAIR_OPERATORS))
        if unknown:
            raise ValueError(f"unknown operator(s) {unknown}; known: {', '.join(REPAIR_OPERATORS)}")
        return list(dict.fromkeys(names))

    def limits(self, baseline_seconds: float | None = None) -> CommandLimits:
        """Limits of one sandboxed test run. Given the pristine suite's time, a candidate's run gets at most
        CHECK_SLACK times that (and at least MIN_CHECK_SECONDS): a mutation that makes a loop endless costs a
        worker that long, not the whole `test_timeout_seconds`."""
        seconds = self.test_timeout_seconds
        if baseline_seconds is not None:
            seconds = min(seconds, max(MIN_CHECK_SECONDS, CHECK_SLACK * baseline_seconds))
        return CommandLimits(wall_seconds=seconds, cpu_seconds=int(seconds) + 1)


# --- candidates ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """One mutated tree to check: a mutation of one file of one library."""

    id: str
    library: str
    family: str
    mutation: Mutation
    functions: tuple[FunctionInfo, ...]

    @property
    def key(self) -> str:
        """What `max_tasks_per_function` counts: the family and the function(s)."""
        return f"{self.library}:{self.family}:{self.mutation.path}:{self.mutation.function}"


def _candidate_id(library: str, family: str, mutation: Mutation) -> str:
    digest = hashlib.sha256(
        json.dumps([mutation.path, [(e.start, e.end, e.text) for e in mutation.edits]]).encode()
    ).hexdigest()
    name = re.sub(r"[^a-z0-9]+", "-", mutation.function.lower()).strip("-")
    return f"{library}-{family}-{name}-{digest[:8]}"


def _pick_repairs(mutations: list[Mutation], count: int, rng: random.Random) -> list[Mutation]:
    """Up to `count` mutations, distinct operators first, chosen by `rng`."""
    shuffled = list(mutations)
    rng.shuffle(shuffled)
    picked: list[Mutation] = []
    operators: set[str] = set()
    for mutation in shuffled:
        if mutation.operator not in operators:
            picked.append(mutation)
            operators.add(mutation.operator)
        if len(picked) == count:
            return picked
    for mutation in shuffled:
        if len(picked) == count:
            break
        if mutation not in picked:
            picked.append(mutation)
    return picked


def library_candidates(library: Library, params: CodegenParams) -> dict[str, list[Candidate]]:
    """Every candidate of one library by family, each list shuffled by the seed."""
    name = library.source.name
    by_family: dict[str, list[Candidate]] = {family: [] for family in params.families}
    for path in library.mutable_files:
        source = library.text(path)
        functions = find_functions(path, source)
        rng = random.Random(f"{params.seed}:{name}:{path}")
        singles: list[tuple[FunctionInfo, Mutation]] = []
        for function in functions:
            if "repair" in by_family:
                options = repair_mutations(source, function, params.operators)
                if params.single_site:  # an operator's mutation only where it is that operator's one site here
                    per_operator = Counter(mutation.operator for mutation in options)
                    options = [mutation for mutation in options if per_operator[mutation.operator] == 1]
                for mutation in _pick_repairs(options, params.mutations_per_function, rng):
                    singles.append((function, mutation))
                    by_family["repair"].append(
                        Candidate(_candidate_id(name, "repair", mutation), name, "repair", mutation, (function,))
                    )
            if "implement" in by_family and function.docstring:
                gutted = implement_mutation(source, function)
                if gutted is not None:
                    by_family["implement"].append(
                        Candidate(_candidate_id(name, "implement", gutted), name, "implement", gutted, (function,))
                    )
        pairs = int(params.multi_function_share * len(singles)) if len(singles) > 1 and not params.single_site else 0
        for _ in range(pairs):
            both = sorted(rng.sample(singles, 2), key=lambda pair: pair[1].line)
            if both[0][0].qualname == both[1][0].qualname:
                continue
            merged = combine([mutation for _, mutation in both])
            functions_of_pair = tuple(function for function, _ in both)
            by_family["repair"].append(
                Candidate(_candidate_id(name, "repair", merged), name, "repair", merged, functions_of_pair)
            )
    for family, candidates in by_family.items():
        random.Random(f"{params.seed}:{name}:{family}").shuffle(candidates)
    return by_family


def candidate_queue(libraries: Sequence[Library], params: CodegenParams) -> list[Candidate]:
    """All candidates, the (library, family) lists interleaved one at a time so that any prefix is balanced."""
    lists = [
        candidates for library in libraries for candidates in library_candidates(library, params).values() if candidates
    ]
    queue: list[Candidate] = []
    for index in range(max((len(c) for c in lists), default=0)):
        queue.extend(candidates[index] for candidates in lists if index < len(candidates))
    return queue


def related_test_files(library: Library, candidate: Candidate, scope: str, runnable: Sequence[str]) -> list[str]:
    """The test files worth running for a candidate: those named after its module (test_<stem>.py) and those that
    name the function (or, for a method, its class) as a word; all runnable ones when none does."""
    if scope == "all":
        return list(runnable)
    stems = {PurePosixPath(candidate.mutation.path).stem.lstrip("_")}
    words = {f.class_name if f.class_name else f.name for f in candidate.functions}
    found = []
    for path in runnable:
        stem = PurePosixPath(path).stem
        if any(stem == f"test_{s}" or stem.startswith(f"test_{s}_") for s in stems):
            found.append(path)
            continue
        text = library.text(path)
        if any(re.search(rf"\b{re.escape(word)}\b", text) for word in words):
            found.append(path)
    return found or list(runnable)
