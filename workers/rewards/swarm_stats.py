"""The shape of a swarm episode, read off a trajectory record's `swarm` field: what PARL's reward terms (K1-K2) and
the swarm's charts and detectors measure (`workers.swarm.metrics` adds the search and table metrics)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workers.rewards.table import normalize_cell


def swarm_stats(record: Mapping[str, Any]) -> dict[str, float]:
    """The swarm's shape from a record's `swarm` field ({} when it has none)."""
    swarm = record.get("swarm")
    if not isinstance(swarm, Mapping):
        return {}
    subagents = [s for s in swarm.get("subagents") or [] if isinstance(s, Mapping)]
    stages = [s for s in swarm.get("stages") or [] if isinstance(s, Mapping)]
    errors = swarm.get("errors") if isinstance(swarm.get("errors"), Mapping) else {}
    assert isinstance(errors, Mapping)
    out = {
        "critical_steps": float(swarm.get("critical_steps") or 0),
        "total_steps": float(swarm.get("total_steps") or 0),
        "subagents": float(len(subagents)),
        "spawned": 1.0 if subagents else 0.0,
        "parallelism": float(max((len(s.get("subagent_steps") or []) for s in stages), default=0)),
        "duplicate_tasks": float(errors.get("duplicate_tasks") or 0),
        "orchestration_errors": float(
            sum(int(v or 0) for k, v in errors.items() if k not in ("duplicate_tasks", "timeouts"))
        ),
    }
    if subagents:
        out["finish_rate"] = sum(1 for s in subagents if s.get("finished")) / len(subagents)
        seen: set[str] = set()
        distinct = 0
        for sub in subagents:  # a task repeating an earlier one (normalised) is not a distinct finished task
            key = normalize_cell(sub.get("prompt"))
            if sub.get("finished") and key not in seen:
                distinct += 1
            seen.add(key)
        out["finished_distinct"] = float(distinct)
    return out
