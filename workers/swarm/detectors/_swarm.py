"""Shared reading of agent-swarm records for the swarm detectors (serial collapse, spurious parallelism)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workers.detectors.base import TIGHTEN, is_assistant, proposal, term_of_type, turns_of

DEFAULT_PARL_WEIGHT = 0.1
"""Weight of a PARL term a suggestion adds to a reward that has none (parl_spec's λ default)."""


def swarm_of(record: Mapping[str, Any]) -> Mapping[str, Any] | None:
    swarm = record.get("swarm")
    return swarm if isinstance(swarm, Mapping) else None


def subagents_of(swarm: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    raw = swarm.get("subagents")
    return [s for s in raw if isinstance(s, Mapping)] if isinstance(raw, list) else []


def errors_of(swarm: Mapping[str, Any]) -> Mapping[str, Any]:
    errors = swarm.get("errors")
    return errors if isinstance(errors, Mapping) else {}


def first_turn_calling(record: Mapping[str, Any], tool: str) -> int | None:
    return next((i for i, t in enumerate(turns_of(record)) if is_assistant(t) and t.get("tool") == tool), None)


def suggest_parl_term(spec: dict[str, Any], term_type: str, detector: str, why: str) -> tuple[dict[str, Any], str]:
    """Add the PARL term `term_type` (annealed, weight `DEFAULT_PARL_WEIGHT`) or raise its weight."""
    proposed, terms = proposal(spec)
    term = term_of_type(terms, term_type)
    if term is None:
        terms.append({"type": term_type, "weight": DEFAULT_PARL_WEIGHT})
        return proposed, f"{detector}: add {term_type} (weight {DEFAULT_PARL_WEIGHT}, annealed to 0) {why}"
    old = float(term.get("weight", 1.0))
    term["weight"] = round(old * TIGHTEN, 4) if old > 0 else DEFAULT_PARL_WEIGHT
    return proposed, f"{detector}: raise {term.get('name') or term_type}'s weight {old:g} -> {term['weight']:g} {why}"
