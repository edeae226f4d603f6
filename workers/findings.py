"""What a detector reports: a `Finding` and its `Severity`. Plain records, at the bottom of `workers/` with the
trajectories, so the event stream and the reporter carry findings without importing the detectors
(`workers.detectors.base` defines the detectors themselves; the evidence keys are in its docstring)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Severity = Literal["low", "medium", "high"]
"""How likely a flag is a hack worth a reviewer's time; the values of `apps.review.models.Severity`."""

SEVERITIES: tuple[Severity, ...] = ("low", "medium", "high")
SEVERITY_RANK: dict[Severity, int] = {severity: rank for rank, severity in enumerate(SEVERITIES)}


@dataclass(frozen=True)
class Finding:
    """One detector's suspicion about one trajectory (or, for run scope, about the run: `trajectory_id` None).

    `evidence` is JSON-able (see the module docstring for its keys); `version` is the detector's version."""

    detector: str
    version: str
    severity: Severity
    evidence: dict[str, Any]
    trajectory_id: str | None
