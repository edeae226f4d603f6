"""WideSearch's table scoring (docs/methods.md B2) against hand-computed cases."""

from __future__ import annotations

import pytest

from workers.rewards.table import (
    TableSpecError,
    gold_table_from,
    normalize_cell,
    parse_markdown_table,
    render_markdown_table,
)
from workers.rewards.table_score import cell_score, score_table

GOLD = {
    "columns": ["name", "document", "year"],
    "key_columns": ["name"],
    "rows": [
        {"name": "alpha", "document": "doc:a", "year": "1990"},
        {"name": "beta", "document": "doc:b", "year": "2001"},
        {"name": "gamma", "document": "doc:c", "year": "1875"},
        {"name": "delta", "document": "doc:d", "year": "1950"},
    ],
    "metrics": {"year": "number_near"},
}


def test_a_perfect_table_scores_one_everywhere() -> None:
    gold = gold_table_from(GOLD)
    score = score_table(render_markdown_table(gold.columns, gold.rows), gold)
    assert (score.item_f1, score.row_f1, score.success) == (1.0, 1.0, 1.0)


def test_item_precision_and_recall_follow_b2_by_hand() -> None:
    # 3 predicted rows (one twice: deduplicated), one unknown key, one wrong cell, one row missing.
    answer = """Here is the table:

| Name | Document | Year |
|:-----|----------|-----:|
| **Alpha** | doc:a | 1,990 |
| beta | doc:x | 2001 |
| beta | doc:b | 2001 |
| omega | doc:o | 1 |
"""
    score = score_table(answer, gold_table_from(GOLD))
    # matched rows alpha (3 of 3 cells) and beta (key 1 + year 1, document wrong: 2 of 3); TP = 5
    assert score.predicted_rows == 3 and score.matched_rows == 2
    assert score.item_precision == pytest.approx(5 / (3 * 3))
    assert score.item_recall == pytest.approx(5 / (4 * 3))
    p, r = 5 / 9, 5 / 12
    assert score.item_f1 == pytest.approx(2 * p * r / (p + r))
    assert score.row_precision == pytest.approx(1 / 3) and score.row_recall == pytest.approx(1 / 4)
    assert score.success == 0.0


def test_columns_map_by_normalised_name_or_alias_and_an_ignored_extra_column_adds_nothing() -> None:
    gold = gold_table_from({**GOLD, "aliases": {"year": ["Built in"]}, "extra_columns": "ignore"})
    answer = "| name | built in | Document | notes |\n|---|---|---|---|\n| alpha | 1990 | doc:x | x |\n"
    score = score_table(answer, gold)
    assert score.mapped_columns == 3 and score.extra_columns == ("notes",)
    assert score.item_recall == pytest.approx(2 / 12)  # key + year of one row; its document is wrong
    # without the document column the table fails the required-columns rule (docs/methods.md B2): 0 everywhere
    missing = score_table("| name | built in |\n|---|---|\n| alpha | 1990 |\n", gold)
    assert missing.item_recall == 0.0 and missing.missing_columns == ("document",)


def test_no_table_or_no_key_column_scores_zero() -> None:
    gold = gold_table_from(GOLD)
    assert score_table("I could not find it.", gold).item_f1 == 0.0
    assert not score_table("I could not find it.", gold).parsed
    no_key = score_table("| document | year |\n|---|---|\n| doc:a | 1990 |", gold)
    assert no_key.parsed and no_key.item_f1 == 0.0


def test_cell_metrics() -> None:
    assert cell_score("1,000", "1000", "number_near") == 1.0
    assert cell_score("1040", "1000", "number_near") == 1.0
    assert cell_score("1100", "1000", "number_near") == 0.0
    assert cell_score("in doc:a, section 2", "doc:a", "contains") == 1.0
    assert cell_score("", "x", "exact_match") == 0.0
    assert normalize_cell(" `Os.Path.Join`. ") == "os.path.join"


def test_parse_is_lenient_about_pipes_and_ragged_rows() -> None:
    table = parse_markdown_table("a | b\n--- | ---\n1 | 2 | 3\n4 |\nno pipe ends it\n| 5 | 6 |")
    assert table is not None
    assert table.columns == ["a", "b"] and table.rows == [["1", "2"], ["4", ""]]
    assert parse_markdown_table("| a | b |\n| x | y |") is None  # no separator row: not a table


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"columns": []}, "columns"),
        ({"columns": ["name", "Name"]}, "columns"),
        ({"key_columns": ["nope"]}, "key_columns"),
        ({"rows": []}, "rows"),
        ({"rows": [{"name": "a", "document": "d"}]}, "rows[0]"),
        (
            {"rows": [{"name": "a", "document": "d", "year": "1"}, {"name": "A", "document": "e", "year": "2"}]},
            "rows[1]",
        ),
        ({"metrics": {"year": "fuzzy"}}, "metrics"),
        ({"tolerance": 2}, "tolerance"),
    ],
)
def test_a_malformed_gold_table_is_refused_naming_the_field(change: dict[str, object], field: str) -> None:
    with pytest.raises(TableSpecError, match=field.replace("[", r"\[").replace("]", r"\]")):
        gold_table_from({**GOLD, **change})
