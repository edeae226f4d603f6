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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any, Literal

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


def _check_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an integer (got {value!r})")
    if value < 0:
        raise ValueError(f"{name} must be non-negative (got {value})")


def _check_confidence(confidence: float) -> None:
    if not (isinstance(confidence, int | float) and 0.0 < confidence < 1.0):
        raise ValueError(f"confidence must be strictly between 0 and 1, e.g. 0.95 (got {confidence!r})")


def _check_alternative(alternative: str) -> None:
    if alternative not in _ALTERNATIVES:
        raise ValueError(f"alternative must be one of {', '.join(_ALTERNATIVES)} (got {alternative!r})")


def _finite_array(name: str, values: Iterable[float]) -> npt.NDArray[np.float64]:
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
    _check_int("n", n)
    _check_int("c", c)
    _check_int("k", k)
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
    _check_int("successes", successes)
    _check_int("n", n)
    _check_confidence(confidence)
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


def _bootstrap_means(values: npt.NDArray[np.float64], n_boot: int, seed: int) -> npt.NDArray[np.float64]:
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


def _check_boot(n_boot: int, seed: int) -> None:
    _check_int("n_boot", n_boot)
    if n_boot < 1:
        raise ValueError(f"n_boot must be at least 1 (got {n_boot})")
    _check_int("seed", seed)


def _percentile_ci(means: npt.NDArray[np.float64], confidence: float) -> tuple[float, float]:
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
    _check_confidence(confidence)
    _check_boot(n_boot, seed)
    array = _finite_array("values", values)
    return _percentile_ci(_bootstrap_means(array, n_boot, seed), confidence)


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
    _check_int("b", b)
    _check_int("c", c)
    _check_alternative(alternative)
    return _binom_half_test(int(b), int(b) + int(c), alternative)


def sign_test(diffs: Sequence[float], alternative: Alternative = "two-sided") -> float:
    """Exact sign test on paired differences; returns the p-value in [0, 1].

    Zero differences are dropped (they favour neither side); among the rest the count of positive differences is
    ``Binomial(m, 1/2)`` under the null of a zero median difference. ``"greater"`` tests for mostly positive
    differences, ``"less"`` for mostly negative ones. With no nonzero differences the p-value is 1.0.
    """
    _check_alternative(alternative)
    array = _finite_array("diffs", diffs)
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


# --- paired comparisons --------------------------------------------------------------------------------------------


def paired_bootstrap(
    before: Sequence[float],
    after: Sequence[float],
    n_boot: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> tuple[float, float, float, float]:
    """Paired bootstrap of the mean difference ``after - before`` (pass-rate points in [-1, 1] for scores).

    Returns ``(mean_diff, ci_low, ci_high, p_one_sided_worse)``. Pairs are resampled together, so task
    difficulty cancels out. The interval is the percentile interval at ``confidence``. ``p_one_sided_worse`` is
    the bootstrap p-value for "after is worse than before": the share of resampled mean differences that are
    >= 0, with the usual +1 correction ``(count + 1) / (n_boot + 1)`` so it is never exactly 0. It is small only
    when nearly every resample shows a drop. The seed makes all four numbers reproducible.
    """
    _check_confidence(confidence)
    _check_boot(n_boot, seed)
    b = _finite_array("before", before)
    a = _finite_array("after", after)
    if a.size != b.size:
        raise ValueError(f"before and after must pair up one to one (got {b.size} and {a.size} values)")
    diffs = a - b
    mean_diff = math.fsum(diffs.tolist()) / diffs.size
    means = _bootstrap_means(diffs, n_boot, seed)
    low, high = _percentile_ci(means, confidence)
    p_worse = (int(np.count_nonzero(means >= 0.0)) + 1) / (n_boot + 1)
    return mean_diff, low, high, min(1.0, p_worse)


@dataclass(frozen=True)
class TaskScore:
    """One task's eval result: ``score`` in [0, 1] (pass/fail as 1/0, or the fraction of k samples that passed),
    with the task's ``tags``, ``difficulty`` and ``source`` used to slice comparisons ("" = unknown)."""

    score: float
    tags: tuple[str, ...] = ()
    difficulty: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.score, bool) or not isinstance(self.score, int | float):
            raise ValueError(f"TaskScore.score must be a number in [0, 1] (got {self.score!r})")
        if not (0.0 <= self.score <= 1.0):  # also rejects NaN
            raise ValueError(f"TaskScore.score must be in [0, 1] (got {self.score!r})")
        if isinstance(self.tags, str):
            # A bare string would silently become one tag per character.
            raise ValueError(f"TaskScore.tags must be a tuple of strings, not a string (got {self.tags!r})")


@dataclass(frozen=True)
class SliceStats:
    """Before/after statistics for one slice of paired tasks (or ``slice == "overall"`` for all of them).

    ``n`` paired tasks; ``before_mean`` / ``after_mean`` are mean scores (pass rates in [0, 1]); ``diff`` is
    ``after_mean - before_mean`` and ``[ci_low, ci_high]`` its paired-bootstrap interval (pass-rate points);
    ``improved`` / ``worse`` count tasks whose score went up / down. ``test`` is ``"mcnemar_exact"`` (all scores
    0/1) or ``"sign_test"``; ``p_two_sided`` tests for any change and ``p_worse`` (one-sided) for "after is worse".
    ``p_worse_adjusted`` is ``p_worse`` after the Holm correction across slices (equal to ``p_worse`` for the
    overall row). ``significant_regression`` is ``diff < 0 and p_worse_adjusted < alpha``.
    """

    slice: str
    n: int
    before_mean: float
    after_mean: float
    diff: float
    ci_low: float
    ci_high: float
    improved: int
    worse: int
    test: str
    p_two_sided: float
    p_worse: float
    p_worse_adjusted: float
    significant_regression: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Comparison:
    """Result of `compare_paired`: the ``overall`` row, one row per slice, and how the pairing went.

    ``binary`` is True when every paired score was 0 or 1 (exact McNemar was used); ``unpaired_before`` /
    ``unpaired_after`` count task ids present on only one side (excluded from every statistic).
    """

    overall: SliceStats
    slices: list[SliceStats]
    binary: bool
    unpaired_before: int
    unpaired_after: int
    alpha: float
    confidence: float

    @property
    def significant_regression(self) -> bool:
        """True when the overall row or any slice shows a significant regression."""
        return self.overall.significant_regression or any(s.significant_regression for s in self.slices)

    def to_dict(self) -> dict[str, Any]:
        return {
            "overall": self.overall.to_dict(),
            "slices": [s.to_dict() for s in self.slices],
            "binary": self.binary,
            "unpaired_before": self.unpaired_before,
            "unpaired_after": self.unpaired_after,
            "alpha": self.alpha,
            "confidence": self.confidence,
            "significant_regression": self.significant_regression,
        }


def _slice_stats(
    name: str,
    before: list[float],
    after: list[float],
    *,
    binary: bool,
    confidence: float,
    n_boot: int,
    seed: int,
) -> SliceStats:
    """Statistics for one slice; ``p_worse_adjusted`` / ``significant_regression`` are filled in by the caller."""
    n = len(before)
    diffs = [a - b for a, b in zip(after, before, strict=True)]
    improved = sum(1 for d in diffs if d > 0)
    worse = sum(1 for d in diffs if d < 0)
    mean_diff, low, high, _ = paired_bootstrap(before, after, n_boot=n_boot, seed=seed, confidence=confidence)
    if binary:
        # "worse" pairs are before=1, after=0: McNemar's b with the candidate as the second condition.
        test = "mcnemar_exact"
        p_two = mcnemar_exact(worse, improved)
        p_worse = mcnemar_exact(worse, improved, alternative="greater")
    else:
        test = "sign_test"
        p_two = sign_test(diffs)
        p_worse = sign_test(diffs, alternative="less")
    return SliceStats(
        slice=name,
        n=n,
        before_mean=math.fsum(before) / n,
        after_mean=math.fsum(after) / n,
        diff=mean_diff,
        ci_low=low,
        ci_high=high,
        improved=improved,
        worse=worse,
        test=test,
        p_two_sided=p_two,
        p_worse=p_worse,
        p_worse_adjusted=p_worse,
        significant_regression=False,
    )


def _with_decision(stats: SliceStats, p_adjusted: float, alpha: float) -> SliceStats:
    return SliceStats(
        **{
            **asdict(stats),
            "p_worse_adjusted": p_adjusted,
            "significant_regression": stats.diff < 0 and p_adjusted < alpha,
        }
    )


def _slice_keys(kind: SliceKind, task: TaskScore) -> list[str]:
    if kind == "tag":
        return [f"tag:{tag}" for tag in dict.fromkeys(task.tags) if tag]
    value = task.difficulty if kind == "difficulty" else task.source
    return [f"{kind}:{value}"] if value else []


def compare_paired(
    before: Mapping[str, TaskScore],
    after: Mapping[str, TaskScore],
    *,
    alpha: float = 0.05,
    slice_by: Sequence[str] = (),
    confidence: float = 0.95,
    n_boot: int = 10_000,
    seed: int = 0,
) -> Comparison:
    """Compare per-task scores of a baseline (``before``) and a candidate (``after``), keyed by task id.

    Pairing: only task ids present on both sides are compared; the others are counted in ``unpaired_before`` /
    ``unpaired_after``. Test: when every paired score is 0 or 1 the exact McNemar test on the discordant tasks is
    used (``binary=True``), otherwise an exact sign test on the per-task differences ``after - before``. Every row
    also gets the paired-bootstrap interval of the mean difference (``n_boot`` resamples, fixed ``seed``).

    Slices: ``slice_by`` may name ``"tag"`` (one slice per tag; a task counts in each of its tags),
    ``"difficulty"`` and ``"source"``; a task with an empty value is in no slice of that kind. Slice metadata is
    the candidate's (``after``), falling back to the baseline's where the candidate's field is empty.

    Significance (the decision a deployment gate relies on): a row is a significant regression when its mean
    difference is negative *and* its one-sided "after is worse" p-value is below ``alpha``. The overall row is
    tested at ``alpha`` on its own, as the primary hypothesis. The slice rows are a family of m extra hypotheses,
    and looking at many slices would otherwise flag chance dips; their p-values are Holm-Bonferroni adjusted
    across all m slices (``p_worse_adjusted``) so the chance of any false slice flag stays at most ``alpha``.
    Holm is used rather than plain Bonferroni because it is uniformly more powerful with the same guarantee and
    needs no independence between slices (tasks with several tags make slices overlap).
    """
    if not (isinstance(alpha, int | float) and 0.0 < alpha < 1.0):
        raise ValueError(f"alpha must be strictly between 0 and 1 (got {alpha!r})")
    _check_confidence(confidence)
    _check_boot(n_boot, seed)
    kinds: list[SliceKind] = []
    for kind in slice_by:
        if kind not in SLICE_KINDS:
            raise ValueError(f"slice_by: unknown slice kind {kind!r}; use any of {', '.join(SLICE_KINDS)}")
        if kind not in kinds:
            kinds.append(kind)
    if len(before) == 0:
        raise ValueError("before has no task scores; need at least one task on each side")
    if len(after) == 0:
        raise ValueError("after has no task scores; need at least one task on each side")
    for side, scores in (("before", before), ("after", after)):
        for task_id, task in scores.items():
            if not isinstance(task, TaskScore):
                raise ValueError(f"{side}[{task_id!r}] must be a TaskScore (got {type(task).__name__})")
    shared = sorted(set(before) & set(after))
    if not shared:
        raise ValueError(
            f"before and after share no task ids ({len(before)} vs {len(after)} tasks); nothing to compare"
        )
    unpaired_before = len(before) - len(shared)
    unpaired_after = len(after) - len(shared)

    b_scores = [float(before[t].score) for t in shared]
    a_scores = [float(after[t].score) for t in shared]
    binary = all(s in (0.0, 1.0) for s in b_scores + a_scores)

    def row(name: str, idx: list[int]) -> SliceStats:
        return _slice_stats(
            name,
            [b_scores[i] for i in idx],
            [a_scores[i] for i in idx],
            binary=binary,
            confidence=confidence,
            n_boot=n_boot,
            seed=seed,
        )

    overall = row("overall", list(range(len(shared))))
    overall = _with_decision(overall, overall.p_worse, alpha)

    members: dict[str, list[int]] = {}
    for kind in kinds:
        kind_members: dict[str, list[int]] = {}
        for i, task_id in enumerate(shared):
            cand, base = after[task_id], before[task_id]
            merged = TaskScore(
                score=cand.score,
                tags=cand.tags or base.tags,
                difficulty=cand.difficulty or base.difficulty,
                source=cand.source or base.source,
            )
            for key in _slice_keys(kind, merged):
                kind_members.setdefault(key, []).append(i)
        # Sorted within a kind, kinds in the order asked for: a stable order for reports and audits.
        for key in sorted(kind_members):
            members[key] = kind_members[key]

    raw = [row(name, idx) for name, idx in members.items()]
    adjusted = holm_adjust([s.p_worse for s in raw])
    slices = [_with_decision(s, p, alpha) for s, p in zip(raw, adjusted, strict=True)]
    return Comparison(
        overall=overall,
        slices=slices,
        binary=binary,
        unpaired_before=unpaired_before,
        unpaired_after=unpaired_after,
        alpha=float(alpha),
        confidence=float(confidence),
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
    _check_confidence(confidence)
    _check_int("window", window)
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
