"""Stored JSON on pages: `{{ value|json_pretty }}` as indented JSON (what the API returns), and
`{{ value|setting_rows }}` as the rows of a labelled table (dotted key, value in words); never Python's repr."""

from __future__ import annotations

import json
from typing import Any

from django import template

register = template.Library()

ROW_LIMIT = 400  # a summary can hold long lists: past this many rows the table says how many it left out


@register.filter
def json_pretty(value: object) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def _scalar(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _rows(prefix: str, value: Any, out: list[tuple[str, str]]) -> None:
    if isinstance(value, dict):
        if not value:
            out.append((prefix or "(empty)", "none"))
        for key in sorted(value, key=str):
            _rows(f"{prefix}.{key}" if prefix else str(key), value[key], out)
    elif isinstance(value, list | tuple):
        if all(not isinstance(v, dict | list | tuple) for v in value):
            out.append((prefix, ", ".join(_scalar(v) for v in value) if value else "none"))
        else:
            for i, item in enumerate(value):
                _rows(f"{prefix}[{i}]", item, out)
    else:
        out.append((prefix, _scalar(value)))


@register.filter
def setting_rows(value: object, skip: str = "") -> list[tuple[str, str]]:
    """Flatten a JSON value into (dotted key, value) rows, keys sorted; `skip` is a comma-separated list of top-level
    keys the page shows elsewhere. Past ROW_LIMIT rows the last row says how many were left out."""
    if isinstance(value, dict) and skip:
        dropped = set(skip.split(","))
        value = {k: v for k, v in value.items() if k not in dropped}
    out: list[tuple[str, str]] = []
    _rows("", value, out)
    if len(out) > ROW_LIMIT:
        out = [*out[:ROW_LIMIT], ("…", f"{len(out) - ROW_LIMIT} more rows: see the JSON below")]
    return out
