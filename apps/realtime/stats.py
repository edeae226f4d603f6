"""The statistics of an A/B comparison between two serving arms: plain functions over counts and samples.

- A rate (edit kept, dissatisfied follow-up: the share of sessions with that signal) gets a Wilson score interval
  (Wilson 1927), which stays inside [0, 1] and keeps its coverage at small counts where the Wald interval does not.
- The difference of two rates (b − a) gets Newcombe's hybrid score interval (Newcombe 1998, method 10: built from
  the two Wilson intervals) and a two-sided two-proportion z-test with the pooled proportion.
- A latency percentile gets a distribution-free order-statistic interval: the ranks l, u with
  Binomial(n, q) mass of at least 1 − α between them, so [x_(l), x_(u)] covers the true q-quantile with probability
  of at least about 1 − α whatever the distribution (a bound is None when n is too small to have that rank).
- The difference of median latencies (b − a) gets a percentile bootstrap interval (seeded, so a page shows the same
  numbers on every load) and a two-sided Mann-Whitney U test.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from workers.evals import stats as evals_stats

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_MAX_SAMPLES = 2000
"""Latencies per arm the bootstrap resamples at most (the newest): bounds its cost at 2M draws per arm."""


def wilson_interval(successes: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Wilson score interval of a proportion successes/n (workers.evals.stats); None when n = 0."""
    return None if n <= 0 else evals_stats.wilson_interval(successes, n, confidence)


def two_proportion_p_value(successes_a: int, n_a: int, successes_b: int, n_b: int) -> float | None:
    """Two-sided p-value of the z-test of p_a = p_b with the pooled proportion; None when an arm is empty, 1.0 when
    both proportions are 0 or both 1 (no variation to test)."""
    if n_a <= 0 or n_b <= 0:
        return None
    pooled = (successes_a + successes_b) / (n_a + n_b)
    variance = pooled * (1 - pooled) * (1 / n_a + 1 / n_b)
    if variance <= 0:
        return 1.0
    z = (successes_b / n_b - successes_a / n_a) / math.sqrt(variance)
    return float(2 * stats.norm.sf(abs(z)))


def newcombe_interval(
    successes_a: int, n_a: int, successes_b: int, n_b: int, confidence: float = CONFIDENCE
) -> tuple[float, float] | None:
    """Newcombe's hybrid score interval of p_b − p_a (method 10); None when an arm is empty."""
    interval_a = wilson_interval(successes_a, n_a, confidence)
    interval_b = wilson_interval(successes_b, n_b, confidence)
    if interval_a is None or interval_b is None:
        return None
    p_a, p_b = successes_a / n_a, successes_b / n_b
    (l_a, u_a), (l_b, u_b) = interval_a, interval_b
    difference = p_b - p_a
    lower = difference - math.sqrt((p_b - l_b) ** 2 + (u_a - p_a) ** 2)
    upper = difference + math.sqrt((u_b - p_b) ** 2 + (p_a - l_a) ** 2)
    return lower, upper


@dataclass(frozen=True)
class Percentile:
    value: float | None
    low: float | None
    high: float | None


def percentile_interval(values: Sequence[float], q: float, confidence: float = CONFIDENCE) -> Percentile:
    """The q-quantile (0 < q < 1; numpy's linear interpolation) of `values` and its order-statistic interval."""
    n = len(values)
    if n == 0:
        return Percentile(None, None, None)
    ordered = np.sort(np.asarray(values, dtype=float))
    value = float(np.quantile(ordered, q))
    alpha = 1 - confidence
    # 1-based ranks: P(x_(l) <= xi_q) >= 1 - alpha/2 needs l - 1 <= the alpha/2 quantile of Binomial(n, q).
    low_rank = int(stats.binom.ppf(alpha / 2, n, q))
    high_rank = int(stats.binom.ppf(1 - alpha / 2, n, q)) + 1
    low = float(ordered[low_rank - 1]) if low_rank >= 1 else None
    high = float(ordered[high_rank - 1]) if high_rank <= n else None
    return Percentile(value, low, high)


@dataclass(frozen=True)
class MedianDifference:
    difference: float | None
    relative: float | None
    low: float | None
    high: float | None
    p_value: float | None


def median_difference(
    values_a: Sequence[float], values_b: Sequence[float], confidence: float = CONFIDENCE, seed: int = 0
) -> MedianDifference:
    """median(b) − median(a), relative to median(a), with a seeded percentile-bootstrap interval and the two-sided
    Mann-Whitney U p-value. Each arm's newest BOOTSTRAP_MAX_SAMPLES values are resampled (`values` in time order)."""
    if not values_a or not values_b:
        return MedianDifference(None, None, None, None, None)
    a = np.asarray(values_a, dtype=float)
    b = np.asarray(values_b, dtype=float)
    median_a, median_b = float(np.median(a)), float(np.median(b))
    difference = median_b - median_a
    relative = difference / median_a if median_a > 0 else None
    rng = np.random.default_rng(seed)
    tail_a, tail_b = a[-BOOTSTRAP_MAX_SAMPLES:], b[-BOOTSTRAP_MAX_SAMPLES:]
    boot_a = np.median(rng.choice(tail_a, size=(BOOTSTRAP_RESAMPLES, tail_a.size), replace=True), axis=1)
    boot_b = np.median(rng.choice(tail_b, size=(BOOTSTRAP_RESAMPLES, tail_b.size), replace=True), axis=1)
    alpha = 1 - confidence
    low, high = np.quantile(boot_b - boot_a, [alpha / 2, 1 - alpha / 2])
    p_value = float(stats.mannwhitneyu(a, b, alternative="two-sided").pvalue)
    return MedianDifference(difference, relative, float(low), float(high), p_value if math.isfinite(p_value) else None)
