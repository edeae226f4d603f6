"""Flags the control plane finds itself (run-level detectors), written by review like every flag."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from apps.review.models import (
    Flag,
)
from apps.runs.models import Run


def flags_record(*, run: Run, findings: Sequence[Any], step: int, evidence: dict[str, Any] | None = None) -> None:
    """Store run-level detector findings (no trajectory: `trajectory_ref` is "run:<id>") as flags of `run`, once
    per detector (a repeat is ignored); `evidence` is added to each finding's own."""
    Flag.objects.bulk_create(
        [
            Flag(
                run=run,
                trajectory_ref=f"run:{run.pk}",
                detector=finding.detector,
                detector_version=finding.version,
                severity=finding.severity,
                evidence={**finding.evidence, **(evidence or {})},
                step=step,
            )
            for finding in findings
        ],
        ignore_conflicts=True,
    )
