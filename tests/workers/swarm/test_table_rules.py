"""The wide-table scorer's rules (issue 36 §1; docs/wide-table-scoring.md), one function each: the required-columns
rule, case only where it carries meaning, set-valued cells in any order, and key matching by documented normalisers
and a task's own aliases. Each `test_*_scores` case failed on the scorer before these rules."""

from __future__ import annotations

from typing import Any

import pytest

from workers.rewards.table import (
    TableSpecError,
    build_key_spellings,
    fold_case,
    gold_table_from,
    join_separators,
    normalize_cell,
    normalize_key,
    parse_markdown_table,
    split_items,
    strip_markup,
    strip_section_suffix,
)
from workers.rewards.table_score import cell_score, columns_problem, key_of, map_columns, score_table, set_score

MAN: dict[str, Any] = {
    "columns": ["command", "option", "files"],
    "key_columns": ["command"],
    "rows": [
        {"command": "ls(1)", "option": "-I", "files": "a.txt, b.txt, c.txt"},
        {"command": "git-log", "option": "--oneline", "files": "none"},
    ],
    "metrics": {"files": "set_match"},
}


def _answer(*rows: tuple[str, str, str], header: str = "| command | option | files |") -> str:
    return "\n".join([header, "|---|---|---|", *(f"| {a} | {b} | {c} |" for a, b, c in rows)])


RIGHT = (("ls(1)", "-I", "a.txt, b.txt, c.txt"), ("git-log", "--oneline", "none"))


def test_the_right_table_scores_one() -> None:
    score = score_table(_answer(*RIGHT), gold_table_from(MAN))
    assert (score.item_f1, score.row_f1, score.success) == (1.0, 1.0, 1.0)
    assert score.missing_columns == () and score.extra_columns == ()


# --- the required-columns rule --------------------------------------------------------------------------------------


def test_a_keys_only_table_scores_zero_on_every_metric() -> None:
    score = score_table("| command |\n|---|\n| ls(1) |\n| git-log |", gold_table_from(MAN))
    assert score.metrics()["item_f1"] == 0.0 and score.row_f1 == 0.0 and score.success == 0.0
    assert score.item_precision == 0.0 and score.item_recall == 0.0
    assert score.parsed and score.missing_columns == ("option", "files")
    assert score.metrics()["table_missing_columns"] == 2.0


def test_a_table_missing_one_column_scores_zero_even_with_every_other_cell_right() -> None:
    answer = "| command | option |\n|---|---|\n| ls(1) | -I |\n| git-log | --oneline |"
    score = score_table(answer, gold_table_from(MAN))
    assert score.item_f1 == 0.0 and score.missing_columns == ("files",)


def test_a_blank_cell_scores_zero_but_keeps_its_column() -> None:
    score = score_table(_answer(("ls(1)", "", "a.txt, b.txt, c.txt"), RIGHT[1]), gold_table_from(MAN))
    assert score.missing_columns == () and score.item_f1 == pytest.approx(5 / 6)


def test_an_extra_column_scores_zero_unless_the_task_ignores_extra_columns() -> None:
    header = "| command | option | files | notes |"
    answer = "\n".join([header, "|---|---|---|---|", *(f"| {a} | {b} | {c} | x |" for a, b, c in RIGHT)])
    refused = score_table(answer, gold_table_from(MAN))
    assert refused.item_f1 == 0.0 and refused.extra_columns == ("notes",)
    ignored = score_table(answer, gold_table_from({**MAN, "extra_columns": "ignore"}))
    assert ignored.item_f1 == 1.0 and ignored.extra_columns == ("notes",)


def test_map_columns_and_columns_problem() -> None:
    gold = gold_table_from({**MAN, "aliases": {"option": ["flag"]}})
    header = "| **Command** | Flag | files | command | |\n|---|---|---|---|---|\n"
    table = parse_markdown_table(header + "| a | b | c | d | |")
    assert table is not None
    mapped = map_columns(table, gold)
    # the second "command" repeats a mapped column (extra); the blank trailing column is formatting (ignored)
    assert mapped.mapping == {"command": 0, "option": 1, "files": 2} and mapped.extra == ("command",)
    assert columns_problem(mapped, gold) == "the table has column(s) the task does not ask for: command"
    keys_only = parse_markdown_table("| command |\n|---|\n| a |")
    assert keys_only is not None
    assert columns_problem(map_columns(keys_only, gold), gold) == "the table lacks column(s) option, files"


# --- case ----------------------------------------------------------------------------------------------------------


def test_an_option_in_the_wrong_case_scores() -> None:
    score = score_table(_answer(("ls(1)", "-i", "a.txt, b.txt, c.txt"), RIGHT[1]), gold_table_from(MAN))
    assert score.item_f1 == pytest.approx(5 / 6) and score.row_f1 < 1.0


def test_fold_case_keeps_options_and_lowercases_the_rest() -> None:
    assert fold_case("Use -I Or --Ignore-Backups=X") == "use -I or --Ignore-Backups=X"
    assert fold_case("-5 Items") == "-5 items"  # a number is no option (and has no case)
    assert cell_score("-i", "-I", "exact_match") == 0.0
    assert cell_score("**-I**", "-I", "exact_match") == 1.0
    assert cell_score("ls -L", "ls -l", "exact_match") == 0.0
    assert cell_score("LS -l", "ls -l", "exact_match") == 1.0


def test_a_case_sensitive_column_keeps_case_everywhere() -> None:
    gold = gold_table_from({**MAN, "case_sensitive": ["files"]})
    score = score_table(_answer(("ls(1)", "-I", "A.txt, b.txt, c.txt"), RIGHT[1]), gold)
    assert score.item_f1 == pytest.approx(5 / 6)
    assert normalize_cell("Os.Path", case_sensitive=True) == "Os.Path"


# --- set-valued cells ----------------------------------------------------------------------------------------------


def test_a_set_in_another_order_scores() -> None:
    score = score_table(_answer(("ls(1)", "-I", "c.txt; `a.txt`<br>b.txt"), RIGHT[1]), gold_table_from(MAN))
    assert score.item_f1 == 1.0 and score.success == 1.0


def test_split_items_and_set_scores() -> None:
    assert split_items("**B**, a;\nc, a, ") == frozenset({"a", "b", "c"})
    assert set_score("c, b, a", "a, b, c") == 1.0
    assert set_score("a, b", "a, b, c") == 0.0  # set_match: the exact set or nothing
    assert set_score("a, b", "a, b, c", partial=True) == pytest.approx(2 * 2 / 5)  # set_f1: partial credit
    assert set_score("", "a") == 0.0
    assert cell_score("b, a", "a, b", "set_f1") == 1.0
    assert cell_score("b, a", "a, b", "exact_match") == 0.0  # order matters unless the column is a set


# --- key matching --------------------------------------------------------------------------------------------------


def test_a_key_with_a_section_suffix_or_other_separators_scores() -> None:
    gold = gold_table_from(MAN)
    answer = _answer(("`ls`", "-I", "a.txt, b.txt, c.txt"), ("Git Log", "--oneline", "none"))
    assert score_table(answer, gold).item_f1 == 1.0
    answer = _answer(("ls (1)", "-I", "a.txt, b.txt, c.txt"), ("[git_log](https://x)", "--oneline", "none"))
    assert score_table(answer, gold).item_f1 == 1.0


def test_a_task_key_alias_scores() -> None:
    gold = gold_table_from({**MAN, "key_aliases": {"git-log": ["git whatchanged"]}})
    answer = _answer(RIGHT[0], ("git-whatchanged", "--oneline", "none"))
    assert score_table(answer, gold).item_f1 == 1.0
    assert score_table(answer, gold_table_from(MAN)).item_f1 < 1.0  # without the alias it names no gold row


def test_key_normalisers() -> None:
    assert strip_markup("**[ls](man:ls)** and `__init__`") == "ls and __init__"
    assert strip_markup("a<br/>b") == "a\nb"
    assert normalize_cell("\\*args, \\*\\*kw") == normalize_cell("*args, **kw") == "*args, **kw"
    assert normalize_cell("*args") != normalize_cell("args")
    assert normalize_cell("`\\*x`") == "\\*x"  # a code span is literal
    assert strip_section_suffix("printf(3p)") == "printf" and strip_section_suffix("ls ()") == "ls"
    assert strip_section_suffix("open(path)") == "open(path)"
    assert join_separators("a b") == join_separators("a-b") == join_separators("a_b") == join_separators("a - b")
    assert join_separators("ls -l") == "ls -l" and join_separators("__init__") == "__init__"
    assert normalize_key("Git_Log(1)") == normalize_key("git log") == "git log"
    assert normalize_key("-I") != normalize_key("-i")
    gold = gold_table_from({**MAN, "key_aliases": {"ls(1)": ["list"]}})
    assert key_of({"command": "LIST"}, gold) == key_of({"command": "ls"}, gold) == ("ls",)
    assert build_key_spellings(gold)["command"] == {"ls": "ls", "git log": "git log", "list": "ls"}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"rows": [{**MAN["rows"][0]}, {**MAN["rows"][0], "command": "LS"}]}, r"rows\[1\] repeats the key"),
        ({"rows": [{**MAN["rows"][1]}, {**MAN["rows"][1], "command": "git log"}]}, r"rows\[1\] repeats the key"),
        ({"rows": [{**MAN["rows"][0], "command": "()"}]}, r"rows\[0\]: a key cell is blank"),
        ({"key_aliases": {"nope": ["x"]}}, r"key_aliases names 'nope'"),
        ({"key_aliases": {"ls(1)": "list"}}, "key_aliases must map"),
        ({"key_aliases": {"ls(1)": ["Git_Log"]}}, r"key_aliases\['ls\(1\)'\].*already names the key 'git log'"),
        ({"case_sensitive": ["nope"]}, "case_sensitive"),
        ({"extra_columns": "drop"}, "extra_columns must be one of refuse, ignore"),
        ({"metrics": {"files": "bag"}}, "set_match, set_f1"),
    ],
)
def test_a_spec_that_would_confuse_the_rules_is_refused_naming_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(TableSpecError, match=field):
        gold_table_from({**MAN, **change})


def test_the_new_fields_round_trip_through_json() -> None:
    spec = {**MAN, "key_aliases": {"ls(1)": ["list"]}, "case_sensitive": ["option"], "extra_columns": "ignore"}
    gold = gold_table_from(spec)
    assert gold_table_from(gold.to_json()) == gold
    assert gold.to_json()["key_aliases"] == {"ls(1)": ["list"]}
