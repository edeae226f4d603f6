"""Row checks of the dataset kinds whose files are JSONL: each returns (row count, validation report) or raises a
400 listing the bad lines (at most 50). Corpus files are chunked instead (services.corpus_chunks_from_upload)."""

from __future__ import annotations

import json
from typing import Any

from rest_framework.exceptions import ValidationError

from workers.coding.stats import suite_statistics
from workers.coding.task import SCHEMA as REPO_TASK_SCHEMA
from workers.coding.task import RepoTaskError, parse_repo_task_row
from workers.session_records import SESSION_FORMAT, SessionRecord
from workers.trajectories import parse_trajectories_jsonl


def trajectory_rows(data: bytes) -> tuple[int, dict[str, object]]:
    """Every line a stored trajectory (workers.trajectories, schema trajectory/v1)."""
    result = parse_trajectories_jsonl(data)
    if result.errors:
        lines = [f"line {e.line}: {e.message}" for e in result.errors]
        raise ValidationError({"file": lines})
    if result.row_count == 0:
        raise ValidationError({"file": ["the file holds no trajectories; upload JSONL, one object per line"]})
    return result.row_count, {"rows": result.row_count, "errors": 0, "schema": "trajectory/v1"}


def object_rows(data: bytes, *, kind: str) -> tuple[int, dict[str, object]]:
    """Any non-empty JSONL of objects: the kinds without a schema of their own yet."""
    rows = 0
    bad: list[str] = []
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            if not isinstance(json.loads(line), dict):
                bad.append(f"line {number}: expected a JSON object")
        except (ValueError, UnicodeDecodeError) as exc:
            bad.append(f"line {number}: invalid JSON ({exc})")
        rows += 1
        if len(bad) >= 50:
            break
    if bad:
        raise ValidationError({"file": bad})
    if rows == 0:
        raise ValidationError({"file": ["the file is empty; upload JSONL, one object per line"]})
    return rows, {"rows": rows, "errors": 0, "schema": f"{kind}/jsonl"}


def repo_task_rows(data: bytes) -> tuple[int, dict[str, object]]:
    """Stored repository-task rows (schema repo_task/v1, each naming its snapshot by content hash); the report
    carries the suite's statistics (workers.coding.stats)."""
    parsed: list[dict[str, Any]] = []
    bad: list[str] = []
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("expected a JSON object")
            parse_repo_task_row(row, index=number)
        except RepoTaskError as exc:
            bad.append(str(exc))
        except (ValueError, UnicodeDecodeError) as exc:
            bad.append(f"line {number}: {exc}")
        else:
            parsed.append(row)
        if len(bad) >= 50:
            break
    if bad:
        raise ValidationError({"file": bad})
    if not parsed:
        raise ValidationError({"file": ["the file holds no repository tasks"]})
    report = {"rows": len(parsed), "errors": 0, "schema": REPO_TASK_SCHEMA, "statistics": suite_statistics(parsed)}
    return len(parsed), report


def session_rows(data: bytes) -> tuple[int, dict[str, object]]:
    """Every line a `session/v1` record (workers.session_records.SessionRecord): served turns and their feedback."""
    from pydantic import ValidationError as PydanticError

    rows, turns, with_feedback = 0, 0, 0
    bad: list[str] = []
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        rows += 1
        try:
            record = SessionRecord.model_validate_json(line)
        except PydanticError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "row"
            bad.append(f"line {number}: {where}: {first['msg']}")
            if len(bad) >= 50:
                break
            continue
        turns += len(record.turns)
        with_feedback += bool(record.feedback)
    if bad:
        raise ValidationError({"file": bad})
    if rows == 0:
        raise ValidationError({"file": [f"the file holds no sessions; one {SESSION_FORMAT} object per line"]})
    return rows, {"rows": rows, "errors": 0, "schema": SESSION_FORMAT, "turns": turns, "with_feedback": with_feedback}
