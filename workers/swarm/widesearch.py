"""WideSearch tasks as they are published (`ByteDance-Seed/WideSearch`): a zip holding the queries as JSONL and one
gold table per task as CSV, read into wide-task rows whose `table` field scores an answer by the task's own
evaluation spec (`workers.rewards.table`, `workers.rewards.table_widesearch`).

- The queries: the zip's one `.jsonl` file, one `{"instance_id", "query", "evaluation", "language"?}` per line;
  `evaluation` is an object or that object JSON-encoded (as the Hugging Face export holds it), with
  `unique_columns` (the key columns), `required` (every column of the answer) and `eval_pipeline` (per column:
  `preprocess`, a list of `norm_str` / `extract_number` / `norm_date`; `metric`, a one-element list; `criterion`,
  the tolerance of `number_near` or the rubric of `llm_judge`).
- The gold tables: `<instance_id>.csv` anywhere in the zip (WideSearch keeps them in `widesearch_gold/`); headers
  are normalised as WideSearch does (stripped, lowercased, spaces removed) and must hold every required column.

Metrics map onto the table scorer's: `exact_match`, `number_near` (its `criterion` becomes the column's own
tolerance), `in_match`, `date_near` and `url_match` as they are. `llm_judge` needs a judge model, which the table
scorer does not call: by default (`judge_columns="refuse"`) a task with such a column is refused, naming it;
`"exact_match"` scores those columns by exact match instead and `"drop"` leaves them out of the gold table (neither
for a key column), each recorded in the row's `widesearch.departures`. Every problem names the file, the line (or
CSV row) and the field (`WideSearchError`), and nothing is returned when there is one.
"""

from __future__ import annotations

import csv
import io
import json
import posixpath
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from workers.rewards.table import CELL_METRICS, TableSpecError, gold_table_from, normalize_column
from workers.rewards.table_widesearch import PREPROCESSORS
from workers.search.corpus_files import read_zip_member

JudgeColumns = Literal["refuse", "exact_match", "drop"]
JUDGE_COLUMNS: tuple[JudgeColumns, ...] = ("refuse", "exact_match", "drop")
SOURCE = "widesearch"
MAX_ERRORS = 50
MAX_TASKS = 5000
_CODE_METRICS = {"exact_match", "number_near", "in_match", "date_near", "url_match"}


class WideSearchError(ValueError):
    def __init__(self, errors: Sequence[str]) -> None:
        self.errors = list(errors)[:MAX_ERRORS]
        super().__init__("; ".join(self.errors))


@dataclass(frozen=True)
class WideSearchImport:
    tasks: list[dict[str, Any]]
    report: dict[str, Any]


def norm_column(name: str) -> str:
    """A column name as WideSearch compares it: stripped, lowercased, spaces removed."""
    return name.strip().lower().replace(" ", "")


def _members(data: bytes, max_bytes: int) -> tuple[tuple[str, bytes], dict[str, tuple[str, bytes]]]:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise WideSearchError(
            [f"file: not a readable zip ({exc}); upload a zip of the queries and gold CSVs"]
        ) from None
    infos = []
    for info in archive.infolist():
        parts = posixpath.normpath(info.filename.replace("\\", "/")).split("/")
        if info.is_dir() or any(p in ("..", "__MACOSX") or p.startswith(".") for p in parts):
            continue
        if info.filename.endswith((".jsonl", ".csv")):
            infos.append(info)
    total = sum(info.file_size for info in infos)
    if total > max_bytes:
        raise WideSearchError([f"file: the queries and tables unpack to {total} bytes; the limit is {max_bytes}"])

    def read(info: zipfile.ZipInfo) -> bytes:
        try:
            return read_zip_member(archive, info)
        except ValueError as exc:
            raise WideSearchError([str(exc)]) from None

    queries = [info for info in infos if info.filename.endswith(".jsonl")]
    if len(queries) != 1:
        found = ", ".join(i.filename for i in queries) or "none"
        raise WideSearchError([f"file: the zip must hold exactly one .jsonl file of queries (found: {found})"])
    tables: dict[str, tuple[str, bytes]] = {}
    for info in infos:
        if info.filename.endswith(".csv"):
            stem = posixpath.basename(info.filename)[: -len(".csv")]
            if stem in tables:
                raise WideSearchError([f"file: two gold tables for {stem!r}: {tables[stem][0]} and {info.filename}"])
            tables[stem] = (info.filename, read(info))
    return (queries[0].filename, read(queries[0])), tables


def _evaluation(row: Mapping[str, Any], where: str) -> dict[str, Any]:
    spec = row.get("evaluation")
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except ValueError:
            raise WideSearchError([f"{where}: field 'evaluation' is a string but not JSON"]) from None
    if not isinstance(spec, dict):
        raise WideSearchError([f"{where}: field 'evaluation' must be an object (or one JSON-encoded)"])
    problems = []
    for name in ("unique_columns", "required"):
        value = spec.get(name)
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c.strip() for c in value):
            problems.append(f"{where}: field 'evaluation.{name}' must be a non-empty list of column names")
    if not isinstance(spec.get("eval_pipeline", {}), dict):
        problems.append(f"{where}: field 'evaluation.eval_pipeline' must be an object of column -> rule")
    if problems:
        raise WideSearchError(problems)
    return spec


def _gold_rows(name: str, content: bytes, required: list[str]) -> tuple[list[dict[str, str]], dict[str, str]]:
    """The gold rows keyed by the normalised column names, and each column's name as the CSV header writes it."""
    try:
        text = content.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise WideSearchError([f"{name}: not UTF-8 text; save the table as UTF-8 CSV"]) from None
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if not header:
        raise WideSearchError([f"{name}: the CSV is empty"])
    names = [norm_column(h) for h in header]
    missing = [c for c in required if c not in names]
    if missing:
        raise WideSearchError([f"{name}: no column {', '.join(missing)} (its header is {', '.join(names)})"])
    index = {c: names.index(c) for c in required}
    shown = {c: header[index[c]].strip() for c in required}
    rows = []
    for number, cells in enumerate(reader, start=2):
        if not any(cell.strip() for cell in cells):
            continue
        if len(cells) != len(header):
            raise WideSearchError([f"{name} row {number}: {len(cells)} cells for {len(header)} columns"])
        rows.append({c: cells[index[c]].strip() for c in required})
    if not rows:
        raise WideSearchError([f"{name}: the gold table has no rows"])
    return rows, shown


def _rules(
    spec: Mapping[str, Any], required: list[str], keys: list[str], judge_columns: JudgeColumns, where: str
) -> tuple[dict[str, str], dict[str, float], dict[str, list[str]], list[str], list[str]]:
    """(metrics, tolerances, preprocess, columns dropped, departures) of a task's eval_pipeline."""
    pipeline = spec.get("eval_pipeline") or {}
    metrics: dict[str, str] = {}
    tolerances: dict[str, float] = {}
    steps: dict[str, list[str]] = {}
    dropped: list[str] = []
    departures: list[str] = []
    problems: list[str] = []
    for raw, rule in pipeline.items():
        column = norm_column(str(raw))
        field = f"evaluation.eval_pipeline[{raw!r}]"
        if column not in required:
            problems.append(f"{where}: field '{field}' names a column that is not in evaluation.required")
            continue
        if not isinstance(rule, dict):
            problems.append(f"{where}: field '{field}' must be an object with metric, preprocess and criterion")
            continue
        chain = rule.get("preprocess") or []
        if not isinstance(chain, list) or any(step not in PREPROCESSORS for step in chain):
            problems.append(f"{where}: field '{field}.preprocess' must be a list of {', '.join(PREPROCESSORS)}")
            continue
        if chain:
            steps[column] = list(chain)
        names = rule.get("metric") or ["exact_match"]
        if isinstance(names, str):
            names = [names]
        if not isinstance(names, list) or len(names) != 1:
            problems.append(f"{where}: field '{field}.metric' must name one metric, got {names!r}")
            continue
        metric = names[0]
        if metric == "llm_judge":
            if judge_columns == "refuse" or (judge_columns == "drop" and column in keys):
                problems.append(
                    f"{where}: column {column!r} is scored by llm_judge, which needs a judge model the table scorer "
                    "does not call; import with judge_columns=exact_match (score it by exact match) or "
                    "judge_columns=drop (leave it out; not for a key column)"
                )
                continue
            if judge_columns == "drop":
                dropped.append(column)
                departures.append(f"{column}: llm_judge column left out (judge_columns=drop)")
                continue
            metric = "exact_match"
            departures.append(f"{column}: llm_judge scored by exact_match (judge_columns=exact_match)")
        if metric not in _CODE_METRICS or metric not in CELL_METRICS:
            problems.append(
                f"{where}: field '{field}.metric' is {metric!r}; the metrics are "
                f"{', '.join(sorted(_CODE_METRICS | {'llm_judge'}))}"
            )
            continue
        if column not in keys:
            metrics[column] = metric
        if metric == "number_near" and rule.get("criterion") is not None:
            criterion = rule["criterion"]
            if isinstance(criterion, bool) or not isinstance(criterion, int | float) or not 0 <= criterion < 1:
                problems.append(f"{where}: field '{field}.criterion' must be a relative tolerance in [0, 1)")
                continue
            tolerances[column] = float(criterion)
    if problems:
        raise WideSearchError(problems)
    return metrics, tolerances, steps, dropped, departures


def _task(
    number: int, row: Any, name: str, tables: Mapping[str, tuple[str, bytes]], judge: JudgeColumns
) -> dict[str, Any]:
    where = f"{name} line {number}"
    if not isinstance(row, dict):
        raise WideSearchError([f"{where}: expected an object with instance_id, query and evaluation"])
    ident, query = row.get("instance_id"), row.get("query")
    if not isinstance(ident, str) or not ident.strip():
        raise WideSearchError([f"{where}: field 'instance_id' must be a non-empty string"])
    if not isinstance(query, str) or not query.strip():
        raise WideSearchError([f"{where}: field 'query' must be a non-empty string"])
    spec = _evaluation(row, where)
    required = [norm_column(c) for c in spec["required"]]
    keys = [norm_column(c) for c in spec["unique_columns"]]
    outside = [k for k in keys if k not in required]
    if outside:
        raise WideSearchError([f"{where}: field 'evaluation.unique_columns' names {', '.join(outside)}, not required"])
    if ident not in tables:
        raise WideSearchError([f"{where}: no gold table {ident}.csv in the zip for instance {ident!r}"])
    csv_name, content = tables[ident]
    metrics, tolerances, steps, dropped, departures = _rules(spec, required, keys, judge, where)
    kept = [c for c in required if c not in dropped]
    gold_rows, shown = _gold_rows(csv_name, content, required)
    # The gold table names its columns as the CSV header writes them ("Company Name"), so an answer's header maps
    # onto them by the scorer's normaliser; WideSearch's own spelling ("companyname") is an alias of each.
    columns = [shown[c] for c in kept]
    table = {
        "columns": columns,
        "key_columns": [shown[k] for k in keys],
        "rows": [{shown[c]: r[c] for c in kept} for r in gold_rows],
        "metrics": {shown[c]: m for c, m in metrics.items() if c in kept},
        "tolerances": {shown[c]: t for c, t in tolerances.items() if c in kept},
        "preprocess": {shown[c]: chain for c, chain in steps.items() if c in kept},
        "aliases": {shown[c]: [c] for c in kept if normalize_column(shown[c]) != normalize_column(c)},
    }
    try:
        gold = gold_table_from(table, where=f"{csv_name} (instance {ident})")
    except TableSpecError as exc:
        raise WideSearchError([str(exc)]) from None
    out = {
        "id": ident.strip(),
        "prompt": query.strip(),
        "task_kind": "wide",
        "table": gold.to_json(),
        "source": SOURCE,
        "widesearch": {"departures": departures, "gold_file": csv_name},
    }
    if isinstance(row.get("language"), str):
        out["language"] = row["language"]
    return out


def read_widesearch_zip(data: bytes, *, judge_columns: JudgeColumns = "refuse", max_bytes: int) -> WideSearchImport:
    """The wide-task rows of a WideSearch zip (module docstring)."""
    if judge_columns not in JUDGE_COLUMNS:
        raise WideSearchError([f"judge_columns: must be one of {', '.join(JUDGE_COLUMNS)}, got {judge_columns!r}"])
    (name, lines), tables = _members(data, max_bytes)
    errors: list[str] = []
    tasks: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(lines.split(b"\n"), start=1):
        if len(errors) >= MAX_ERRORS:
            break
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8-sig" if number == 1 else "utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            errors.append(f"{name} line {number}: not a JSON line ({exc})")
            continue
        try:
            task = _task(number, row, name, tables, judge_columns)
        except WideSearchError as exc:
            errors.extend(exc.errors)
            continue
        if task["id"] in seen:
            errors.append(
                f"{name} line {number}: instance_id {task['id']!r} is already used on line {seen[task['id']]}"
            )
            continue
        seen[task["id"]] = number
        tasks.append(task)
        if len(tasks) > MAX_TASKS:
            errors.append(f"{name}: more than {MAX_TASKS} tasks; split the import")
            break
    if not tasks and not errors:
        errors.append(f"{name}: no tasks")
    if errors:
        raise WideSearchError(errors)
    report = {
        "source": SOURCE,
        "tasks": len(tasks),
        "judge_columns": judge_columns,
        "departures": sum(len(t["widesearch"]["departures"]) for t in tasks),
        "gold_rows": sum(len(t["table"]["rows"]) for t in tasks),
    }
    return WideSearchImport(tasks=tasks, report=report)
