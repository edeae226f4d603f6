"""Generated instructions: short, seeded, naming the symptom, and never quoting the hidden tests."""

from __future__ import annotations

import pytest

from workers.coding.instructions import (
    MAX_CHARS,
    InstructionFacts,
    docstring_summary,
    leaked_lines,
    short_test_name,
    symptom,
    write_instruction,
)

HIDDEN = {
    "toolz/tests/test_itertoolz.py": (
        "from toolz.itertoolz import sliding_window\n\n\n"
        "def test_sliding_window():\n"
        "    assert list(sliding_window(2, [1, 2, 3, 4])) == [(1, 2), (2, 3), (3, 4)]\n"
        "    assert list(sliding_window(3, [1, 2, 3, 4])) == [(1, 2, 3), (2, 3, 4)]\n\n\n"
        "def test_sliding_window_of_short_iterator():\n"
        "    assert list(sliding_window(3, [1, 2])) == []\n"
    )
}
DOCSTRING = """A sequence of overlapping subsequences

    >>> list(sliding_window(2, [1, 2, 3, 4]))
    [(1, 2), (2, 3), (3, 4)]
"""


def _facts(family: str = "repair", messages: tuple[str, ...] = (), **changes: object) -> InstructionFacts:
    fields: dict[str, object] = {
        "family": family,
        "function": "sliding_window",
        "path": "toolz/itertoolz.py",
        "failing_tests": [
            "toolz/tests/test_itertoolz.py::test_sliding_window",
            "toolz/tests/test_itertoolz.py::test_sliding_window_of_short_iterator",
        ],
        "messages": messages,
        "docstring": DOCSTRING,
        "library": "toolz",
    }
    fields.update(changes)
    return InstructionFacts(**fields)  # type: ignore[arg-type]


def test_the_same_seed_gives_the_same_text_and_seeds_vary_it() -> None:
    facts = _facts(messages=("assert [(1, 2, 3), (2, 3, 4)] == [(1, 2), (2, 3), (3, 4)]",))
    texts = {write_instruction(facts, seed=seed, key="k", hidden_files=HIDDEN) for seed in range(40)}
    assert write_instruction(facts, seed=3, key="k") == write_instruction(facts, seed=3, key="k")
    assert len(texts) >= 4  # several templates and variants


@pytest.mark.parametrize("family", ["repair", "implement"])
def test_no_instruction_quotes_a_hidden_test_line_and_all_stay_short(family: str) -> None:
    # The crash message repeats a test line literally: a template quoting it gives way to another.
    messages = ("assert list(sliding_window(3, [1, 2])) == []", "AssertionError")
    for seed in range(60):
        for functions in ((), ("sliding_window", "partition")):
            facts = _facts(family, messages, functions=functions)
            text = write_instruction(facts, seed=seed, key=f"t{seed}", hidden_files=HIDDEN)
            assert leaked_lines(text, HIDDEN) == [], text
            assert 20 <= len(text) <= MAX_CHARS
            for line in HIDDEN["toolz/tests/test_itertoolz.py"].splitlines():
                if len(line.strip()) >= 8:
                    assert line.strip() not in text


def test_a_repair_instruction_names_the_symptom_when_pytest_shows_one() -> None:
    facts = _facts(messages=("TypeError: 'int' object is not callable",))
    texts = [write_instruction(facts, seed=seed, key="k") for seed in range(30)]
    assert any("raises TypeError: 'int' object is not callable" in text for text in texts)
    assert all("def test_" not in text and "assert list(" not in text for text in texts)


def test_an_instruction_for_two_functions_names_neither() -> None:
    facts = _facts(functions=("sliding_window", "partition"))
    for seed in range(20):
        text = write_instruction(facts, seed=seed, key="pair")
        assert "sliding_window()" not in text and "bug in" not in text


def test_an_implement_instruction_paraphrases_the_docstring_or_points_at_it() -> None:
    texts = {write_instruction(_facts("implement"), seed=seed, key="k") for seed in range(30)}
    assert any("A sequence of overlapping subsequences" in text for text in texts)
    assert all(">>>" not in text and "[(1, 2), (2, 3), (3, 4)]" not in text for text in texts)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("assert 3 == 4", "fails with `assert 3 == 4`"),
        ("TypeError: unsupported operand type(s) for -: 'str' and 'str'", "raises TypeError: unsupported"),
        ("Failed: DID NOT RAISE <class 'ValueError'>", "no longer raises ValueError"),
        ("AssertionError", ""),
        ("assert <function f at 0x7f3a2b1c> == 1", ""),  # an address differs between runs
        ("assert {'b', 'a'} == {'a'}", ""),  # so does the order of a set of strings
        ("", ""),
    ],
)
def test_symptoms_come_from_the_crash_message(message: str, expected: str) -> None:
    assert symptom(message).startswith(expected) if expected else symptom(message) == ""


def test_helpers_read_node_ids_and_docstrings() -> None:
    assert short_test_name("tests/test_a.py::TestX::test_y[1-2]") == "test_y"
    assert docstring_summary(DOCSTRING) == "A sequence of overlapping subsequences"
    assert docstring_summary("Return ``x`` twice. More text.") == "Return x twice."
    assert docstring_summary(None) == ""
    with pytest.raises(ValueError, match="at least one failing test"):
        write_instruction(_facts(failing_tests=[]), seed=0)


def test_a_pinpoint_instruction_always_names_the_function_and_its_file() -> None:
    shown = ("assert [(1, 2, 3), (2, 3, 4)] == [(1, 2), (2, 3), (3, 4)]",)
    for seed in range(20):
        text = write_instruction(_facts(messages=shown), seed=seed, key="k", style="pinpoint")
        assert text.startswith("sliding_window() in toolz/itertoolz.py is broken: test_sliding_window fails with `")
        # a message that quotes a hidden test line falls back to the plain symptom, still naming the place
        quiet = write_instruction(_facts(messages=shown), seed=seed, key="k", style="pinpoint", hidden_files=HIDDEN)
        assert "sliding_window() in toolz/itertoolz.py" in quiet and not leaked_lines(quiet, HIDDEN)
    # two functions changed: no template names one of them, pinpoint or not
    two = _facts(functions=("sliding_window", "partition"))
    assert "sliding_window()" not in write_instruction(two, seed=0, style="pinpoint")
    with pytest.raises(ValueError, match="'varied' or 'pinpoint'"):
        write_instruction(_facts(), seed=0, style="exact")
