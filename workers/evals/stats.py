"""Statistics for benchmark evals: pass@k, confidence intervals and paired before/after comparisons.

Conventions used throughout:

* Scores are dimensionless fractions in [0, 1]: a task either passed (1.0) or failed (0.0), or the score is the
  fraction of its k samples that passed. Means of scores are therefore pass rates in [0, 1], and differences are
  in "pass-rate points" in [-1, 1] (multiply by 100 for percentage points).
* Differences are always ``after - before``: negative means the candidate ("after") is worse.
* p-values are probabilities in [0, 1]; confidence levels are fractions in (0, 1) (0.95 for a 95% interval).
* Everything that resamples takes a fixed ``seed`` so the same inputs give the same numbers on every run, which a
  deployment gate needs in order to be auditable.

The binomial tails behind the exact tests are computed with exact integer arithmetic (no scipy), so the tests in
``tests/workers/evals/test_eval_stats.py`` can use scipy as an independent oracle.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from statistics import NormalDist
from typing import Literal

import numpy as np
import numpy.typing as npt

Alternative = Literal["two-sided", "less", "greater"]
SliceKind = Literal["tag", "difficulty", "source"]

SLICE_KINDS: tuple[SliceKind, ...] = ("tag", "difficulty", "source")
_ALTERNATIVES: tuple[Alternative, ...] = ("two-sided", "less", "greater")

# The bootstrap draws an (n_boot x n) index matrix; doing it in row chunks of at most this many cells keeps memory
# bounded (about 16 MiB of int64 indices) for large benchmarks without changing the random stream's meaning.
_BOOT_CHUNK_CELLS = 1 << 21


# --- input checks --------------------------------------------------------------------------------------------------


def check_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an integer (got {value!r})")
    if value < 0:
        raise ValueError(f"{name} must be non-negative (got {value})")


def check_confidence(confidence: float) -> None:
    if not (isinstance(confidence, int | float) and 0.0 < confidence < 1.0):
        raise ValueError(f"confidence must be strictly between 0 and 1, e.g. 0.95 (got {confidence!r})")


def _check_alternative(alternative: str) -> None:
    if alternative not in _ALTERNATIVES:
        raise ValueError(f"alternative must be one of {', '.join(_ALTERNATIVES)} (got {alternative!r})")


def finite_array(name: str, values: Iterable[float]) -> npt.NDArray[np.float64]:
    array = np.asarray(list(values), dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a flat sequence of numbers")
    if array.size == 0:
        raise ValueError(f"{name} is empty; need at least one value")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} contains a NaN or infinite value")
    return array


# --- pass@k --------------------------------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate for one task (Chen et al. 2021, "Evaluating Large Language Models Trained on Code").

    ``n`` samples were drawn for the task and ``c`` of them passed; the result is the probability (in [0, 1]) that
    at least one of ``k`` samples drawn without replacement from those ``n`` passes: ``1 - C(n-c, k) / C(n, k)``.

    The ratio of binomial coefficients is evaluated as the product ``prod_{i=n-c+1}^{n} (1 - k/i)``, which never
    forms the (astronomically large) coefficients themselves. When fewer than ``k`` samples failed
    (``n - c < k``) every draw of ``k`` contains a pass and the estimate is exactly 1.0.
    """
    check_int("n", n)
    check_int("c", c)
    check_int("k", k)
    if k < 1:
        raise ValueError(f"k must be at least 1 (got {k})")
    if k > n:
        raise ValueError(f"k must not exceed the number of samples n (got k={k}, n={n})")
    if c > n:
        raise ValueError(f"c (passing samples) must not exceed n (samples drawn) (got c={c}, n={n})")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (i - k) / i: one factor per passing sample.
    fail_all = 1.0
    for i in range(n - c + 1, n + 1):
        fail_all *= 1.0 - k / i
    return 1.0 - fail_all


def pass_at_ks(counts: Sequence[tuple[int, int]], k: int) -> dict[str, float]:
    """pass@j for j in 1, 2, 5, 10, ... up to `k` (and k itself), averaged over tasks of (samples, passed)."""
    ks = sorted({j for j in (1, 2, 5, 10, 20, 50, 100) if j <= k} | {k})
    if not counts:
        return {}
    return {f"pass@{j}": sum(pass_at_k(n, c, j) for n, c in counts) / len(counts) for j in ks}


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """Benchmark-level pass@k: the mean over tasks of `pass_at_k` for each task's ``(n, c)`` sample counts.

    Returns a pass rate in [0, 1]. Every task must have drawn at least ``k`` samples.
    """
    if len(counts) == 0:
        raise ValueError("counts is empty; need (n, c) sample counts for at least one task")
    values: list[float] = []
    for index, pair in enumerate(counts):
        if len(pair) != 2:
            raise ValueError(f"counts[{index}] must be an (n, c) pair (got {pair!r})")
        n, c = pair
        try:
            values.append(pass_at_k(n, c, k))
        except ValueError as exc:
            raise ValueError(f"counts[{index}]: {exc}") from None
    return math.fsum(values) / len(values)


# --- intervals -----------------------------------------------------------------------------------------------------


def _z(confidence: float) -> float:
    """Two-sided standard-normal critical value (1.959963984540054 for 0.95)."""
    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (pass rate) ``successes / n``.

    Returns ``(low, high)``, both in [0, 1]. Unlike the normal ("Wald") interval it stays inside [0, 1] and keeps
    close to nominal coverage for small ``n`` and rates near 0 or 1, which is where eval pass rates often live.
    """
    check_int("successes", successes)
    check_int("n", n)
    check_confidence(confidence)
    if n == 0:
        raise ValueError("n must be positive: a proportion of zero trials has no interval")
    if successes > n:
        raise ValueError(f"successes must not exceed n (got successes={successes}, n={n})")
    z = _z(confidence)
    p = successes / n
    z2n = z * z / n
    denom = 1.0 + z2n
    center = (p + z2n / 2.0) / denom
    half = (z / denom) * math.sqrt(p * (1.0 - p) / n + z2n / (4.0 * n))
    # At 0 (or n) successes the lower (upper) bound is exactly 0 (1); pin it, as rounding leaves ~1e-17 there.
    low = 0.0 if successes == 0 else max(0.0, center - half)
    high = 1.0 if successes == n else min(1.0, center + half)
    return low, high


def bootstrap_means(values: npt.NDArray[np.float64], n_boot: int, seed: int) -> npt.NDArray[np.float64]:
    """Means of ``n_boot`` resamples (with replacement, same size) of ``values``; reproducible for a given seed."""
    n = values.size
    rng = np.random.default_rng(seed)
    rows_per_chunk = max(1, _BOOT_CHUNK_CELLS // n)
    out = np.empty(n_boot, dtype=np.float64)
    start = 0
    while start < n_boot:
        rows = min(rows_per_chunk, n_boot - start)
        idx = rng.integers(0, n, size=(rows, n))
        out[start : start + rows] = values[idx].mean(axis=1)
        start += rows
    return out


def check_boot(n_boot: int, seed: int) -> None:
    check_int("n_boot", n_boot)
    if n_boot < 1:
        raise ValueError(f"n_boot must be at least 1 (got {n_boot})")
    check_int("seed", seed)


def percentile_ci(means: npt.NDArray[np.float64], confidence: float) -> tuple[float, float]:
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(low), float(high)


def bootstrap_mean_ci(
    values: Sequence[float], confidence: float = 0.95, n_boot: int = 10_000, seed: int = 0
) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval ``(low, high)`` for the mean of ``values`` (same units as values).

    ``n_boot`` resamples of the same size are drawn with replacement using ``numpy.random.default_rng(seed)``, so
    the result is reproducible. A single value (or all-equal values) gives a zero-width interval at that value.
    """
    check_confidence(confidence)
    check_boot(n_boot, seed)
    array = finite_array("values", values)
    return percentile_ci(bootstrap_means(array, n_boot, seed), confidence)


# --- exact tests ---------------------------------------------------------------------------------------------------


def _binom_half_cdf(x: int, n: int) -> float:
    """P(X <= x) for X ~ Binomial(n, 1/2), exactly (integer sums), rounded once to a float."""
    if x < 0:
        return 0.0
    if x >= n:
        return 1.0
    # Sum the shorter side: P(X <= x) = 1 - P(X <= n-x-1) by the symmetry of p = 1/2.
    upper = x > (n - 1) // 2
    last = n - x - 1 if upper else x
    term = 1  # C(n, 0)
    total = 1
    for i in range(1, last + 1):
        term = term * (n - i + 1) // i
        total += term
    whole = 1 << n
    return (whole - total) / whole if upper else total / whole


def _binom_half_test(x: int, n: int, alternative: Alternative) -> float:
    """Exact binomial test of ``x`` successes in ``n`` trials against p = 1/2; 1.0 when n == 0."""
    if n == 0:
        return 1.0
    if alternative == "less":
        return _binom_half_cdf(x, n)
    if alternative == "greater":
        # P(X >= x) = P(X <= n - x) by symmetry; this form keeps tiny upper tails exact instead of 1 - (1 - eps).
        return _binom_half_cdf(n - x, n)
    # p = 1/2 is symmetric, so "as or more extreme" is both tails beyond min(x, n - x): twice the smaller tail.
    return min(1.0, 2.0 * _binom_half_cdf(min(x, n - x), n))


def mcnemar_exact(b: int, c: int, alternative: Alternative = "two-sided") -> float:
    """Exact McNemar test for paired binary outcomes; returns the p-value in [0, 1].

    Of the discordant pairs, ``b`` succeeded under the first condition and failed under the second, ``c`` the
    reverse. Under the null hypothesis (both conditions equally likely to succeed) ``b ~ Binomial(b + c, 1/2)``.
    ``alternative`` is about ``b`` relative to ``c``: ``"greater"`` tests b > c (e.g. with b = tasks the candidate
    newly fails, "the candidate is worse"), ``"less"`` tests b < c, ``"two-sided"`` tests b != c.
    Concordant pairs carry no information; with no discordant pairs at all the p-value is 1.0.
    """
    check_int("b", b)
    check_int("c", c)
    _check_alternative(alternative)
    return _binom_half_test(int(b), int(b) + int(c), alternative)


def sign_test(diffs: Sequence[float], alternative: Alternative = "two-sided") -> float:
    """Exact sign test on paired differences; returns the p-value in [0, 1].

    Zero differences are dropped (they favour neither side); among the rest the count of positive differences is
    ``Binomial(m, 1/2)`` under the null of a zero median difference. ``"greater"`` tests for mostly positive
    differences, ``"less"`` for mostly negative ones. With no nonzero differences the p-value is 1.0.
    """
    _check_alternative(alternative)
    array = finite_array("diffs", diffs)
    positive = int(np.count_nonzero(array > 0))
    nonzero = int(np.count_nonzero(array))
    return _binom_half_test(positive, nonzero, alternative)


def holm_adjust(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the input order.

    With the m p-values sorted ascending, ``adj_(i) = max_{j <= i} min(1, (m - j) * p_(j))`` (j counted from 0).
    Rejecting every hypothesis whose adjusted p-value is below alpha is exactly Holm's step-down procedure and
    controls the family-wise error rate at alpha under any dependence between the tests.
    """
    m = len(p_values)
    for p in p_values:
        if not (0.0 <= p <= 1.0):
            raise ValueError(f"p-values must be in [0, 1] (got {p!r})")
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
