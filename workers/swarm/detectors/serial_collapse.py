"""Serial collapse (Kimi K2.5, docs/methods.md K1): on a wide task, whose items are independent and could be looked up
in parallel, the orchestrator never creates a sub-agent and works through everything itself.

Only agent-swarm records of wide tasks are judged (a `swarm` field and a `gold_table` with at least `min_rows`
rows); one is flagged when it launched no sub-agent. An episode that ended in an error is judged too: collapsing
into serial work is what runs it out of steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import Field

from workers.detectors.base import (
    DetectorParams,
    TrajectoryDetector,
    content_of,
    excerpt,
    is_assistant,
    record_id,
    turns_of,
)
from workers.findings import Finding
from workers.swarm.detectors._swarm import subagents_of, suggest_parl_term, swarm_of


class SerialCollapseParams(DetectorParams):
    min_rows: int = Field(
        default=3,
        ge=1,
        description="Judge only wide tasks whose gold table has at least this many rows (independent items)",
    )


class SerialCollapse(TrajectoryDetector[SerialCollapseParams]):
    name: ClassVar[str] = "serial_collapse"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = (
        "An agent-swarm episode on a wide task that never created or assigned a sub-agent (Kimi K2.5: serial "
        "collapse, the orchestrator falling back to single-agent work)"
    )
    Params = SerialCollapseParams

    def detect(self, record: Mapping[str, Any], params: SerialCollapseParams) -> list[Finding]:
        swarm = swarm_of(record)
        gold = record.get("gold_table")
        if swarm is None or not isinstance(gold, Mapping):
            return []
        rows = gold.get("rows")
        width = len(rows) if isinstance(rows, list) else 0
        if width < params.min_rows or subagents_of(swarm):
            return []
        turns = turns_of(record)
        last = max((i for i, t in enumerate(turns) if is_assistant(t)), default=None)
        text = content_of(turns[last]) if last is not None else ""
        steps = swarm.get("critical_steps")
        evidence = {
            "message": f"a wide task of {width} items was done without a single sub-agent "
            f"({steps if isinstance(steps, int) else '?'} critical steps)",
            "turn": last,
            "span": [0, len(text)] if last is not None else None,
            "excerpt": excerpt(text, 0, len(text)),
            "measure": "subagents",
            "value": 0,
            "threshold": 1,
            "rows": width,
            "critical_steps": steps,
        }
        return [self.finding(record_id(record), "medium", evidence)]

    def suggest(self, spec: dict[str, Any]) -> tuple[dict[str, Any], str]:
        return suggest_parl_term(
            spec, "parallel_instantiation", self.name, "so launching sub-agents pays while the policy explores"
        )
