"""Reward-eval divergence: the training reward keeps rising while a held-out eval falls, the run-level signature
of a policy that learned to please the reward rather than to do the task.

Run scope: it reads two series of the run, (step, value) points of the training reward (`reward_metric`, one point
per step) and of a held-out eval metric (`eval_metric`, one point per evaluated checkpoint). The window is the
last `window` points of the eval series (the sparser one); the reward is fitted over the reward points inside
the same steps. Each trend is an ordinary least-squares line through its points (slope = sum((x - x̄)(y - ȳ)) /
sum((x - x̄)²), in metric units per step), and its change is the slope times the window's span in steps. The run is
flagged when the reward's change exceeds `min_reward_rise` while the eval's change is below -`min_eval_drop`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

from pydantic import Field

from workers.detectors.base import DetectorParams, RunDetector, RunSeries, rounded
from workers.findings import Finding, Severity


class RewardEvalDivergenceParams(DetectorParams):
    reward_metric: str = Field(
        default="reward_mean", min_length=1, description="The training reward series (the trainer's per-step mean)"
    )
    eval_metric: str = Field(
        default="eval/pass@1",
        min_length=1,
        description="The held-out eval series: one point per evaluated checkpoint, at the checkpoint's step",
    )
    window: int = Field(
        default=5,
        ge=3,
        le=1_000,
        description="How many of the latest eval points to fit (3 or more, so one noisy eval cannot make a trend)",
    )
    min_reward_rise: float = Field(
        default=0.02,
        ge=0.0,
        description="Flag only when the fitted reward rises by more than this over the window (reward units)",
    )
    min_eval_drop: float = Field(
        default=0.02,
        ge=0.0,
        description="... and the fitted eval metric falls by more than this over the window (eval metric units)",
    )
    high_eval_drop: float = Field(
        default=0.1,
        ge=0.0,
        description="Severity is high when the fitted eval metric falls by at least this over the window",
    )


def _finite(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The finite points, as floats, in step order."""
    out = [(float(x), float(y)) for x, y in points]
    return sorted((x, y) for x, y in out if math.isfinite(x) and math.isfinite(y))


def least_squares_slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Slope of the least-squares line through (x, y) points; None with fewer than two distinct x."""
    if len(points) < 2:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if spread == 0:
        return None
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread


class RewardEvalDivergence(RunDetector[RewardEvalDivergenceParams]):
    name: ClassVar[str] = "reward_eval_divergence"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = "Training reward trending up while a held-out eval metric trends down"
    Params = RewardEvalDivergenceParams

    def detect(self, series: RunSeries, params: RewardEvalDivergenceParams) -> list[Finding]:
        evals = _finite(series.get(params.eval_metric, ()))[-params.window :]
        if len(evals) < params.window:
            return []
        low, high = evals[0][0], evals[-1][0]
        rewards = [(x, y) for x, y in _finite(series.get(params.reward_metric, ())) if low <= x <= high]
        eval_slope, reward_slope = least_squares_slope(evals), least_squares_slope(rewards)
        if eval_slope is None or reward_slope is None:
            return []
        span = high - low
        reward_change, eval_change = reward_slope * span, eval_slope * span
        if reward_change <= params.min_reward_rise or eval_change >= -params.min_eval_drop:
            return []
        severity: Severity = "high" if -eval_change >= params.high_eval_drop else "medium"
        evidence = {
            "message": f"from step {low:g} to {high:g} {params.reward_metric} rose by {reward_change:.3f} "
            f"(threshold {params.min_reward_rise}) while {params.eval_metric} fell by {-eval_change:.3f} "
            f"(threshold {params.min_eval_drop})",
            "turn": None,
            "span": None,
            "excerpt": "",
            "measure": "eval_change",
            "value": rounded(eval_change, 6),
            "threshold": -params.min_eval_drop,
            "window": {"from_step": low, "to_step": high, "eval_points": len(evals), "reward_points": len(rewards)},
            "reward_metric": params.reward_metric,
            "eval_metric": params.eval_metric,
            "reward_slope": rounded(reward_slope, 8),
            "eval_slope": rounded(eval_slope, 8),
            "reward_change": rounded(reward_change, 6),
            "eval_change": rounded(eval_change, 6),
        }
        return [self.finding(None, severity, evidence)]
