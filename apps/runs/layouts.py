"""A run page you arrange (issue 39 part 4): pinned panels in the user's order, hidden panels, sections that start
folded unless opened, smoothing, log scales and the x-axis, saved per user and scope on the server, so the layout
follows a user from browser to browser and one user's pins are not another's.

Crucible has no project object; the scope is the run's environment (`exact_answer`, `search`, `coding_agent`,
...), which decides the metrics its runs report, so runs of one kind of work share their layout. Runs without an
environment (SFT, re-scoring, evals) share one per run kind.
"""

from __future__ import annotations

import json
from typing import Any

from rest_framework.exceptions import ValidationError

from apps.runs.models import PanelLayout, Run

DEFAULT_PINNED = ["reward_mean", "loss", "kl", "entropy", "tokens_per_second"]
"""Pinned until a user changes them: what RL people look at first (the health panel sits above the charts)."""

MAX_LAYOUT_BYTES = 16 * 1024
MAX_NAMES = 200
MAX_NAME_LENGTH = 200
LIST_FIELDS = ("pinned", "hidden", "open", "log")


def default_layout() -> dict[str, Any]:
    # Sections start folded except the pinned one ("key"): `open` lists the sections shown open.
    return {"pinned": list(DEFAULT_PINNED), "hidden": [], "open": ["key"], "log": [], "smoothing": 0.0, "x": "step"}


def scope_of(run: Run) -> str:
    environment = ((run.spec or {}).get("config") or {}).get("environment")
    return f"env:{environment}"[:100] if isinstance(environment, str) and environment else f"kind:{run.kind}"


def clean_layout(data: Any) -> dict[str, Any]:
    """The layout to store from what a page sent; ValidationError naming the field and what it takes."""
    if not isinstance(data, dict):
        raise ValidationError({"layout": ["send a JSON object with pinned, hidden, open, log, smoothing and x"]})
    if len(json.dumps(data)) > MAX_LAYOUT_BYTES:
        raise ValidationError({"layout": [f"over {MAX_LAYOUT_BYTES // 1024} KB: pin or hide fewer panels"]})
    unknown = sorted(set(data) - {*LIST_FIELDS, "smoothing", "x"})
    if unknown:
        choices = "pinned, hidden, open, log, smoothing, x"
        raise ValidationError({f"layout.{unknown[0]}": [f"unknown setting; use {choices}"]})
    layout = default_layout()
    for field in LIST_FIELDS:
        if field not in data:
            continue
        names = data[field]
        if (
            not isinstance(names, list)
            or len(names) > MAX_NAMES
            or not all(isinstance(n, str) and 0 < len(n) <= MAX_NAME_LENGTH for n in names)
        ):
            raise ValidationError(
                {f"layout.{field}": [f"a list of at most {MAX_NAMES} metric or section names, each 1-200 characters"]}
            )
        layout[field] = list(dict.fromkeys(names))  # order kept, duplicates dropped
    if "smoothing" in data:
        smoothing = data["smoothing"]
        if isinstance(smoothing, bool) or not isinstance(smoothing, int | float) or not 0 <= smoothing <= 0.99:
            raise ValidationError({"layout.smoothing": ["a number from 0 to 0.99 (the EMA weight)"]})
        layout["smoothing"] = float(smoothing)
    if "x" in data:
        if data["x"] not in ("step", "time"):
            raise ValidationError({"layout.x": ["'step' or 'time'"]})
        layout["x"] = data["x"]
    return layout


def layout_for(user: Any, run: Run) -> dict[str, Any]:
    """The user's layout for this run's scope, else the default."""
    kept = PanelLayout.objects.filter(user=user, scope=scope_of(run)).values_list("layout", flat=True).first()
    if not isinstance(kept, dict):
        return default_layout()
    try:
        return clean_layout(kept)
    except ValidationError:  # stored by an older version: start afresh
        return default_layout()


def layout_save(user: Any, run: Run, data: Any) -> dict[str, Any]:
    layout = clean_layout(data)
    PanelLayout.objects.update_or_create(user=user, scope=scope_of(run), defaults={"layout": layout})
    return layout
