"""WideSearch's table answers and their scores (methods.md B2, `ByteDance-Seed/WideSearch` evaluation.py).

A wide task's answer is a Markdown table: N entities (rows) × M attributes (columns), one key column (or several)
naming the entity. Scoring, as WideSearch does it:

1. normalise column names and map the predicted columns onto the gold ones;
2. deduplicate predicted rows on the key columns (the first row of a key wins);
3. inner-join predicted and gold rows on the key columns;
4. score every cell of a matched row by its column's metric (key cells score 1);
5. item level: TP = Σ cell scores, P = TP / (n_pred_rows · |C|), R = TP / (n_gt_rows · |C|), F1 = 2PR / (P + R);
   row level: a row's score is the minimum of its cells, and P, R use row counts; success: the table matches
   exactly (or every P, R, F1 is 1).

Departures, all visible here: WideSearch maps columns and keys with an LLM and judges some columns with one; this
module maps a predicted column onto a gold column when their normalised names are equal or the gold column lists
the name among its `aliases`, and scores cells by code only: `exact_match` (after `normalize_cell`), `number_near`
(relative tolerance) or `contains` (the normalised gold value occurs in the predicted cell). A predicted column that
maps onto nothing adds nothing to TP; |C| is always the gold table's column count.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

CellMetric = Literal["exact_match", "number_near", "contains"]
CELL_METRICS: tuple[CellMetric, ...] = ("exact_match", "number_near", "contains")
NUMBER_TOLERANCE = 0.05
"""`number_near`'s default relative tolerance: WideSearch's number_near accepts a small relative error."""

MAX_TABLE_ROWS = 1000
MAX_TABLE_COLUMNS = 64

_SEPARATOR_CELL = re.compile(r"^:?-{1,}:?$")
_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?|[-+]?\.\d+")


def normalize_cell(text: object) -> str:
    """A cell's comparable form: NFKC, lowercase, Markdown emphasis and backticks dropped, surrounding quotes and
    punctuation stripped, whitespace collapsed. "`Os.Path.Join`" and "os.path.join." compare equal."""
    value = unicodedata.normalize("NFKC", str(text if text is not None else "")).lower()
    value = re.sub(r"[`*_]{1,3}(?=\S)|(?<=\S)[`*_]{1,3}", "", value)
    value = " ".join(value.split())
    return value.strip(" \t\"'“”‘’.,;:")


def normalize_column(name: object) -> str:
    """A column name's comparable form: lowercase, runs of non-alphanumerics as one underscore ("Added in" ->
    "added_in")."""
    text = unicodedata.normalize("NFKC", str(name if name is not None else "")).lower()
    return re.sub(r"[^0-9a-z]+", "_", text).strip("_")


@dataclass(frozen=True)
class Table:
    """A parsed table: column names as written, and rows of cells (each row as long as `columns`)."""

    columns: list[str]
    rows: list[list[str]]


def _cells(line: str) -> list[str]:
    body = line.strip()
    if body.startswith("|"):
        body = body[1:]
    if body.endswith("|") and not body.endswith("\\|"):
        body = body[:-1]
    parts = re.split(r"(?<!\\)\|", body)
    return [part.strip().replace("\\|", "|") for part in parts]


def parse_markdown_table(text: str | None) -> Table | None:
    """The first Markdown table in `text` (a header row, a separator row of dashes, then body rows), or None.

    Lenient where models are sloppy: leading and trailing pipes are optional, a body row with too few cells is
    padded with blanks and one with too many is cut, blank rows end the table, and at most `MAX_TABLE_ROWS` rows
    and `MAX_TABLE_COLUMNS` columns are read."""
    if not text:
        return None
    lines = text.splitlines()
    for index in range(len(lines) - 1):
        header, separator = lines[index], lines[index + 1]
        if "|" not in header or "-" not in separator:
            continue
        sep_cells = _cells(separator)
        if not sep_cells or not all(_SEPARATOR_CELL.match(cell.replace(" ", "")) for cell in sep_cells):
            continue
        columns = _cells(header)[:MAX_TABLE_COLUMNS]
        if not any(columns):
            continue
        rows: list[list[str]] = []
        for line in lines[index + 2 :]:
            if not line.strip() or "|" not in line:
                break
            cells = _cells(line)[: len(columns)]
            cells += [""] * (len(columns) - len(cells))
            rows.append(cells)
            if len(rows) >= MAX_TABLE_ROWS:
                break
        return Table(columns=columns, rows=rows)
    return None


def render_markdown_table(columns: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> str:
    """`rows` (dicts by column) as a Markdown table with `columns` in order; pipes in cells are escaped."""

    def cell(value: Any) -> str:
        return " ".join(str("" if value is None else value).split()).replace("|", "\\|")

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


@dataclass(frozen=True)
class GoldTable:
    """A wide task's reference table (the task row's `table` field, validated by `gold_table_from`).

    `columns`: the gold column names, in order; `key_columns`: the columns that name an entity (a non-empty
    subset of `columns`); `rows`: one dict per entity; `metrics`: each column's cell metric (`exact_match` when
    absent); `aliases`: other names a predicted column may carry for each gold column; `tolerance`: `number_near`'s
    relative tolerance."""

    columns: list[str]
    key_columns: list[str]
    rows: list[dict[str, str]]
    metrics: dict[str, CellMetric] = field(default_factory=dict)
    aliases: dict[str, list[str]] = field(default_factory=dict)
    tolerance: float = NUMBER_TOLERANCE

    def to_json(self) -> dict[str, Any]:
        return {
            "columns": list(self.columns),
            "key_columns": list(self.key_columns),
            "rows": [dict(row) for row in self.rows],
            "metrics": dict(self.metrics),
            "aliases": {k: list(v) for k, v in self.aliases.items()},
            "tolerance": self.tolerance,
        }


class TableSpecError(ValueError):
    """A task row's `table` is malformed; the message names the field and the fix."""


def gold_table_from(value: object, *, where: str = "table") -> GoldTable:
    """Validate a task row's `table` field ({"columns", "key_columns", "rows", optional "metrics", "aliases",
    "tolerance"}); raises `TableSpecError` naming the field."""
    if not isinstance(value, Mapping):
        raise TableSpecError(f"{where} must be an object with columns, key_columns and rows")
    columns = value.get("columns")
    if (
        not isinstance(columns, list)
        or not columns
        or len(columns) > MAX_TABLE_COLUMNS
        or not all(isinstance(c, str) and c.strip() for c in columns)
    ):
        raise TableSpecError(f"{where}.columns must be a list of 1-{MAX_TABLE_COLUMNS} non-blank column names")
    normalised = [normalize_column(c) for c in columns]
    if len(set(normalised)) != len(normalised):
        raise TableSpecError(f"{where}.columns: two columns normalise to the same name ({normalised})")
    keys = value.get("key_columns")
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) and k in columns for k in keys):
        raise TableSpecError(f"{where}.key_columns must be a non-empty list of names from {where}.columns")
    rows = value.get("rows")
    if not isinstance(rows, list) or not rows or len(rows) > MAX_TABLE_ROWS:
        raise TableSpecError(f"{where}.rows must be a list of 1-{MAX_TABLE_ROWS} row objects")
    clean_rows: list[dict[str, str]] = []
    seen_keys: set[tuple[str, ...]] = set()
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise TableSpecError(f"{where}.rows[{i}] must be an object with a value per column")
        missing = [c for c in columns if row.get(c) is None or not str(row.get(c)).strip()]
        if missing:
            raise TableSpecError(f"{where}.rows[{i}] has no value for column(s) {', '.join(missing)}")
        clean = {c: str(row[c]).strip() for c in columns}
        key = tuple(normalize_cell(clean[k]) for k in keys)
        if key in seen_keys:
            raise TableSpecError(f"{where}.rows[{i}] repeats the key {key}; each entity appears once")
        seen_keys.add(key)
        clean_rows.append(clean)
    metrics_raw = value.get("metrics") or {}
    if not isinstance(metrics_raw, Mapping):
        raise TableSpecError(f"{where}.metrics must map column names to one of {', '.join(CELL_METRICS)}")
    metrics: dict[str, CellMetric] = {}
    for name, metric in metrics_raw.items():
        if name not in columns:
            raise TableSpecError(f"{where}.metrics names column {name!r}, which is not in {where}.columns")
        if metric not in CELL_METRICS:
            raise TableSpecError(f"{where}.metrics[{name!r}] must be one of {', '.join(CELL_METRICS)}, got {metric!r}")
        metrics[str(name)] = metric
    aliases_raw = value.get("aliases") or {}
    if not isinstance(aliases_raw, Mapping) or not all(
        name in columns and isinstance(v, list) and all(isinstance(a, str) for a in v)
        for name, v in aliases_raw.items()
    ):
        raise TableSpecError(f"{where}.aliases must map column names of {where}.columns to lists of other names")
    tolerance = value.get("tolerance", NUMBER_TOLERANCE)
    if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or not 0 <= tolerance < 1:
        raise TableSpecError(f"{where}.tolerance must be a relative tolerance in [0, 1), got {tolerance!r}")
    return GoldTable(
        columns=list(columns),
        key_columns=list(keys),
        rows=clean_rows,
        metrics=metrics,
        aliases={str(k): list(v) for k, v in aliases_raw.items()},
        tolerance=float(tolerance),
    )


def _number(text: str) -> float | None:
    match = _NUMBER.search(text.replace(" ", ""))
    if not match:
        return None
    try:
        return float(match.group(0).replace(",", ""))
    except ValueError:
        return None


def cell_score(predicted: str, gold: str, metric: CellMetric, tolerance: float = NUMBER_TOLERANCE) -> float:
    """One cell's score in [0, 1] under `metric`; a blank prediction scores 0."""
    pred, ref = normalize_cell(predicted), normalize_cell(gold)
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
    return 1.0 if pred == ref else 0.0


@dataclass(frozen=True)
class TableScore:
    """Item- and row-level precision, recall and F1 (fractions in [0, 1]) and the counts they come from."""

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
        }


def _f1(precision: float, recall: float) -> float:
    return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0


def _column_map(predicted: Sequence[str], gold: GoldTable) -> dict[str, int]:
    """Gold column -> index of the predicted column it maps onto (first one wins)."""
    names: dict[str, str] = {}
    for column in gold.columns:
        for name in [column, *gold.aliases.get(column, [])]:
            names.setdefault(normalize_column(name), column)
    out: dict[str, int] = {}
    for index, name in enumerate(predicted):
        mapped = names.get(normalize_column(name))
        if mapped is not None and mapped not in out:
            out[mapped] = index
    return out


def key_of(row: Mapping[str, str], gold: GoldTable) -> tuple[str, ...]:
    """A row's key: its normalised key-column cells."""
    return tuple(normalize_cell(row.get(key, "")) for key in gold.key_columns)


def predicted_rows(table: Table, gold: GoldTable) -> tuple[dict[tuple[str, ...], dict[str, str]], int] | None:
    """The predicted rows by key, their cells under the gold column names (steps 1-2: columns mapped, rows
    deduplicated on the key, the first row of a key kept, a row without a key left out), and how many columns
    mapped; None when a key column maps onto nothing."""
    mapping = _column_map(table.columns, gold)
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
    """Step 4: each gold column's score for a matched row (key cells score 1)."""
    return [
        1.0
        if column in gold.key_columns
        else cell_score(row.get(column, ""), gold_row[column], gold.metrics.get(column, "exact_match"), gold.tolerance)
        for column in gold.columns
    ]


def score_table(answer: str | None, gold: GoldTable) -> TableScore:
    """Score the first Markdown table in `answer` against `gold` (module docstring, steps 1-5). No table, or one
    whose columns miss a key column, scores 0 with `parsed` telling which."""
    table = parse_markdown_table(answer)
    width = len(gold.columns)
    zero = TableScore(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, len(gold.rows), 0, 0, table is not None)
    if table is None:
        return zero
    paired = predicted_rows(table, gold)
    if paired is None:
        mapped = len(_column_map(table.columns, gold))
        return TableScore(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, len(table.rows), len(gold.rows), 0, mapped, True)
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
    # methods.md B2: P_item = TP / (n_pred_rows · |C|), R_item = TP / (n_gt_rows · |C|)
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
    )
