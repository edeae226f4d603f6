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

from workers.rewards.swarm_stats import swarm_stats
from workers.rewards.table_score import table_metrics
from workers.search.metrics import episode_metrics


def swarm_episode_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    out = dict(episode_metrics(record))
    table = table_metrics(record)
    out.update(table)
    out["task_score"] = table["item_f1"] if table else out.get("final_answer_found", 0.0)
    out.update(swarm_stats(record))
    return out
