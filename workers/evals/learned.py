"""Did a run learn? The trend of its reward with its interval (`linear_trend`), the share of groups that carried a
signal, and the verdict of its last checkpoint against its base on the same benchmark (`eval_verdict`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from workers.evals.stats import (
    check_confidence,
    check_int,
)

# --- did a run learn? ----------------------------------------------------------------------------------------------

TrendVerdict = Literal["improving", "flat", "worsening", "unknown"]
EvalVerdict = Literal["better", "no_difference", "worse"]


@dataclass(frozen=True)
class Trend:
    """A least-squares line through ``(x, y)`` points (a metric against training steps).

    ``slope`` is in y units per x unit (reward per step) and ``[ci_low, ci_high]`` its two-sided interval at
    ``confidence`` from Student's t with ``n - 2`` degrees of freedom (the classical OLS interval: residuals
    assumed independent with equal variance, which step-to-step reward noise roughly is). ``start`` / ``end`` are
    the fitted line at the first and last x. ``first_mean`` / ``last_mean`` are the plain means of the first and
    last ``window`` points (fewer on a short series: at most half of them each, so the two never overlap).
    ``verdict``: ``"improving"`` when the whole interval is above 0, ``"worsening"`` when below, else ``"flat"``;
    a perfect fit (zero residuals) has a zero-width interval at the slope.
    """

    n: int
    slope: float
    ci_low: float
    ci_high: float
    start: float
    end: float
    first_mean: float
    last_mean: float
    window: int
    verdict: TrendVerdict

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def linear_trend(x: Sequence[float], y: Sequence[float], *, confidence: float = 0.95, window: int = 10) -> Trend | None:
    """Fit ``y = a + b x`` by ordinary least squares and return the slope ``b`` with its t interval (`Trend`).

    ``b = Sxy / Sxx`` with ``Sxx = sum (x - mean x)^2`` and ``Sxy = sum (x - mean x)(y - mean y)``; its standard
    error is ``sqrt(SSE / (n - 2) / Sxx)`` where ``SSE`` is the residual sum of squares, and the interval is
    ``b +- t_{(1+confidence)/2, n-2} * se``. Returns None when the slope is not estimable: fewer than 3 points
    (no degree of freedom for the error) or every x equal.
    """
    check_confidence(confidence)
    check_int("window", window)
    if window < 1:
        raise ValueError(f"window must be at least 1 (got {window})")
    xs = np.asarray(list(x), dtype=np.float64)
    ys = np.asarray(list(y), dtype=np.float64)
    if xs.ndim != 1 or ys.ndim != 1 or xs.size != ys.size:
        raise ValueError(f"x and y must be flat sequences of the same length (got {xs.size} and {ys.size} values)")
    if not (np.all(np.isfinite(xs)) and np.all(np.isfinite(ys))):
        raise ValueError("x and y must be finite numbers; found a NaN or infinite value")
    n = int(xs.size)
    if n < 3:
        return None
    dx = xs - xs.mean()
    sxx = float(np.dot(dx, dx))
    if sxx == 0.0:
        return None
    slope = float(np.dot(dx, ys - ys.mean())) / sxx
    intercept = float(ys.mean()) - slope * float(xs.mean())
    residuals = ys - (intercept + slope * xs)
    sse = float(np.dot(residuals, residuals))
    from scipy import stats as scipy_stats  # the t quantile; imported here so pass@k and friends need no scipy

    t_crit = float(scipy_stats.t.ppf(0.5 + confidence / 2.0, n - 2))
    half = t_crit * math.sqrt(sse / (n - 2) / sxx)
    low, high = slope - half, slope + half
    verdict: TrendVerdict = "improving" if low > 0 else "worsening" if high < 0 else "flat"
    if half == 0.0:  # a perfect fit: the slope's sign is the answer
        verdict = "improving" if slope > 0 else "worsening" if slope < 0 else "flat"
    size = max(1, min(window, n // 2))  # at most half the points each: the two windows never overlap
    return Trend(
        n=n,
        slope=slope,
        ci_low=low,
        ci_high=high,
        start=intercept + slope * float(xs[0]),
        end=intercept + slope * float(xs[-1]),
        first_mean=float(ys[:size].mean()),
        last_mean=float(ys[-size:].mean()),
        window=size,
        verdict=verdict,
    )


def eval_verdict(diff: float, p_two_sided: float, alpha: float = 0.05) -> EvalVerdict:
    """The answer to "is the candidate better than the baseline?" from a paired comparison: ``"better"`` when the
    two-sided p-value is below ``alpha`` and the mean difference ``after - before`` is positive, ``"worse"`` when
    below ``alpha`` and negative, else ``"no_difference"`` (no significant difference at ``alpha``: not proof of
    equality, only that the benchmark cannot tell them apart)."""
    if not (isinstance(alpha, int | float) and 0.0 < alpha < 1.0):
        raise ValueError(f"alpha must be strictly between 0 and 1 (got {alpha!r})")
    if not (0.0 <= p_two_sided <= 1.0):
        raise ValueError(f"p_two_sided must be in [0, 1] (got {p_two_sided!r})")
    if not math.isfinite(diff):
        raise ValueError(f"diff must be a finite number (got {diff!r})")
    if p_two_sided < alpha and diff > 0:
        return "better"
    if p_two_sided < alpha and diff < 0:
        return "worse"
    return "no_difference"


def signal_share(groups: Sequence[float], signal_groups: Sequence[float]) -> float | None:
    """The share (in [0, 1]) of a run's groups whose rewards were not all equal: ``sum(signal) / sum(groups)`` over
    its steps (each step weighted by its group count, not each step's share equally). None without any group."""
    total = math.fsum(groups)
    if len(groups) != len(signal_groups):
        raise ValueError(f"groups and signal_groups must pair up per step (got {len(groups)} and {len(signal_groups)})")
    if any(g < 0 for g in groups) or any(s < 0 for s in signal_groups):
        raise ValueError("group counts must be non-negative")
    if any(s > g for g, s in zip(groups, signal_groups, strict=True)):
        raise ValueError("signal_groups must not exceed groups at any step")
    if total <= 0:
        return None
    return math.fsum(signal_groups) / total
