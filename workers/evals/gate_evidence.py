"""What a deployment gate reads and what it records (`workers.evals.gates` holds the rules and applies them): a
candidate's eval evidence per benchmark (`BenchmarkEvidence`), everything a gate may look at (`GateInputs`), the
decision on each rule (`RuleOutcome`) and on the gate (`GateEvaluation`), and the JSON record of the evidence a rule
used (`evidence_record`: values, eval id, benchmark version and content hash, a hash of the per-task scores)."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from workers.evals.paired import TaskScore

Verdict = Literal["pass", "fail", "pending"]
Approval = Literal["approved", "rejected", ""]


@dataclass(frozen=True)
class BenchmarkEvidence:
    """One finished eval of a model on one benchmark version.

    ``version`` / ``content_hash`` identify the exact task set; ``eval_id`` is the control plane's eval record
    (None when not persisted); ``metrics`` maps metric names to values (e.g. "pass@1" -> 0.62, a rate in [0, 1]);
    ``tasks`` maps task ids to per-task scores (see `TaskScore`).
    """

    benchmark: str
    version: int
    content_hash: str
    eval_id: int | None
    metrics: Mapping[str, float]
    tasks: Mapping[str, TaskScore]


@dataclass(frozen=True)
class GateInputs:
    """Everything a gate may look at.

    ``candidate`` / ``baseline``: evidence keyed by benchmark name, for the model to deploy and for the current
    deployment (``baseline`` is None when nothing is deployed). ``flag_rates``: detector name -> fraction of the
    candidate's evaluated trajectories it flagged, in [0, 1] ("*" = flagged by any detector). ``approval``: the
    human decision so far ("" = none yet).
    """

    candidate: Mapping[str, BenchmarkEvidence]
    baseline: Mapping[str, BenchmarkEvidence] | None = None
    flag_rates: Mapping[str, float] = field(default_factory=dict)
    approval: Approval = ""


@dataclass(frozen=True)
class RuleOutcome:
    """The decision on one rule: ``rule`` as JSON, the ``inputs`` it read, its ``statistic`` and a message."""

    index: int
    rule: dict[str, Any]
    verdict: Verdict
    inputs: dict[str, Any]
    statistic: dict[str, Any]
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "rule": self.rule,
            "verdict": self.verdict,
            "inputs": self.inputs,
            "statistic": self.statistic,
            "message": self.message,
        }


@dataclass(frozen=True)
class GateEvaluation:
    """All rule outcomes and the overall ``verdict``: "fail" if any rule failed, else "pending" if an approval is
    still awaited, else "pass"."""

    outcomes: list[RuleOutcome]
    verdict: Verdict

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "outcomes": [o.to_dict() for o in self.outcomes]}


# --- evidence records ----------------------------------------------------------------------------------------------


def json_number(value: float) -> float | None:
    """A JSON-safe number: NaN and infinities (which strict JSON cannot hold) become None."""
    value = float(value)
    return value if math.isfinite(value) else None


def _tasks_sha256(tasks: Mapping[str, TaskScore]) -> str:
    """SHA-256 of the per-task scores (sorted ids, canonical JSON): pins the exact data a comparison used."""
    payload = [[task_id, float(tasks[task_id].score)] for task_id in sorted(tasks)]
    return hashlib.sha256(json.dumps(payload, separators=(",", ":")).encode("utf-8")).hexdigest()


def evidence_record(evidence: BenchmarkEvidence, metric: str) -> dict[str, Any]:
    value = evidence.metrics.get(metric)
    return {
        "benchmark": evidence.benchmark,
        "version": evidence.version,
        "content_hash": evidence.content_hash,
        "eval_id": evidence.eval_id,
        "metric": metric,
        "metric_value": None if value is None else json_number(value),
        "n_tasks": len(evidence.tasks),
        "tasks_sha256": _tasks_sha256(evidence.tasks),
    }
