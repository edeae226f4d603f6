"""WideSearch's table scoring (docs/methods.md B2; docs/wide-table-scoring.md): an answer table against the gold one,
cell by cell (exact, number within tolerance, sets of items), rows matched by their key columns, item- and
row-level precision, recall and F1 (`score_table`). `workers.rewards.table` parses and normalises the tables."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workers.rewards.table import (
    NUMBER_TOLERANCE,
    CellMetric,
    GoldTable,
    Table,
    TableSpecError,
    gold_table_from,
    normalize_cell,
    normalize_column,
    normalize_key,
    parse_markdown_table,
    split_items,
)
from workers.rewards.table_widesearch import date_near, in_match, preprocess, url_match

_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?|[-+]?\.\d+")


def _number(text: str) -> float | None:
    match = _NUMBER.search(text.replace(" ", ""))
    if not match:
        return None
    try:
        return float(match.group(0).replace(",", ""))
    except ValueError:
        return None


def set_score(predicted: object, gold: object, *, partial: bool = False, case_sensitive: bool = False) -> float:
    """A set-valued cell's score: its items (`split_items`) against the gold items in any order. 1 when the sets
    are equal, else 0; with `partial` (the `set_f1` metric) the F1 of the two sets, 2|P∩G| / (|P| + |G|)."""
    pred = split_items(predicted, case_sensitive=case_sensitive)
    ref = split_items(gold, case_sensitive=case_sensitive)
    if not pred or not ref:
        return 0.0
    if not partial:
        return 1.0 if pred == ref else 0.0
    return 2 * len(pred & ref) / (len(pred) + len(ref))


def cell_score(
    predicted: str,
    gold: str,
    metric: CellMetric,
    tolerance: float = NUMBER_TOLERANCE,
    *,
    case_sensitive: bool = False,
    steps: Sequence[str] = (),
) -> float:
    """One cell's score in [0, 1] under `metric`, after the column's WideSearch preprocessors `steps` on both
    cells (`table_widesearch`); a blank prediction scores 0."""
    if steps:
        if not str(predicted).strip():
            return 0.0
        predicted, gold = preprocess(str(predicted), steps), preprocess(str(gold), steps)
    if metric in ("set_match", "set_f1"):
        return set_score(predicted, gold, partial=metric == "set_f1", case_sensitive=case_sensitive)
    pred = normalize_cell(predicted, case_sensitive=case_sensitive)
    ref = normalize_cell(gold, case_sensitive=case_sensitive)
    if not pred:
        return 0.0
    if metric == "number_near":
        a, b = _number(pred), _number(ref)
        if a is None or b is None:
            return 1.0 if pred == ref else 0.0
        if b == 0:
            return 1.0 if abs(a) <= tolerance else 0.0
        return 1.0 if abs(a - b) / abs(b) <= tolerance else 0.0
    if metric == "contains":
        return 1.0 if ref and ref in pred else 0.0
    if metric == "in_match":
        return in_match(pred, ref)
    if metric == "date_near":
        return date_near(pred, ref)
    if metric == "url_match":
        return url_match(str(predicted), str(gold))  # the raw cells: a link's target is its URL
    return 1.0 if pred == ref else 0.0


@dataclass(frozen=True)
class TableScore:
    """Item- and row-level precision, recall and F1 (fractions in [0, 1]) and the counts they come from.

    `missing_columns`: gold columns the answer table lacks; `extra_columns`: answer columns (as written) that map
    onto no gold column. A missing column makes every score 0, and so does an extra one unless the task sets
    `extra_columns: ignore`: the required-columns rule (`columns_problem`)."""

    item_precision: float
    item_recall: float
    item_f1: float
    row_precision: float
    row_recall: float
    row_f1: float
    success: float
    predicted_rows: int
    gold_rows: int
    matched_rows: int
    mapped_columns: int
    parsed: bool
    missing_columns: tuple[str, ...] = ()
    extra_columns: tuple[str, ...] = ()

    def metrics(self) -> dict[str, float]:
        return {
            "item_f1": self.item_f1,
            "item_precision": self.item_precision,
            "item_recall": self.item_recall,
            "row_f1": self.row_f1,
            "row_precision": self.row_precision,
            "row_recall": self.row_recall,
            "success": self.success,
            "table_rows": float(self.predicted_rows),
            "table_missing_columns": float(len(self.missing_columns)),
            "table_extra_columns": float(len(self.extra_columns)),
        }


def _f1(precision: float, recall: float) -> float:
    return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0


@dataclass(frozen=True)
class ColumnMap:
    """How a predicted header maps onto the gold columns: gold column -> predicted index, the gold columns no
    predicted column maps onto, and the predicted columns (as written) that map onto no gold column or repeat one
    already mapped."""

    mapping: dict[str, int]
    missing: tuple[str, ...]
    extra: tuple[str, ...]


def map_columns(table: Table, gold: GoldTable) -> ColumnMap:
    """Map `table`'s columns onto `gold`'s: equal `normalize_column` names, or a name the gold column lists among
    its `aliases`; the first predicted column for a gold column wins. A column with a blank header and no
    non-blank cell is formatting, neither mapped nor extra."""
    names: dict[str, str] = {}
    for column in gold.columns:
        for name in [column, *gold.aliases.get(column, [])]:
            names.setdefault(normalize_column(name), column)
    mapping: dict[str, int] = {}
    extra: list[str] = []
    for index, name in enumerate(table.columns):
        mapped = names.get(normalize_column(name))
        if mapped is not None and mapped not in mapping:
            mapping[mapped] = index
        elif normalize_column(name) or any(row[index].strip() for row in table.rows):
            extra.append(name)
    missing = tuple(column for column in gold.columns if column not in mapping)
    return ColumnMap(mapping=mapping, missing=missing, extra=tuple(extra))


def columns_problem(columns: ColumnMap, gold: GoldTable) -> str | None:
    """The required-columns rule (WideSearch scores a table 0 on every metric unless its columns are the task's):
    None when `columns` carries every gold column (and, unless `gold.extra_columns` is `ignore`, no other), else
    why not."""
    if columns.missing:
        return f"the table lacks column(s) {', '.join(columns.missing)}"
    if columns.extra and gold.extra_columns == "refuse":
        return f"the table has column(s) the task does not ask for: {', '.join(columns.extra)}"
    return None


def key_of(row: Mapping[str, str], gold: GoldTable) -> tuple[str, ...]:
    """A row's key: its key-column cells by `normalize_key`, a `key_aliases` spelling read as its gold value."""
    out = []
    for column in gold.key_columns:
        form = normalize_key(row.get(column, ""), case_sensitive=column in gold.case_sensitive)
        out.append(gold.key_spellings[column].get(form, form))
    return tuple(out)


def predicted_rows(table: Table, gold: GoldTable) -> tuple[dict[tuple[str, ...], dict[str, str]], int] | None:
    """The predicted rows by key, their cells under the gold column names (columns mapped, rows deduplicated on
    the key, the first row of a key kept, a row without a key left out), and how many columns mapped; None when a
    key column maps onto nothing. Pairs rows whatever `columns_problem` says (the trajectory page shows them)."""
    mapping = map_columns(table, gold).mapping
    if any(key not in mapping for key in gold.key_columns):
        return None
    predicted: dict[tuple[str, ...], dict[str, str]] = {}
    for cells in table.rows:
        row = {column: cells[index] for column, index in mapping.items()}
        key = key_of(row, gold)
        if all(key) and key not in predicted:
            predicted[key] = row
    return predicted, len(mapping)


def row_cell_scores(row: Mapping[str, str], gold_row: Mapping[str, str], gold: GoldTable) -> list[float]:
    """Each gold column's score for a matched row (key cells score 1)."""
    return [
        1.0
        if column in gold.key_columns
        else cell_score(
            row.get(column, ""),
            gold_row[column],
            gold.metrics.get(column, "exact_match"),
            gold.tolerances.get(column, gold.tolerance),
            case_sensitive=column in gold.case_sensitive,
            steps=gold.preprocess.get(column, ()),
        )
        for column in gold.columns
    ]


def score_table(answer: str | None, gold: GoldTable) -> TableScore:
    """Score the first Markdown table in `answer` against `gold` (module docstring, steps 1-6). No table, or one
    that fails the required-columns rule, scores 0 on every metric: `parsed`, `missing_columns` and
    `extra_columns` tell which."""
    # One function on purpose: the module docstring's steps 1-6 in order, on one parsed table.
    table = parse_markdown_table(answer)
    width = len(gold.columns)
    if table is None:
        return TableScore(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, len(gold.rows), 0, 0, False)
    columns = map_columns(table, gold)
    paired = predicted_rows(table, gold)
    if paired is None or columns_problem(columns, gold) is not None:
        return TableScore(
            0.0,
            0.0,
            0.0,
            0.0,
            0.0,
            0.0,
            0.0,
            len(paired[0]) if paired is not None else len(table.rows),
            len(gold.rows),
            0,
            len(columns.mapping),
            True,
            missing_columns=columns.missing,
            extra_columns=columns.extra,
        )
    predicted, mapped = paired
    n_pred = len(predicted)
    tp = 0.0
    rows_right = 0
    matched = 0
    for gold_row in gold.rows:
        found = predicted.get(key_of(gold_row, gold))
        if found is None:
            continue
        matched += 1
        scores = row_cell_scores(found, gold_row, gold)
        tp += math.fsum(scores)
        rows_right += 1 if min(scores) >= 1.0 else 0
    # docs/methods.md B2: P_item = TP / (n_pred_rows · |C|), R_item = TP / (n_gt_rows · |C|)
    item_p = tp / (n_pred * width) if n_pred else 0.0
    item_r = tp / (len(gold.rows) * width)
    row_p = rows_right / n_pred if n_pred else 0.0
    row_r = rows_right / len(gold.rows)
    item_f1, row_f1 = _f1(item_p, item_r), _f1(row_p, row_r)
    success = 1.0 if rows_right == len(gold.rows) == n_pred else 0.0
    return TableScore(
        item_precision=item_p,
        item_recall=item_r,
        item_f1=item_f1,
        row_precision=row_p,
        row_recall=row_r,
        row_f1=row_f1,
        success=success,
        predicted_rows=n_pred,
        gold_rows=len(gold.rows),
        matched_rows=matched,
        mapped_columns=mapped,
        parsed=True,
        extra_columns=columns.extra,
    )


def table_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """Item- and row-level scores of the answer table against the record's `gold_table` ({} without one)."""
    gold = record.get("gold_table")
    if not isinstance(gold, Mapping):
        return {}
    try:
        table = gold_table_from(gold)
    except TableSpecError:
        return {}
    answer = record.get("answer")
    return score_table(answer if isinstance(answer, str) else None, table).metrics()
