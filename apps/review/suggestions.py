"""The reward change suggested by a confirmed hack: the current reward spec with a penalty term for what the
detector caught added, or tightened when the spec already has one. Pure: a dict in, a dict and a reason out.

The only penalty terms the reward schema has are `turn_penalty` (methods.md X5) and `prune_penalty` (X4), so
the suggestions are:
- long or repetitive output, broken tool calls, or a run whose reward outran its evals: a `turn_penalty` (the
  hack spends turns the task did not need);
- search once then quit: more weight on `trajectory_recall` (X2's r_traj), which pays for searching further.
An operator reads the draft and may edit it before it becomes a version.
"""

from __future__ import annotations

import copy
from typing import Any

TIGHTEN = 1.5
"""How much a suggestion scales an existing penalty's size or a gain term's weight."""

DEFAULT_TURN_PENALTY: dict[str, Any] = {"type": "turn_penalty", "start": 8, "ramp": 16, "max_penalty": 0.5}
DEFAULT_RECALL_WEIGHT = 0.5


def _term_of_type(terms: list[dict[str, Any]], term_type: str) -> dict[str, Any] | None:
    return next((term for term in terms if term.get("type") == term_type), None)


def _turn_penalty(terms: list[dict[str, Any]], detector: str) -> str:
    term = _term_of_type(terms, "turn_penalty")
    if term is None:
        terms.append(dict(DEFAULT_TURN_PENALTY))
        return (
            f"{detector}: add a turn_penalty (from {DEFAULT_TURN_PENALTY['start']} turns, up to "
            f"{DEFAULT_TURN_PENALTY['max_penalty']} over {DEFAULT_TURN_PENALTY['ramp']} more) so the long episodes "
            "this hack produces cost reward"
        )
    old_start, old_max = int(term.get("start", 64)), float(term.get("max_penalty", 0.5))
    term["start"] = old_start // 2
    term["max_penalty"] = round(old_max * TIGHTEN, 4) if old_max > 0 else DEFAULT_TURN_PENALTY["max_penalty"]
    return (
        f"{detector}: tighten {term.get('name') or 'turn_penalty'}: start {old_start} -> {term['start']} turns, "
        f"max_penalty {old_max:g} -> {term['max_penalty']:g}"
    )


def _recall_weight(terms: list[dict[str, Any]], detector: str) -> str:
    term = _term_of_type(terms, "trajectory_recall")
    if term is None:
        terms.append({"type": "trajectory_recall", "weight": DEFAULT_RECALL_WEIGHT})
        return (
            f"{detector}: add trajectory_recall (weight {DEFAULT_RECALL_WEIGHT}) so searching further pays, "
            "instead of answering after one search"
        )
    old = float(term.get("weight", 1.0))
    term["weight"] = round(old * TIGHTEN, 4) if old > 0 else DEFAULT_RECALL_WEIGHT
    return f"{detector}: raise {term.get('name') or 'trajectory_recall'}'s weight {old:g} -> {term['weight']:g}"


def suggest_penalty(spec: dict[str, Any], detector: str) -> tuple[dict[str, Any], str]:
    """(proposed spec, one-line reason): `spec` with the term change suggested for `detector`'s hacks. `spec` is
    not modified; the proposal always differs from it."""
    proposed = copy.deepcopy(spec)
    terms = proposed.setdefault("terms", [])
    if detector == "search_once_then_quit":
        reason = _recall_weight(terms, detector)
    else:
        reason = _turn_penalty(terms, detector)
    return proposed, reason
