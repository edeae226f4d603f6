"""Reads for gates: the current deployment, detector flag rates over evals, and the webhook payloads of decisions
and deployments."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from apps.benchmarks.models import Eval
from apps.gates.models import Deployment, Gate, GateDecision
from apps.review.models import Flag
from apps.runs.models import TrajectorySummary


def current_deployment(gate: Gate) -> Deployment | None:
    return Deployment.objects.select_related("checkpoint__run").filter(gate=gate, is_current=True).first()


def flag_rates(evals: Sequence[Eval]) -> dict[str, float]:
    """Detector flag rates over the evals' trajectories: flagged trajectories / trajectories, per detector and
    for any detector ("*"). Detectors that raised nothing have no entry of their own; "*" is always there."""
    run_ids = [e.run_id for e in evals]
    total = TrajectorySummary.objects.filter(run_id__in=run_ids).count()
    rates: dict[str, float] = {}
    flags = Flag.objects.filter(run_id__in=run_ids)
    # Trajectory ids repeat across eval runs (eval-<shard>-<task>-<i>): count distinct (run, trajectory) pairs.
    for detector in flags.values_list("detector", flat=True).distinct():
        flagged = flags.filter(detector=detector).values("run_id", "trajectory_ref").distinct().count()
        rates[detector] = flagged / total if total else 0.0
    any_flagged = flags.values("run_id", "trajectory_ref").distinct().count()
    rates["*"] = any_flagged / total if total else 0.0
    return rates


def decision_payload(decision: GateDecision) -> dict[str, Any]:
    return {
        "decision": decision.pk,
        "gate": decision.gate.name,
        "checkpoint": decision.checkpoint_id,
        "verdict": decision.final_verdict,
        "final_verdict": decision.final_verdict,  # an alias of verdict, for scripts written before issue 39
        "stages": decision.stages,
        "approval": decision.approval,
        "approved_by": decision.approved_by.username if decision.approved_by else None,
        "rules": [
            {"index": o["index"], "type": o["rule"]["type"], "verdict": o["verdict"], "message": o["message"]}
            for o in decision.evidence.get("outcomes", [])
        ],
    }


def deployment_payload(deployment: Deployment) -> dict[str, Any]:
    return {
        "deployment": deployment.pk,
        "gate": deployment.gate.name,
        "checkpoint": deployment.checkpoint_id,
        "checkpoint_uri": deployment.checkpoint.uri,
        "decision": deployment.decision_id,
        "rolled_back_from": deployment.rolled_back_from_id,
        "created_by": deployment.created_by.username,
    }
