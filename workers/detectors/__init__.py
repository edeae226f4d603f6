"""Reward-hacking detectors: pure, versioned checks over trajectories and run metrics (issue 6, section 1).

`run_detectors(record, config)` runs the enabled trajectory detectors on one trajectory record; the rollout
worker calls it on every scored episode, the re-scoring and eval jobs on every trajectory, and the jobs report
each `Finding` as a `flag` event. Add a detector by adding one module here, or to a domain package's
`detectors/` (`workers/coding/detectors/`); see `base` for the interface.
"""

from __future__ import annotations

from workers.detectors.base import DetectorParams, RunDetector, TrajectoryDetector
from workers.detectors.registry import (
    DetectorConfig,
    default_detector_config,
    detectors,
    flag_metrics,
    get_detector,
    run_detectors,
    run_run_detectors,
    suggest_penalty,
)
from workers.findings import SEVERITIES, Finding, Severity

__all__ = [
    "SEVERITIES",
    "DetectorConfig",
    "DetectorParams",
    "Finding",
    "RunDetector",
    "Severity",
    "TrajectoryDetector",
    "default_detector_config",
    "detectors",
    "flag_metrics",
    "get_detector",
    "run_detectors",
    "run_run_detectors",
    "suggest_penalty",
]
