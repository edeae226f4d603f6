"""Template tags for the trajectory page's agent-swarm views: `{% load swarm_view %}`.

`swarm_timeline record` lays an agent-swarm episode (the `swarm` environment, Kimi K2.5's Agent Swarm) out as a
timeline: one row per orchestrator stage (its tools and cost, 1 + the slowest sub-agent it launched), the stage's
sub-agents as parallel bars as long as their steps, the sub-agent on the critical path (the slowest of its stage)
marked, each sub-agent's conversation one click away. `wide_score record` scores the answer table against the
task's gold table (docs/methods.md B2) and pairs the rows, saying why a table that fails the required-columns rule
scores 0. Both give None for a record that has no such field, and read the record defensively (an upload may hold
any shape).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django import template

from workers.rewards.swarm_stats import swarm_stats
from workers.rewards.table import TableSpecError, gold_table_from, parse_markdown_table
from workers.rewards.table_score import (
    columns_problem,
    key_of,
    map_columns,
    predicted_rows,
    row_cell_scores,
    score_table,
)

register = template.Library()


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@register.simple_tag
def swarm_timeline(record: Any) -> dict[str, Any] | None:
    swarm = record.get("swarm") if isinstance(record, Mapping) else None
    if not isinstance(swarm, Mapping):
        return None
    subagents = [s for s in swarm.get("subagents") or [] if isinstance(s, Mapping)]
    by_stage: dict[int, list[Mapping[str, Any]]] = {}
    for sub in subagents:
        by_stage.setdefault(_int(sub.get("stage")), []).append(sub)
    stages = [s for s in swarm.get("stages") or [] if isinstance(s, Mapping)]
    longest = max((_int(s.get("steps")) for s in subagents), default=0) or 1
    rows: list[dict[str, Any]] = []
    elapsed = 0
    for stage in stages:
        number = _int(stage.get("stage"))
        cost = _int(stage.get("cost")) or 1
        subs = by_stage.get(number, [])
        slowest = max((_int(s.get("steps")) for s in subs), default=0)
        critical_marked = False
        bars = []
        for sub in subs:
            steps = _int(sub.get("steps"))
            on_path = steps == slowest and not critical_marked and bool(subs)
            critical_marked = critical_marked or on_path
            bars.append(
                {
                    "run_id": str(sub.get("run_id") or ""),
                    "agent": str(sub.get("agent") or ""),
                    "prompt": str(sub.get("prompt") or ""),
                    "message": str(sub.get("message") or ""),
                    "steps": steps,
                    "finished": sub.get("finished") is True,
                    "cut": sub.get("cut") is True,
                    "error": sub.get("error"),
                    "seconds": sub.get("seconds"),
                    "width": max(4, round(100 * steps / longest)),
                    "critical": on_path,
                    "turns": [t for t in sub.get("turns") or [] if isinstance(t, Mapping)],
                }
            )
        rows.append(
            {
                "stage": number,
                "cost": cost,
                "start": elapsed,
                "tools": [str(t) for t in stage.get("tools") or []],
                "subagents": bars,
            }
        )
        elapsed += cost
    errors = swarm.get("errors") if isinstance(swarm.get("errors"), Mapping) else {}
    assert isinstance(errors, Mapping)
    return {
        "stages": rows,
        "stats": swarm_stats(record),
        "agents": [a for a in swarm.get("agents") or [] if isinstance(a, Mapping)],
        "errors": {k: v for k, v in errors.items() if v},
        "limits": swarm.get("step_limits") if isinstance(swarm.get("step_limits"), Mapping) else {},
        "checkpoint": swarm.get("checkpoint"),
    }


@register.simple_tag
def wide_score(record: Any) -> dict[str, Any] | None:
    gold_raw = record.get("gold_table") if isinstance(record, Mapping) else None
    if not isinstance(gold_raw, Mapping):
        return None
    try:
        gold = gold_table_from(gold_raw)
    except TableSpecError as exc:
        return {"problem": str(exc)}
    answer = record.get("answer") if isinstance(record.get("answer"), str) else None
    table = parse_markdown_table(answer)
    paired = predicted_rows(table, gold) if table is not None else None
    predicted = paired[0] if paired is not None else {}
    rows = []
    for gold_row in gold.rows:
        found = predicted.get(key_of(gold_row, gold))
        scores = row_cell_scores(found, gold_row, gold) if found is not None else [0.0] * len(gold.columns)
        rows.append(
            [
                {"gold": gold_row[c], "predicted": (found or {}).get(c, ""), "right": score >= 1.0}
                for c, score in zip(gold.columns, scores, strict=True)
            ]
        )
    score = score_table(answer, gold)
    problem = columns_problem(map_columns(table, gold), gold) if table is not None else None
    return {
        "score": score,
        "columns": gold.columns,
        "rows": rows,
        "parsed": table is not None,
        "columns_problem": problem,
    }
