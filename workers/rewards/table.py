"""WideSearch's table answers and their scores (docs/methods.md B2, `ByteDance-Seed/WideSearch` evaluation.py): the
item-F1 that is PARL's r_perf on a wide task. Every rule below is its own function; docs/wide-table-scoring.md lists
them with where each departs from WideSearch.

A wide task's answer is a Markdown table: N entities (rows) × M attributes (columns), one key column (or several)
naming the entity. Scoring, as WideSearch does it:

1. parse the first Markdown table of the answer (`parse_markdown_table`);
2. map the predicted columns onto the gold ones (`map_columns`: normalised names, or a gold column's `aliases`);
3. the required-columns rule (`columns_problem`): a table that lacks a gold column, or carries a column that maps
   onto none (unless the task sets `extra_columns: ignore`), scores 0 on every metric, so a table of the keys alone
   earns nothing; `TableScore.missing_columns` / `extra_columns` say why;
4. deduplicate predicted rows on the key columns (the first row of a key wins), keys compared by `normalize_key`
   (markup, a trailing man-page section or `()`, case where it carries no meaning, `a b` / `a-b` / `a_b`) and a
   task's `key_aliases`;
5. inner-join predicted and gold rows on the keys and score every other cell by its column's metric (key cells score
   1): `exact_match` and `contains` after `normalize_cell`, `number_near` within a relative tolerance, `set_match` /
   `set_f1` on a cell's items in any order (`split_items`), and WideSearch's `in_match`, `date_near` and
   `url_match` (`table_widesearch`), each after the column's WideSearch preprocessors when it names any;
6. item level: TP = Σ cell scores, P = TP / (n_pred_rows · |C|), R = TP / (n_gt_rows · |C|), F1 = 2PR / (P + R);
   row level: a row's score is the minimum of its cells, and P, R use row counts; success: every row right and no
   extra row.

Case: text is lowercased except a token that starts with `-` or `--` and a letter (a command-line option: `-i` and
`-I` differ) and except the columns a task lists in `case_sensitive`. Departures, all visible here and in the docs:
WideSearch maps columns and keys and judges some columns with an LLM; this module maps them by the documented
normalisers and a task's own aliases only, and scores cells by code only.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from workers.rewards.table_widesearch import PREPROCESSORS

CellMetric = Literal[
    "exact_match", "number_near", "contains", "set_match", "set_f1", "in_match", "date_near", "url_match"
]
CELL_METRICS: tuple[CellMetric, ...] = (
    "exact_match",
    "number_near",
    "contains",
    "set_match",
    "set_f1",
    "in_match",  # WideSearch's rules, workers.rewards.table_widesearch
    "date_near",
    "url_match",
)
ExtraColumns = Literal["refuse", "ignore"]
EXTRA_COLUMNS: tuple[ExtraColumns, ...] = ("refuse", "ignore")
NUMBER_TOLERANCE = 0.05
"""`number_near`'s default relative tolerance: WideSearch's number_near accepts a small relative error."""

MAX_TABLE_ROWS = 1000
MAX_TABLE_COLUMNS = 64

_SEPARATOR_CELL = re.compile(r"^:?-{1,}:?$")
_BREAK = re.compile(r"<br\s*/?>", re.IGNORECASE)
_LINK = re.compile(r"\[([^\]\n]*)\]\([^)\n]*\)")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
_EMPHASIS = re.compile(r"(?<![\w*])(\*\*|\*)(?=\S)(.+?)(?<=\S)\1(?![\w*])", re.DOTALL)
_ESCAPE = re.compile(r"\\([!-/:-@\[-`{-~])")
_OPTION = re.compile(r"^--?[A-Za-z]")
_SECTION_SUFFIX = re.compile(r"\s*\((?:\d[a-z0-9]*)?\)$", re.IGNORECASE)
# a run of separators between two letters or digits: underscores or spaces ("a_b", "a b"), a dash ("a-b"), or a
# spaced dash ("a - b"); never a space before an option's dash ("ls -l" keeps its option)
_KEY_SEPARATOR = re.compile(r"(?<=[^\W_])(?:[ _]*-[ ]+|[ _]+(?!-)|-)(?=[^\W_])")
_ITEM_SPLIT = re.compile(r"[,;\n]")
_EDGE = " \t\"'“”‘’`"


def strip_markup(text: object) -> str:
    """Markdown a model wraps around a value, taken away: NFKC, `<br>` as a line break, a link `[x](y)` as x, code
    spans as their literal content, and asterisk emphasis (`*x*`, `**x**`, `***x***`) outside code spans; a
    backslash escape outside code spans is its character (`\\*args` is `*args`).
    Underscores are never read as emphasis: they belong to identifiers (`first_parameter`, `__init__`, `_private`),
    which models write unescaped."""
    value = unicodedata.normalize("NFKC", str(text if text is not None else ""))
    value = _LINK.sub(r"\1", _BREAK.sub("\n", value))
    out: list[str] = []
    last = 0
    for span in _CODE_SPAN.finditer(value):
        out += [_strip_emphasis(value[last : span.start()]), span.group(2).strip()]
        last = span.end()
    out.append(_strip_emphasis(value[last:]))
    return "".join(out)


def _strip_emphasis(text: str) -> str:
    held: list[str] = []

    def hold(match: re.Match[str]) -> str:  # a backslash-escaped character is literal, never emphasis
        held.append(match.group(1))
        return f"\x00{len(held) - 1}\x00"

    text = _ESCAPE.sub(hold, text.replace("\x00", ""))
    previous = None
    while previous != text:
        previous, text = text, _EMPHASIS.sub(r"\2", text)
    return re.sub(r"\x00(\d+)\x00", lambda match: held[int(match.group(1))], text)


def fold_case(text: str) -> str:
    """`text` lowercased where case carries no meaning: every whitespace-separated token except one that starts
    with `-` or `--` and a letter (a command-line option, where `-i` and `-I` are different options)."""
    return " ".join(token if _OPTION.match(token) else token.lower() for token in text.split(" "))


def normalize_cell(text: object, *, case_sensitive: bool = False) -> str:
    """A cell's comparable form: `strip_markup`, whitespace collapsed, surrounding quotes and stray backticks
    stripped (an asterisk stays: `*args`), trailing `.,;:` stripped, then `fold_case` (skipped for a
    `case_sensitive` column). "`Os.Path.Join`." and "os.path.join" compare equal; "-I" and "-i" do not."""
    value = " ".join(strip_markup(text).split()).strip(_EDGE)
    value = value.rstrip(".,;:").strip(_EDGE)
    return value if case_sensitive else fold_case(value)


def strip_section_suffix(text: str) -> str:
    """A trailing man-page section or empty call parentheses taken off: "ls(1)", "ls (1)", "printf(3p)" and
    "ls()" are "ls". A parenthesis holding anything but a section number (`open(path)`) stays."""
    return _SECTION_SUFFIX.sub("", text)


def join_separators(text: str) -> str:
    """Spaces, underscores and dashes between two letters or digits as one space: "a b", "a-b", "a_b" and "a - b"
    are "a b". An option's leading dash is kept ("ls -l", "--foo"), as are a word's leading or trailing
    underscores (`__init__`)."""
    return _KEY_SEPARATOR.sub(" ", text)


def normalize_key(text: object, *, case_sensitive: bool = False) -> str:
    """A key cell's comparable form: `normalize_cell`, then `strip_section_suffix`, then `join_separators`."""
    return join_separators(strip_section_suffix(normalize_cell(text, case_sensitive=case_sensitive)))


def split_items(text: object, *, case_sensitive: bool = False) -> frozenset[str]:
    """A set-valued cell's items: split on `,`, `;`, line breaks and `<br>`, each item `normalize_cell`ed, blanks
    dropped; repeats count once. "b, a" and "a; b" hold the same items."""
    parts = _ITEM_SPLIT.split(strip_markup(text))
    items = (normalize_cell(part, case_sensitive=case_sensitive) for part in parts)
    return frozenset(item for item in items if item)


def normalize_column(name: object) -> str:
    """A column name's comparable form: lowercase, runs of non-alphanumerics as one underscore ("Added in" ->
    "added_in")."""
    text = strip_markup(name).lower()
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
    relative tolerance; `key_aliases`: other spellings of a gold key value (gold value -> spellings), matched after
    `normalize_key`; `case_sensitive`: columns whose cells compare with their case; `extra_columns`: `refuse` (a
    predicted column that maps onto no gold column scores the table 0, as WideSearch does) or `ignore`;
    `tolerances`: a column's own `number_near` tolerance (WideSearch's per-column `criterion`); `preprocess`: the
    WideSearch preprocessors a column's cells go through before its metric (`table_widesearch.PREPROCESSORS`)."""

    columns: list[str]
    key_columns: list[str]
    rows: list[dict[str, str]]
    metrics: dict[str, CellMetric] = field(default_factory=dict)
    aliases: dict[str, list[str]] = field(default_factory=dict)
    tolerance: float = NUMBER_TOLERANCE
    key_aliases: dict[str, list[str]] = field(default_factory=dict)
    case_sensitive: list[str] = field(default_factory=list)
    extra_columns: ExtraColumns = "refuse"
    tolerances: dict[str, float] = field(default_factory=dict)
    preprocess: dict[str, list[str]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}  # only when set: the rows of tasks made before these fields stay as they were
        if self.tolerances:
            extra["tolerances"] = dict(self.tolerances)
        if self.preprocess:
            extra["preprocess"] = {k: list(v) for k, v in self.preprocess.items()}
        return {
            "columns": list(self.columns),
            "key_columns": list(self.key_columns),
            "rows": [dict(row) for row in self.rows],
            "metrics": dict(self.metrics),
            "aliases": {k: list(v) for k, v in self.aliases.items()},
            "tolerance": self.tolerance,
            "key_aliases": {k: list(v) for k, v in self.key_aliases.items()},
            "case_sensitive": list(self.case_sensitive),
            "extra_columns": self.extra_columns,
            **extra,
        }

    @cached_property
    def key_spellings(self) -> dict[str, dict[str, str]]:
        """Per key column: every accepted spelling's `normalize_key` form -> the gold value's form (a gold value
        maps onto itself, a `key_aliases` spelling onto its gold value)."""
        return build_key_spellings(self)


class TableSpecError(ValueError):
    """A task row's `table` is malformed; the message names the field and the fix."""


def build_key_spellings(gold: GoldTable, *, where: str = "table") -> dict[str, dict[str, str]]:
    """`GoldTable.key_spellings`; raises `TableSpecError` when an alias is claimed by two gold values or spells a
    different gold value of the same column (the join could not tell which entity it names)."""
    out: dict[str, dict[str, str]] = {}
    for column in gold.key_columns:
        sensitive = column in gold.case_sensitive
        forms = {normalize_key(row[column], case_sensitive=sensitive) for row in gold.rows}
        spelled: dict[str, str] = {form: form for form in forms}
        for value, spellings in gold.key_aliases.items():
            target = normalize_key(value, case_sensitive=sensitive)
            if target not in forms:
                continue
            for spelling in spellings:
                form = normalize_key(spelling, case_sensitive=sensitive)
                if spelled.setdefault(form, target) != target:
                    raise TableSpecError(
                        f"{where}.key_aliases[{value!r}]: {spelling!r} reads as {form!r}, which already names the "
                        f"key {spelled[form]!r} in column {column!r}; drop the alias or spell the keys apart"
                    )
        out[column] = spelled
    return out


def _names(value: object, columns: Sequence[str]) -> bool:
    return isinstance(value, list) and all(isinstance(c, str) and c in columns for c in value)


def gold_table_from(value: object, *, where: str = "table") -> GoldTable:
    """Validate a task row's `table` field ({"columns", "key_columns", "rows", optional "metrics", "aliases",
    "tolerance", "key_aliases", "case_sensitive", "extra_columns"}); raises `TableSpecError` naming the field."""
    # One function on purpose: one check per field of the table spec, each naming its field, in the spec's order.
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
    if len(set(normalised)) != len(normalised) or not all(normalised):
        raise TableSpecError(
            f"{where}.columns: every column needs a name with a letter or digit, and no two may normalise to the "
            f"same name ({normalised})"
        )
    keys = value.get("key_columns")
    if not isinstance(keys, list) or not keys or not _names(keys, columns):
        raise TableSpecError(f"{where}.key_columns must be a non-empty list of names from {where}.columns")
    sensitive = value.get("case_sensitive") or []
    if not _names(sensitive, columns):
        raise TableSpecError(f"{where}.case_sensitive must be a list of names from {where}.columns")
    rows = value.get("rows")
    if not isinstance(rows, list) or not rows or len(rows) > MAX_TABLE_ROWS:
        raise TableSpecError(f"{where}.rows must be a list of 1-{MAX_TABLE_ROWS} row objects")
    clean_rows: list[dict[str, str]] = []
    seen_keys: dict[tuple[str, ...], int] = {}
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise TableSpecError(f"{where}.rows[{i}] must be an object with a value per column")
        missing = [c for c in columns if row.get(c) is None or not str(row.get(c)).strip()]
        if missing:
            raise TableSpecError(f"{where}.rows[{i}] has no value for column(s) {', '.join(missing)}")
        clean = {c: str(row[c]).strip() for c in columns}
        key = tuple(normalize_key(clean[k], case_sensitive=k in sensitive) for k in keys)
        if not all(key):
            raise TableSpecError(f"{where}.rows[{i}]: a key cell is blank once normalised ({key}); give it a name")
        if key in seen_keys:
            raise TableSpecError(
                f"{where}.rows[{i}] repeats the key {key} of rows[{seen_keys[key]}] (keys compare after markup, "
                "section suffixes, case and separators are normalised); each entity appears once, named apart"
            )
        seen_keys[key] = i
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
    key_aliases_raw = value.get("key_aliases") or {}
    if not isinstance(key_aliases_raw, Mapping) or not all(
        isinstance(v, list) and all(isinstance(a, str) and a.strip() for a in v) for v in key_aliases_raw.values()
    ):
        raise TableSpecError(
            f"{where}.key_aliases must map gold key values to lists of other non-blank spellings, e.g. "
            '{"ls": ["ls(1)", "list"]}'
        )
    gold_keys = {clean[k] for clean in clean_rows for k in keys}
    for name in key_aliases_raw:
        if str(name).strip() not in gold_keys:
            raise TableSpecError(
                f"{where}.key_aliases names {name!r}, which is no value of a key column ({', '.join(keys)}) in "
                f"{where}.rows; key it by the gold value as written"
            )
    extra = value.get("extra_columns", "refuse")
    if extra not in EXTRA_COLUMNS:
        raise TableSpecError(f"{where}.extra_columns must be one of {', '.join(EXTRA_COLUMNS)}, got {extra!r}")
    tolerances, steps = _column_rules(value, columns, where)
    gold = GoldTable(
        columns=list(columns),
        key_columns=list(keys),
        rows=clean_rows,
        metrics=metrics,
        aliases={str(k): list(v) for k, v in aliases_raw.items()},
        tolerance=float(tolerance),
        key_aliases={str(k).strip(): [str(a) for a in v] for k, v in key_aliases_raw.items()},
        case_sensitive=list(sensitive),
        extra_columns=extra,
        tolerances=tolerances,
        preprocess=steps,
    )
    gold.__dict__["key_spellings"] = build_key_spellings(gold, where=where)  # refused here, not at the first score
    return gold


def _column_rules(
    value: Mapping[str, Any], columns: list[str], where: str
) -> tuple[dict[str, float], dict[str, list[str]]]:
    """The per-column `tolerances` and `preprocess` of a `table` field (GoldTable), checked."""
    tolerances_raw = value.get("tolerances") or {}
    if not isinstance(tolerances_raw, Mapping):
        raise TableSpecError(f"{where}.tolerances must map column names to relative tolerances in [0, 1)")
    tolerances: dict[str, float] = {}
    for name, tol in tolerances_raw.items():
        if name not in columns:
            raise TableSpecError(f"{where}.tolerances names column {name!r}, which is not in {where}.columns")
        if isinstance(tol, bool) or not isinstance(tol, int | float) or not 0 <= tol < 1:
            raise TableSpecError(f"{where}.tolerances[{name!r}] must be a relative tolerance in [0, 1), got {tol!r}")
        tolerances[str(name)] = float(tol)
    steps_raw = value.get("preprocess") or {}
    if not isinstance(steps_raw, Mapping):
        raise TableSpecError(f"{where}.preprocess must map column names to lists of {', '.join(PREPROCESSORS)}")
    steps: dict[str, list[str]] = {}
    for name, chain in steps_raw.items():
        if name not in columns:
            raise TableSpecError(f"{where}.preprocess names column {name!r}, which is not in {where}.columns")
        if not isinstance(chain, list) or not all(step in PREPROCESSORS for step in chain):
            raise TableSpecError(
                f"{where}.preprocess[{name!r}] must be a list of {', '.join(PREPROCESSORS)}, got {chain!r}"
            )
        steps[str(name)] = [str(step) for step in chain]
    return tolerances, steps
