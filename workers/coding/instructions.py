"""Instructions for generated repository tasks, written by templates as a user would write them (issue 17 §1).

    facts = InstructionFacts(family="repair", function="sliding_window", path="toolz/itertoolz.py",
                             failing_tests=["toolz/tests/test_itertoolz.py::test_sliding_window"],
                             messages=["assert [(1, 2, 3)] == [(1, 2), (2, 3)]"], docstring="A sequence of ...")
    text = write_instruction(facts, seed=7, hidden_files={"toolz/tests/test_itertoolz.py": "..."})

CursorBench's prompts are short and under-specified (median 390 characters); a generated one is shorter still: it
names the symptom (the failing test's name, and its assertion or exception when pytest's message shows one), the
place (sometimes the function, sometimes only the module or the test file: the agent has to look), and asks for a
fix. An implement task's instruction paraphrases the first sentence of the docstring the stub kept.

What goes in comes from the function's name, path and docstring, the failing tests' node ids and pytest's one-line
crash message for them; never from the test source. `leaked_lines` is the check: no line of a hidden test file
(of `MIN_LEAK_CHARS` or more, stripped) may appear in an instruction, and a template whose text would quote one (a
message that repeats an assertion literally, say) gives way to the next, down to one that names no symptom. The
template is picked by a random generator seeded with the seed and the task's key, so the same inputs always give
the same text.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

MAX_CHARS = 400
"""Upper bound of a generated instruction (CursorBench's median prompt is 390 characters)."""
MIN_LEAK_CHARS = 8
"""Hidden-test lines shorter than this (`pass`, `)`, `else:`) are too common to count as a quote."""
_MAX_MESSAGE_CHARS = 110
_MAX_SUMMARY_CHARS = 160
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,}")  # object reprs: differ between runs, so never part of a task


@dataclass(frozen=True)
class InstructionFacts:
    """What an instruction may draw on. `messages` are pytest's crash messages of the failing tests, in order."""

    family: str  # repair | implement
    function: str  # qualname: "Cache.popitem" or "sliding_window"
    path: str  # the function's file, relative to the repository root
    failing_tests: Sequence[str]  # node ids
    messages: Sequence[str] = field(default_factory=tuple)
    docstring: str | None = None
    library: str = ""
    functions: Sequence[str] = field(default_factory=tuple)  # every function changed, when more than one


def leaked_lines(text: str, hidden_files: Mapping[str, str]) -> list[str]:
    """Lines of the hidden test files (stripped, at least MIN_LEAK_CHARS long) that appear in `text`."""
    found: list[str] = []
    for content in hidden_files.values():
        for line in content.splitlines():
            stripped = line.strip()
            if len(stripped) >= MIN_LEAK_CHARS and stripped in text and stripped not in found:
                found.append(stripped)
    return found


def short_test_name(node_id: str) -> str:
    """The test's own name: "tests/test_a.py::TestX::test_y[1-2]" -> "test_y"."""
    return node_id.split("::")[-1].split("[", 1)[0]


def short_test_file(node_id: str) -> str:
    """The test file's name without folders: "tests/test_a.py::test_y" -> "test_a.py"."""
    return node_id.split("::", 1)[0].rsplit("/", 1)[-1]


def docstring_summary(docstring: str | None) -> str:
    """The docstring's first sentence (doctest lines and reST markup left out), at most _MAX_SUMMARY_CHARS."""
    if not docstring:
        return ""
    paragraph: list[str] = []
    for line in docstring.strip().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith((">>>", "...", ":", "..")):
            if paragraph:
                break
            continue
        paragraph.append(stripped)
    text = " ".join(paragraph)
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", text)  # reST roles first: :class:`tuple` -> tuple
    text = re.sub(r"``?([^`]+)``?", r"\1", text)
    match = re.match(r"(.+?[.!?])(\s|$)", text)
    sentence = (match.group(1) if match else text).strip()
    if len(sentence) > _MAX_SUMMARY_CHARS:
        sentence = sentence[: _MAX_SUMMARY_CHARS - 3].rsplit(" ", 1)[0] + "..."
    return sentence


def symptom(message: str) -> str:
    """A short description of a failure from pytest's crash message ("" when it shows nothing worth saying)."""
    first = message.strip().splitlines()[0].strip() if message.strip() else ""
    if not first or _ADDRESS.search(first) or "{" in first:
        # An address differs between runs, and so does the order of a set of strings (hash randomisation): the
        # same task must get the same instruction every time.
        return ""
    if first.startswith("Failed: DID NOT RAISE"):
        raised = re.search(r"<class '(?:[\w.]+\.)?(\w+)'>", first)
        return f"no longer raises {raised.group(1)}" if raised else "no longer raises"
    if first.startswith("assert "):
        return f"fails with `{first}`" if len(first) <= _MAX_MESSAGE_CHARS else ""
    exception = re.match(r"([A-Z]\w*(?:Error|Exception|Exit|Warning)|StopIteration|KeyError)\b:?\s*(.*)", first)
    if exception:
        name, detail = exception.groups()
        if name == "AssertionError":
            return ""
        if detail and len(detail) <= 70:
            return f"raises {name}: {detail}"
        return f"raises {name}"
    return ""


def _tests_phrase(tests: Sequence[str], rng: random.Random) -> str:
    names = list(dict.fromkeys(short_test_name(t) for t in tests))
    if len(names) == 1:
        return names[0]
    if len(names) == 2:
        return f"{names[0]} and {names[1]}"
    return rng.choice([f"{names[0]} and {len(names) - 1} other tests", f"{len(names)} tests, e.g. {names[0]},"])


def _callable(facts: InstructionFacts) -> str:
    return f"{facts.function}()"


Symptom = tuple[str, str]  # (the test's short name, what it shows: "fails with `assert 1 == 2`")
Template = Callable[[InstructionFacts, random.Random, Symptom], str]


def _more(facts: InstructionFacts) -> str:
    others = len({short_test_name(t) for t in facts.failing_tests}) - 1
    return f" ({others} more {'test fails' if others == 1 else 'tests fail'} too)" if others > 0 else ""


def _repair_templates() -> list[Template]:
    def named_with_symptom(f: InstructionFacts, rng: random.Random, sym: Symptom) -> str:
        tail = rng.choice(["Fix it.", "Can you fix it?", "Please fix.", "Fix it, don't touch the tests."])
        return f"{_callable(f)} is broken: {sym[0]} {sym[1]}{_more(f)}. {tail}"

    def test_file_first(f: InstructionFacts, rng: random.Random, sym: Symptom) -> str:
        files = sorted({short_test_file(t) for t in f.failing_tests})
        more = len(files) - 1
        where = files[0] if not more else f"{files[0]} and {more} more test {'file' if more == 1 else 'files'}"
        lead = rng.choice(["started failing", "fail now", "are red since the last refactor"])
        guess = rng.choice([f"Probably something in {f.path}.", f"I think it's in {f.path}.", ""])
        failing = _tests_phrase(f.failing_tests, rng).rstrip(",")
        return f"Tests in {where} {lead} ({failing}). {guess} Fix the code."

    def terse(f: InstructionFacts, rng: random.Random, sym: Symptom) -> str:
        return f"bug in {f.function}: {sym[0]} {sym[1]}"

    def regression(f: InstructionFacts, rng: random.Random, sym: Symptom) -> str:
        module = f.path.rsplit("/", 1)[-1]
        plural = len({short_test_name(t) for t in f.failing_tests}) > 1
        return (
            f"Something regressed in {module}: {_tests_phrase(f.failing_tests, rng)} "
            f"{'fail' if plural else 'fails'}. Find the bug and fix it without changing the tests."
        )

    def docstring_contract(f: InstructionFacts, rng: random.Random, sym: Symptom) -> str:
        summary = docstring_summary(f.docstring)
        if not summary:
            return ""
        return f'{_callable(f)} doesn\'t do what its docstring says anymore ("{summary}"). See {sym[0]}.'

    return [named_with_symptom, test_file_first, terse, regression, docstring_contract]


def _pinpoint_templates() -> list[Template]:
    """Each names the function and its file: the agent can search for the definition instead of exploring."""

    def pinpoint(f: InstructionFacts, rng: random.Random, sym: Symptom) -> str:
        tail = rng.choice(["Fix it.", "Please fix it.", "Fix the function, not the tests."])
        return f"{_callable(f)} in {f.path} is broken: {sym[0]} {sym[1]}{_more(f)}. {tail}"

    return [pinpoint]


def _implement_templates() -> list[Template]:
    def implement_summary(f: InstructionFacts, rng: random.Random, sym: Symptom) -> str:
        summary = docstring_summary(f.docstring)
        what = f" ({summary.removesuffix('.') if not summary.endswith('...') else summary})" if summary else ""
        return f"Implement {_callable(f)} in {f.path}{what}. {short_test_file(f.failing_tests[0])} has tests for it."

    def stub(f: InstructionFacts, rng: random.Random, sym: Symptom) -> str:
        return (
            f"{f.function} in {f.path} is only a stub. Write it so it does what its docstring says; "
            f"{_tests_phrase(f.failing_tests, rng)} should pass."
        )

    def fill_in(f: InstructionFacts, rng: random.Random, sym: Symptom) -> str:
        summary = docstring_summary(f.docstring)
        if summary and summary[-1] not in ".!?":
            summary += "."
        return f"Fill in {f.function}. {summary}"

    def tests_first(f: InstructionFacts, rng: random.Random, sym: Symptom) -> str:
        module = f.path.rsplit("/", 1)[-1]
        verb = "fails" if len({short_test_name(t) for t in f.failing_tests}) == 1 else "fail"
        tests = _tests_phrase(f.failing_tests, rng)
        return f"{tests} {verb} because {f.function} in {module} raises NotImplementedError. Implement it."

    return [implement_summary, stub, fill_in, tests_first]


def _symptom_of(facts: InstructionFacts) -> Symptom | None:
    """The first failing test whose crash message shows something, with what it shows."""
    for node_id, message in zip(facts.failing_tests, facts.messages, strict=False):
        found = symptom(message)
        if found:
            return short_test_name(node_id), found
    return None


def write_instruction(
    facts: InstructionFacts,
    *,
    seed: int,
    key: str = "",
    hidden_files: Mapping[str, str] | None = None,
    style: str = "varied",
) -> str:
    """The instruction for a task: a template chosen by (seed, key), filled from `facts`. Templates whose text would
    quote a hidden test line, or pass MAX_CHARS, give way to the next; the last resort names no symptom. `style`
    "pinpoint" keeps to templates that name the function and its file (a repair of one function)."""
    if not facts.failing_tests:
        raise ValueError("an instruction needs at least one failing test")
    if style not in ("varied", "pinpoint"):
        raise ValueError(f"instruction style must be 'varied' or 'pinpoint', got {style!r}")
    rng = random.Random(f"{seed}:{key or facts.function}:{facts.family}")
    templates = _implement_templates() if facts.family == "implement" else _repair_templates()
    if style == "pinpoint" and facts.family != "implement" and len(facts.functions) <= 1:
        templates = _pinpoint_templates()
    if len(facts.functions) > 1:
        # Several functions changed: a template naming one of them would point the agent at half the fix.
        templates = [t for t in templates if t.__name__ in ("test_file_first", "regression")]
    rng.shuffle(templates)
    plain: Symptom = (short_test_name(facts.failing_tests[0]), "fails")
    found = _symptom_of(facts) if facts.family != "implement" else None
    hidden = hidden_files or {}
    for template in templates:
        for sym in (found, plain) if found else (plain,):
            text = _tidy(template(facts, rng, sym))
            if text and len(text) <= MAX_CHARS and not leaked_lines(text, hidden):
                return text
    if style == "pinpoint":
        return _tidy(f"{_callable(facts)} in {facts.path} is broken: {plain[0]} fails. Fix it.")
    return _tidy(f"Some tests in {short_test_file(facts.failing_tests[0])} fail. Fix the code, not the tests.")


def _tidy(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()
