"""Per-episode metrics of a swarm trajectory (the trainer charts their per-step means as `env/<name>`).

- the search metrics of `workers.search.metrics` (output recall, final answer found, ...);
- wide tasks: item- and row-level P/R/F1 and success of the answer table (docs/methods.md B2);
- `task_score`: the task's own metric, item-F1 for a wide task and final-answer-found for a deep one;
- the swarm's shape: `critical_steps` (K2), `total_steps`, `subagents` launched, `spawned` (1 when any was),
  `parallelism` (the most sub-agents one stage launched), `finish_rate` (finished / launched; only for episodes
  that launched one), `finished_distinct` (finished sub-agents whose task repeats no earlier one),
  `duplicate_tasks` and `orchestration_errors` (every refused create or assign).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workers.swarm.table import TableSpecError, gold_table_from, normalize_cell, score_table


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


def table_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """Item- and row-level scores of the answer table against the record's `gold_table` ({} without one)."""
    gold = record.get("gold_table")
    if not isinstance(gold, Mapping):
        return {}
    try:
        table = gold_table_from(gold)
    except TableSpecError:
        return {}
    answer = record.get("answer")
    return score_table(answer if isinstance(answer, str) else None, table).metrics()


def swarm_episode_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    from workers.search.metrics import episode_metrics

    out = dict(episode_metrics(record))
    table = table_metrics(record)
    out.update(table)
    out["task_score"] = table["item_f1"] if table else out.get("final_answer_found", 0.0)
    out.update(swarm_stats(record))
    return out
