"""Statistics of a suite of repository tasks (rows of schema repo_task/v1), next to CursorBench's: read by the dataset,
benchmark and generation pages alike, so they live below every app."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from workers.coding.task import is_unverified

CURSORBENCH = {"median_lines_changed": 181, "median_instruction_chars": 390}
"""CursorBench's published suite statistics (docs/methods.md section 2), shown beside ours."""


def patch_lines_changed(patch: str | None) -> int:
    """Added plus removed lines of a unified diff (file headers and hunk headers not counted)."""
    if not patch:
        return 0
    changed = 0
    for line in patch.splitlines():
        if line.startswith(("+++", "---")):
            continue
        if line.startswith(("+", "-")):
            changed += 1
    return changed


def patch_files_changed(patch: str | None) -> int:
    """Files a unified diff touches (one `+++`/`---` header pair each; /dev/null for an added or removed file)."""
    files: set[str] = set()
    for line in (patch or "").splitlines():
        if line.startswith(("+++ ", "--- ")):
            path = line[4:].split("\t", 1)[0].strip()
            if path != "/dev/null":
                files.add(path.split("/", 1)[1] if path[:2] in ("a/", "b/") else path)
    return len(files)


def _instruction(row: Mapping[str, Any]) -> str:
    text = row.get("instruction") or row.get("prompt") or ""
    return text if isinstance(text, str) else ""


def _source_label(row: Mapping[str, Any]) -> str:
    source = row.get("source")
    if isinstance(source, Mapping):
        return str(source.get("library") or source.get("name") or "unknown")
    return str(source or "unknown")


def suite_statistics(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Count, how many are unverified (`workers.coding.task.is_unverified`: nothing showed them solvable), median
    lines and files changed by the reference patch, median instruction length (characters), and the tasks per
    family and per source, for a list of repo_task rows (a dataset version's or a benchmark's)."""
    lines: list[int] = []
    files: list[int] = []
    chars: list[int] = []
    families: Counter[str] = Counter()
    sources: Counter[str] = Counter()
    with_patch = 0
    unverified = 0
    for row in rows:
        unverified += is_unverified(row)
        patch = row.get("reference_patch")
        if isinstance(patch, str) and patch:
            with_patch += 1
            lines.append(patch_lines_changed(patch))
            files.append(patch_files_changed(patch))
        chars.append(len(_instruction(row)))
        families[str(row.get("family") or "unknown")] += 1
        sources[_source_label(row)] += 1
    count = len(chars)
    return {
        "tasks": count,
        "with_reference_patch": with_patch,
        "unverified": unverified,
        "median_lines_changed": statistics.median(lines) if lines else None,
        "median_files_changed": statistics.median(files) if files else None,
        "median_instruction_chars": statistics.median(chars) if chars else None,
        "families": dict(families.most_common()),
        "sources": dict(sources.most_common()),
        "cursorbench": CURSORBENCH,
    }
