"""Mutation operators of the task generator: each one on a small source, edits confined to their span (the rest of
the file byte-identical), output that parses and differs as code."""

from __future__ import annotations

import ast
import difflib
import glob
from pathlib import Path

import pytest

from workers.coding.archive import unpack
from workers.coding.mutation_operators import REPAIR_OPERATORS, repair_mutations
from workers.coding.mutations import (
    Edit,
    Mutation,
    apply_edits,
    changes_code,
    combine,
    find_functions,
    implement_mutation,
)

SOURCE = '''\
import math

# a comment that must survive:   spacing   kept


class Window:
    """A class."""

    def size(self, items, step=1, strict=False, sep=", "):
        """How many windows."""
        if not items:
            return 0
        elif step > len(items):
            return 1
        else:
            total = len(items) - step + 1
        return total if strict and total >= 0 else max(total, 0)


def clamp(x, lo, hi):
    """Clamp x into [lo, hi].

    >>> clamp(5, 0, 3)
    3
    """
    if x < lo:
        return lo
    if x is None or hi <= x:
        return hi
    return x


def tail(seq, n):
    return seq[-n:] if n in range(len(seq)) else list(reversed(seq))[: n]  # ünïcode comment


def stub():
    """Nothing here."""
    raise NotImplementedError


def oneliner(a, b): return a + b
'''


def _function(name: str, source: str = SOURCE):  # type: ignore[no-untyped-def]
    return next(f for f in find_functions("pkg/mod.py", source) if f.name == name)


def _changed_lines(before: str, after: str) -> list[str]:
    return [
        line
        for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]


def _by_operator(name: str, operator: str) -> list[Mutation]:
    return repair_mutations(SOURCE, _function(name), [operator])


def test_it_finds_functions_and_methods_but_not_stubs() -> None:
    names = [(f.qualname, f.class_name) for f in find_functions("pkg/mod.py", SOURCE)]
    assert names == [("Window.size", "Window"), ("clamp", None), ("tail", None), ("oneliner", None)]
    clamp = _function("clamp")
    assert clamp.docstring is not None and clamp.docstring.startswith("Clamp x")
    assert clamp.module == "pkg.mod" and clamp.lineno == 20
    assert find_functions("src/isodate/isodates.py", "def f():\n    return 1\n")[0].module == "isodate.isodates"


@pytest.mark.parametrize(
    ("function", "operator", "expected"),
    [
        (
            "clamp",
            "compare",
            {"-    if x < lo:\n+    if x <= lo:", "-    if x is None or hi <= x:\n+    if x is not None or hi <= x:"},
        ),
        ("clamp", "boolean", {"-    if x is None or hi <= x:\n+    if x is None and hi <= x:"}),
        (
            "Window.size",
            "arithmetic",
            {"-            total = len(items) - step + 1\n+            total = len(items) + step + 1"},
        ),
    ],
)
def test_operator_swaps_edit_only_the_token(function: str, operator: str, expected: set[str]) -> None:
    mutations = repair_mutations(SOURCE, _function(function.split(".")[-1]), [operator])
    seen = {"\n".join(_changed_lines(SOURCE, m.apply(SOURCE))) for m in mutations}
    assert expected <= seen
    for mutation in mutations:
        assert mutation.operator == operator and mutation.function == function
        assert len(_changed_lines(SOURCE, mutation.apply(SOURCE))) == 2  # one line out, one in


def test_every_operator_finds_a_site_and_keeps_the_rest_of_the_file_byte_identical() -> None:
    found: set[str] = set()
    for function in find_functions("pkg/mod.py", SOURCE):
        for mutation in repair_mutations(SOURCE, function):
            found.add(mutation.operator)
            after = mutation.apply(SOURCE)
            assert changes_code(SOURCE, after), mutation.detail
            ast.parse(after)
            first = min(e.start for e in mutation.edits)
            last = max(e.end for e in mutation.edits)
            tail = len(SOURCE) - last
            assert after[:first] == SOURCE[:first] and after[len(after) - tail :] == SOURCE[last:]
            assert "# a comment that must survive:   spacing   kept" in after
    assert found == set(REPAIR_OPERATORS)


def test_off_by_one_moves_constants_and_slice_bounds_both_ways() -> None:
    lines = {"\n".join(_changed_lines(SOURCE, m.apply(SOURCE))) for m in _by_operator("tail", "off_by_one")}
    for fragment in ("seq[-n + 1:]", "seq[-n - 1:]", "range(len(seq) + 1)", "range(len(seq) - 1)", "[: n + 1]"):
        assert any(fragment in d for d in lines), fragment
    assert any("[: n - 1]" in d for d in lines)
    sizes = {"\n".join(_changed_lines(SOURCE, m.apply(SOURCE))) for m in _by_operator("size", "off_by_one")}
    assert (
        "-            return 0\n+            return 1" in sizes
        and "-            return 0\n+            return -1" in sizes
    )


def test_off_by_one_handles_non_ascii_on_the_line() -> None:
    # The line has multi-byte characters after the edit: ast columns are UTF-8 byte offsets.
    for mutation in _by_operator("tail", "off_by_one"):
        after = mutation.apply(SOURCE)
        assert "# ünïcode comment" in after
        ast.parse(after)


def test_remove_branch_deletes_a_guard_an_elif_or_an_else() -> None:
    diffs = {"\n".join(_changed_lines(SOURCE, m.apply(SOURCE))) for m in _by_operator("size", "remove_branch")}
    assert "-        elif step > len(items):\n-            return 1" in diffs
    assert "-        else:\n-            total = len(items) - step + 1" in diffs
    guards = {"\n".join(_changed_lines(SOURCE, m.apply(SOURCE))) for m in _by_operator("clamp", "remove_branch")}
    assert "-    if x < lo:\n-        return lo" in guards


def test_remove_branch_leaves_pass_in_a_block_it_would_empty() -> None:
    source = "def f(xs):\n    for x in xs:\n        if x:\n            yield x\n"
    [mutation] = repair_mutations(source, find_functions("m.py", source)[0], ["remove_branch"])
    assert mutation.apply(source) == "def f(xs):\n    for x in xs:\n        pass\n"


def test_negate_wraps_or_unwraps_a_condition() -> None:
    diffs = {"\n".join(_changed_lines(SOURCE, m.apply(SOURCE))) for m in _by_operator("size", "negate")}
    assert "-        if not items:\n+        if items:" in diffs
    assert "-        elif step > len(items):\n+        elif not step > len(items):" in diffs
    assert any("if not (strict and total >= 0)" in d for d in diffs)


def test_wrong_default_flips_bools_bumps_numbers_and_empties_strings() -> None:
    diffs = {"\n".join(_changed_lines(SOURCE, m.apply(SOURCE))) for m in _by_operator("size", "default")}
    assert any("step=2, strict=False" in d for d in diffs)
    assert any("strict=True" in d for d in diffs)
    assert any('sep="")' in d for d in diffs)


def test_swap_args_swaps_the_first_two_positional_arguments() -> None:
    diffs = {"\n".join(_changed_lines(SOURCE, m.apply(SOURCE))) for m in _by_operator("size", "swap_args")}
    assert any("max(0, total)" in d for d in diffs)


def test_a_site_with_a_comment_between_operands_is_skipped() -> None:
    source = "def f(a, b):\n    return (a  # left\n            < b)\n"
    assert repair_mutations(source, find_functions("m.py", source)[0], ["compare"]) == []


def test_string_concatenation_is_not_an_arithmetic_site() -> None:
    source = "def f(a):\n    return 'x' + a\n"
    assert repair_mutations(source, find_functions("m.py", source)[0], ["arithmetic"]) == []


def test_implement_keeps_signature_and_docstring_and_raises() -> None:
    mutation = implement_mutation(SOURCE, _function("clamp"))
    assert mutation is not None and mutation.operator == "remove_body"
    after = mutation.apply(SOURCE)
    assert '    3\n    """\n    raise NotImplementedError\n\n\ndef tail' in after
    assert "def clamp(x, lo, hi):" in after and "if x < lo" not in after
    assert _changed_lines(SOURCE, after)[-1] == "+    raise NotImplementedError"
    assert implement_mutation(SOURCE, _function("oneliner")) is None  # no line of its own to replace


def test_unknown_operators_and_overlapping_edits_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown mutation operators"):
        repair_mutations(SOURCE, _function("clamp"), ["teleport"])
    with pytest.raises(ValueError, match="overlapping"):
        apply_edits("abcdef", [Edit(0, 3, "x"), Edit(2, 4, "y")])


def test_two_functions_combine_into_one_candidate() -> None:
    first = _by_operator("clamp", "compare")[0]
    second = _by_operator("size", "arithmetic")[0]
    both = combine([first, second])
    after = both.apply(SOURCE)
    assert first.apply(SOURCE) != after != second.apply(SOURCE)
    assert len(_changed_lines(SOURCE, after)) == 4 and both.function == "clamp+Window.size"
    with pytest.raises(ValueError, match="different files"):
        combine([first, Mutation("compare", "other.py", "g", 1, "", ())])


@pytest.mark.slow  # tens of seconds; the default suite keeps a check of each operator
def test_every_mutation_of_the_vendored_libraries_parses() -> None:
    """Sites of every operator on every mutable file of the vendored sdists (no sandbox: pure text); the generator
    judges a mutation on the function's own lines, this checks the whole module still parses."""
    from workers.coding.libraries import load_library, vendored_sources

    total = 0
    for name in vendored_sources():
        library = load_library(name)
        for path in library.mutable_files:
            source = library.text(path)
            for function in find_functions(path, source):
                for index, mutation in enumerate(repair_mutations(source, function)):
                    if index % 4 == 0:  # a quarter, to stay quick: parsing the whole module each time is the cost
                        ast.parse(mutation.apply(source))
                    total += 1
                gutted = implement_mutation(source, function)
                if gutted is not None:
                    ast.parse(gutted.apply(source))
    assert total > 1000


def test_sources_manifest_matches_the_vendored_files() -> None:
    from workers.coding.libraries import SOURCES_DIR, vendored_sources

    names = {Path(p).name for p in glob.glob(str(SOURCES_DIR / "*.tar.gz"))}
    assert names == {source.filename for source in vendored_sources().values()}
    assert not {"inflection", "parse"} & set(vendored_sources())  # kept for an independent check
    for source in vendored_sources().values():
        files = unpack((SOURCES_DIR / source.filename).read_bytes(), strip_top=True)
        assert any(p.endswith(".py") for p in files)
