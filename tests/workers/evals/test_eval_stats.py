"""Eval statistics (workers.evals.stats), checked against independent oracles: brute-force enumeration for pass@k,
scipy.stats.binomtest for the exact tests, closed-form Wilson bounds and coverage on synthetic data."""

from __future__ import annotations

import itertools
import json
import math
import re
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import binomtest

from workers.evals.paired import Comparison, TaskScore, compare_paired, paired_bootstrap
from workers.evals.stats import (
    bootstrap_mean_ci,
    holm_adjust,
    mcnemar_exact,
    mean_pass_at_k,
    pass_at_k,
    sign_test,
    wilson_interval,
)

Z95 = 1.959963984540054  # the 97.5th percentile of the standard normal


def _binary_pairs(
    pairs: list[tuple[int, int]], *, tags: tuple[str, ...] = (), difficulty: str = "", prefix: str = "t"
) -> tuple[dict[str, TaskScore], dict[str, TaskScore]]:
    """(before, after) TaskScore dicts from (before_score, after_score) pairs."""
    before = {f"{prefix}{i}": TaskScore(b, tags=tags, difficulty=difficulty) for i, (b, _) in enumerate(pairs)}
    after = {f"{prefix}{i}": TaskScore(a, tags=tags, difficulty=difficulty) for i, (_, a) in enumerate(pairs)}
    return before, after


def _pairs(worse: int, improved: int, same_pass: int = 0, same_fail: int = 0) -> list[tuple[int, int]]:
    return [(1, 0)] * worse + [(0, 1)] * improved + [(1, 1)] * same_pass + [(0, 0)] * same_fail


# --- pass@k --------------------------------------------------------------------------------------------------------


def _brute_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """Share of all k-subsets of the n samples (c of them passing) that contain at least one pass."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    hits = sum(1 for subset in subsets if any(samples[i] for i in subset))
    return Fraction(hits, len(subsets))


def test_pass_at_k_matches_brute_force_enumeration() -> None:
    for n in range(1, 9):
        for c in range(0, n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(float(_brute_pass_at_k(n, c, k)), abs=1e-12), (n, c, k)


def test_pass_at_k_matches_exact_binomial_ratio_for_large_n() -> None:
    # The stable product form against exact rational arithmetic where the coefficients are huge.
    for n, c, k in [(200, 13, 10), (200, 1, 1), (1000, 7, 100), (500, 250, 50)]:
        exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
        assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)


def test_pass_at_k_special_cases() -> None:
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is c/n
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 6, 5) == 1.0  # only 4 failures: every 5-subset holds a pass
    assert pass_at_k(5, 5, 5) == 1.0


@pytest.mark.parametrize(
    ("n", "c", "k", "needle"),
    [
        (5, 2, 6, "k must not exceed"),
        (5, 6, 1, "c (passing samples) must not exceed n"),
        (-1, 0, 1, "n must be non-negative"),
        (5, -1, 1, "c must be non-negative"),
        (5, 1, -2, "k must be non-negative"),
        (5, 1, 0, "k must be at least 1"),
        (0, 0, 1, "k must not exceed"),
    ],
)
def test_pass_at_k_rejects_bad_counts(n: int, c: int, k: int, needle: str) -> None:
    with pytest.raises(ValueError, match=re.escape(needle)):
        pass_at_k(n, c, k)


def test_mean_pass_at_k() -> None:
    counts = [(10, 3), (10, 0), (10, 10)]
    assert mean_pass_at_k(counts, 1) == pytest.approx((0.3 + 0.0 + 1.0) / 3)
    expected = sum(pass_at_k(n, c, 5) for n, c in counts) / 3
    assert mean_pass_at_k(counts, 5) == pytest.approx(expected)
    with pytest.raises(ValueError, match="counts is empty"):
        mean_pass_at_k([], 1)
    with pytest.raises(ValueError, match=re.escape("counts[1]: k must not exceed")):
        mean_pass_at_k([(10, 3), (2, 1)], 5)


# --- intervals -----------------------------------------------------------------------------------------------------


def test_wilson_interval_hand_computed_values() -> None:
    z2 = Z95 * Z95
    # With 0 successes the interval is [0, z^2 / (n + z^2)]; with n successes [n / (n + z^2), 1].
    low, high = wilson_interval(0, 10)
    assert low == 0.0
    assert high == pytest.approx(z2 / (10 + z2), abs=1e-12)  # 0.27753...
    low, high = wilson_interval(10, 10)
    assert low == pytest.approx(10 / (10 + z2), abs=1e-12)  # 0.72247...
    assert high == 1.0
    # 50/100 is centred at 0.5: half-width z/(1 + z^2/n) * sqrt(0.25/n + z^2/(4n^2)) = 0.09617.
    low, high = wilson_interval(50, 100)
    assert (round(low, 4), round(high, 4)) == (0.4038, 0.5962)
    # 1/3, worked out by hand: centre (1/3 + z^2/6) / (1 + z^2/3), half-width z/(1+z^2/3)*sqrt(2/27 + z^2/36).
    centre = (1 / 3 + z2 / 6) / (1 + z2 / 3)
    half = Z95 / (1 + z2 / 3) * math.sqrt(2 / 27 + z2 / 36)
    assert wilson_interval(1, 3) == pytest.approx((centre - half, centre + half), abs=1e-12)
    assert (round(centre - half, 4), round(centre + half, 4)) == (0.0615, 0.7923)


def test_wilson_interval_properties_and_errors() -> None:
    narrow = wilson_interval(30, 100, confidence=0.9)
    wide = wilson_interval(30, 100, confidence=0.99)
    assert wide[0] < narrow[0] < 0.3 < narrow[1] < wide[1]
    with pytest.raises(ValueError, match="n must be positive"):
        wilson_interval(0, 0)
    with pytest.raises(ValueError, match="successes must not exceed n"):
        wilson_interval(11, 10)
    with pytest.raises(ValueError, match="confidence must be strictly between 0 and 1"):
        wilson_interval(1, 10, confidence=95)


def test_bootstrap_mean_ci() -> None:
    rng = np.random.default_rng(1)
    values = rng.normal(0.5, 0.1, size=300).tolist()
    low, high = bootstrap_mean_ci(values, n_boot=4000, seed=3)
    mean = float(np.mean(values))
    assert low < mean < high
    # Close to the normal-theory interval mean +- 1.96 * sd / sqrt(n).
    se = float(np.std(values, ddof=1)) / math.sqrt(len(values))
    assert low == pytest.approx(mean - Z95 * se, abs=0.25 * se)
    assert high == pytest.approx(mean + Z95 * se, abs=0.25 * se)
    assert bootstrap_mean_ci(values, n_boot=4000, seed=3) == (low, high)  # reproducible
    assert bootstrap_mean_ci([0.25, 0.25, 0.25]) == (0.25, 0.25)
    with pytest.raises(ValueError, match="values is empty"):
        bootstrap_mean_ci([])
    with pytest.raises(ValueError, match="NaN or infinite"):
        bootstrap_mean_ci([0.1, float("nan")])
    with pytest.raises(ValueError, match="n_boot must be at least 1"):
        bootstrap_mean_ci([0.1], n_boot=0)


# --- exact tests ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alternative", ["two-sided", "less", "greater"])
def test_mcnemar_exact_matches_scipy_binomtest(alternative: str) -> None:
    for b in range(0, 26):
        for c in range(0, 26):
            if b + c == 0:
                assert mcnemar_exact(b, c, alternative) == 1.0  # type: ignore[arg-type]
                continue
            oracle = binomtest(b, b + c, 0.5, alternative=alternative).pvalue
            assert mcnemar_exact(b, c, alternative) == pytest.approx(oracle, rel=1e-9), (b, c)  # type: ignore[arg-type]


def test_mcnemar_exact_large_and_tiny_tails() -> None:
    assert mcnemar_exact(100, 0, "greater") == pytest.approx(2.0**-100, rel=1e-12)  # no 1 - (1 - eps) cancellation
    assert mcnemar_exact(100, 0) == pytest.approx(2.0**-99, rel=1e-12)
    assert mcnemar_exact(700, 640) == pytest.approx(binomtest(700, 1340, 0.5).pvalue, rel=1e-9)
    with pytest.raises(ValueError, match="alternative must be one of"):
        mcnemar_exact(1, 2, "worse")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="b must be non-negative"):
        mcnemar_exact(-1, 2)


@pytest.mark.parametrize("alternative", ["two-sided", "less", "greater"])
def test_sign_test_matches_scipy_binomtest(alternative: str) -> None:
    rng = np.random.default_rng(7)
    for _ in range(50):
        size = int(rng.integers(1, 40))
        diffs = np.round(rng.normal(-0.05, 0.2, size=size), 1).tolist()  # rounding makes some exact zeros
        positive = sum(1 for d in diffs if d > 0)
        nonzero = sum(1 for d in diffs if d != 0)
        oracle = binomtest(positive, nonzero, 0.5, alternative=alternative).pvalue if nonzero else 1.0
        assert sign_test(diffs, alternative) == pytest.approx(oracle, rel=1e-9)  # type: ignore[arg-type]


def test_sign_test_ignores_zero_differences() -> None:
    assert sign_test([0.0, 0.0, 0.0]) == 1.0
    assert sign_test([0.0] * 50 + [-0.5] * 6, "less") == pytest.approx(2.0**-6)
    with pytest.raises(ValueError, match="diffs is empty"):
        sign_test([])


def test_holm_adjust_by_hand() -> None:
    # Sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04, raised to the running 0.06).
    # Step-down at alpha = 0.05: 0.005 < 0.05/4, 0.01 < 0.05/3, 0.03 >= 0.05/2 -> stop: exactly two rejections.
    adjusted = holm_adjust([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [p < 0.05 for p in adjusted] == [True, False, False, True]
    assert holm_adjust([0.6, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm_adjust([]) == []


# --- paired bootstrap ----------------------------------------------------------------------------------------------


def test_paired_bootstrap_ci_covers_the_true_difference() -> None:
    # Synthetic benchmark: each task has its own difficulty; the candidate's pass probability is 0.1 lower on
    # every task, so the true mean difference is -0.1. A 95% interval should cover it in most replications.
    rng = np.random.default_rng(11)
    replications, covered = 60, 0
    for rep in range(replications):
        p_before = rng.uniform(0.3, 0.9, size=300)
        before = (rng.random(300) < p_before).astype(float)
        after = (rng.random(300) < p_before - 0.1).astype(float)
        mean_diff, low, high, _ = paired_bootstrap(before.tolist(), after.tolist(), n_boot=2000, seed=rep)
        assert low <= mean_diff <= high
        covered += low <= -0.1 <= high
    assert covered / replications >= 0.85


def test_paired_bootstrap_reproducible_and_one_sided_p() -> None:
    before = [1.0] * 40 + [0.0] * 10
    after = [0.0] * 15 + [1.0] * 25 + [0.0] * 10
    first = paired_bootstrap(before, after, n_boot=3000, seed=5)
    assert paired_bootstrap(before, after, n_boot=3000, seed=5) == first
    mean_diff, low, high, p_worse = first
    assert mean_diff == pytest.approx(-15 / 50)
    assert high < 0
    assert p_worse == pytest.approx(1 / 3001)  # no resample reached 0: the +1-corrected floor
    _, _, _, p_better = paired_bootstrap(after, before, n_boot=3000, seed=5)
    assert p_better == 1.0
    assert paired_bootstrap([0.5, 0.5], [0.5, 0.5]) == (0.0, 0.0, 0.0, 1.0)


def test_paired_bootstrap_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="must pair up one to one"):
        paired_bootstrap([1.0, 0.0], [1.0])
    with pytest.raises(ValueError, match="before is empty"):
        paired_bootstrap([], [])
    with pytest.raises(ValueError, match="confidence must be strictly between 0 and 1"):
        paired_bootstrap([1.0], [1.0], confidence=1.0)


# --- compare_paired ------------------------------------------------------------------------------------------------


def test_compare_paired_detects_a_known_regression() -> None:
    before, after = _binary_pairs(_pairs(worse=20, improved=2, same_pass=60, same_fail=18))
    result = compare_paired(before, after, n_boot=2000)
    o = result.overall
    assert result.binary and o.test == "mcnemar_exact"
    assert (o.n, o.worse, o.improved) == (100, 20, 2)
    assert o.before_mean == pytest.approx(0.8) and o.after_mean == pytest.approx(0.62)
    assert o.diff == pytest.approx(-0.18)
    assert o.ci_low < -0.18 < o.ci_high < 0
    assert o.p_worse == pytest.approx(binomtest(20, 22, 0.5, alternative="greater").pvalue, rel=1e-9)
    assert o.p_two_sided == pytest.approx(binomtest(20, 22, 0.5).pvalue, rel=1e-9)
    assert o.significant_regression and result.significant_regression
    assert result.slices == []


def test_compare_paired_no_change_is_not_flagged() -> None:
    before, after = _binary_pairs(_pairs(worse=0, improved=0, same_pass=50, same_fail=50))
    o = compare_paired(before, after, n_boot=500).overall
    assert (o.diff, o.ci_low, o.ci_high, o.p_worse, o.p_two_sided) == (0.0, 0.0, 0.0, 1.0, 1.0)
    assert not o.significant_regression
    # A small dip that chance explains is not flagged either.
    before, after = _binary_pairs(_pairs(worse=4, improved=2, same_pass=50, same_fail=44))
    o = compare_paired(before, after, n_boot=500).overall
    assert o.diff < 0 and o.p_worse > 0.05 and not o.significant_regression


def test_compare_paired_improvement_is_not_a_regression() -> None:
    before, after = _binary_pairs(_pairs(worse=1, improved=30, same_pass=20))
    o = compare_paired(before, after, n_boot=500).overall
    assert o.diff > 0 and o.p_two_sided < 1e-6 and o.p_worse > 0.99 and not o.significant_regression


def test_compare_paired_fractional_scores_use_the_sign_test() -> None:
    rng = np.random.default_rng(3)
    b_scores = rng.integers(0, 11, size=60) / 10  # fraction of 10 samples that passed
    a_scores = np.clip(b_scores - rng.integers(0, 3, size=60) / 10, 0, 1)
    before = {f"t{i}": TaskScore(float(s)) for i, s in enumerate(b_scores)}
    after = {f"t{i}": TaskScore(float(s)) for i, s in enumerate(a_scores)}
    result = compare_paired(before, after, n_boot=1000)
    o = result.overall
    assert not result.binary and o.test == "sign_test"
    diffs = a_scores - b_scores
    pos, neg = int((diffs > 0).sum()), int((diffs < 0).sum())
    assert (o.improved, o.worse) == (pos, neg)
    assert o.p_worse == pytest.approx(binomtest(pos, pos + neg, 0.5, alternative="less").pvalue, rel=1e-9)
    assert o.diff == pytest.approx(float(diffs.mean()))
    assert o.significant_regression


def test_compare_paired_flags_a_regression_confined_to_one_tag() -> None:
    # math: 15 of 40 tasks newly fail. code: 8 of 60 newly pass. Overall 15 vs 8 discordant is not significant
    # (p ~ 0.1), but the math slice is, even after Holm over the two tag slices.
    math_b, math_a = _binary_pairs(_pairs(worse=15, improved=0, same_pass=25), tags=("math",), prefix="m")
    code_b, code_a = _binary_pairs(_pairs(worse=0, improved=8, same_pass=40, same_fail=12), tags=("code",), prefix="c")
    result = compare_paired({**math_b, **code_b}, {**math_a, **code_a}, slice_by=["tag"], n_boot=1000)
    assert not result.overall.significant_regression
    assert result.overall.p_worse == pytest.approx(binomtest(15, 23, 0.5, alternative="greater").pvalue)
    by_name = {s.slice: s for s in result.slices}
    assert list(by_name) == ["tag:code", "tag:math"]
    math_slice, code_slice = by_name["tag:math"], by_name["tag:code"]
    assert (math_slice.n, math_slice.worse, math_slice.improved) == (40, 15, 0)
    assert math_slice.diff == pytest.approx(-15 / 40)
    assert math_slice.p_worse == pytest.approx(2.0**-15)
    assert math_slice.p_worse_adjusted == pytest.approx(2 * 2.0**-15)
    assert math_slice.significant_regression
    assert code_slice.n == 60 and code_slice.diff == pytest.approx(8 / 60)
    assert not code_slice.significant_regression
    assert result.significant_regression


def test_compare_paired_holm_correction_by_hand() -> None:
    # Three difficulty slices with only regressions: one-sided McNemar p = 2^-b.
    #   easy b=6: p = 0.015625, medium b=5: p = 0.03125, hard b=4: p = 0.0625.
    # Holm with m=3: 0.015625*3 = 0.046875 (< 0.05, reject); 0.03125*2 = 0.0625 (stop); hard: max(0.0625, 0.0625).
    # Unadjusted, medium (0.031) would have been flagged too.
    before: dict[str, TaskScore] = {}
    after: dict[str, TaskScore] = {}
    for level, worse in (("easy", 6), ("medium", 5), ("hard", 4)):
        b, a = _binary_pairs(_pairs(worse=worse, improved=0, same_pass=10), difficulty=level, prefix=level)
        before.update(b)
        after.update(a)
    result = compare_paired(before, after, slice_by=["difficulty"], n_boot=500)
    rows = {s.slice: s for s in result.slices}
    assert list(rows) == ["difficulty:easy", "difficulty:hard", "difficulty:medium"]
    assert rows["difficulty:easy"].p_worse == pytest.approx(0.015625)
    assert rows["difficulty:medium"].p_worse == pytest.approx(0.03125)
    assert rows["difficulty:hard"].p_worse == pytest.approx(0.0625)
    assert rows["difficulty:easy"].p_worse_adjusted == pytest.approx(0.046875)
    assert rows["difficulty:medium"].p_worse_adjusted == pytest.approx(0.0625)
    assert rows["difficulty:hard"].p_worse_adjusted == pytest.approx(0.0625)
    assert [rows[f"difficulty:{d}"].significant_regression for d in ("easy", "medium", "hard")] == [True, False, False]
    # The overall row is tested on its own: 15 regressions, none improved.
    assert result.overall.p_worse == result.overall.p_worse_adjusted == pytest.approx(2.0**-15)
    assert result.overall.significant_regression


def test_compare_paired_slice_membership_and_pairing() -> None:
    before = {
        "a": TaskScore(1.0, tags=("x", "y"), source="s1"),
        "b": TaskScore(0.0, tags=("y",), difficulty="hard"),
        "c": TaskScore(1.0, tags=("x",)),
        "only_before": TaskScore(1.0),
    }
    after = {
        "a": TaskScore(0.0),  # no metadata on the candidate side: falls back to the baseline's
        "b": TaskScore(1.0, tags=("z",), difficulty="hard"),  # the candidate's tags win
        "c": TaskScore(1.0, tags=("x", "x")),  # a repeated tag counts once
        "only_after_1": TaskScore(0.0),
        "only_after_2": TaskScore(0.0),
    }
    result = compare_paired(before, after, slice_by=["tag", "difficulty", "source", "tag"], n_boot=200)
    assert (result.unpaired_before, result.unpaired_after) == (1, 2)
    assert result.overall.n == 3
    sizes = {s.slice: s.n for s in result.slices}
    assert sizes == {"tag:x": 2, "tag:y": 1, "tag:z": 1, "difficulty:hard": 1, "source:s1": 1}
    assert [s.slice for s in result.slices] == ["tag:x", "tag:y", "tag:z", "difficulty:hard", "source:s1"]


def test_compare_paired_to_dict_is_json_ready_and_reproducible() -> None:
    before, after = _binary_pairs(_pairs(worse=5, improved=1, same_pass=10), tags=("t",))
    first = compare_paired(before, after, slice_by=["tag"], n_boot=500)
    second = compare_paired(before, after, slice_by=["tag"], n_boot=500)
    assert isinstance(first, Comparison) and first == second
    data = json.loads(json.dumps(first.to_dict(), allow_nan=False))
    assert data["overall"]["slice"] == "overall"
    assert data["slices"][0]["slice"] == "tag:t"
    assert set(data) >= {"overall", "slices", "binary", "unpaired_before", "unpaired_after", "significant_regression"}
    assert set(data["overall"]) >= {
        "n", "before_mean", "after_mean", "diff", "ci_low", "ci_high", "improved", "worse", "test",
        "p_two_sided", "p_worse", "significant_regression",
    }  # fmt: skip


def test_compare_paired_rejects_bad_input() -> None:
    one = {"t": TaskScore(1.0)}
    with pytest.raises(ValueError, match="before has no task scores"):
        compare_paired({}, one)
    with pytest.raises(ValueError, match="after has no task scores"):
        compare_paired(one, {})
    with pytest.raises(ValueError, match="share no task ids"):
        compare_paired(one, {"u": TaskScore(1.0)})
    with pytest.raises(ValueError, match=re.escape("slice_by: unknown slice kind 'language'")):
        compare_paired(one, one, slice_by=["language"])
    with pytest.raises(ValueError, match="alpha must be strictly between 0 and 1"):
        compare_paired(one, one, alpha=0.0)
    with pytest.raises(ValueError, match=re.escape("after['t'] must be a TaskScore (got float)")):
        compare_paired(one, {"t": 1.0})  # type: ignore[dict-item]


@pytest.mark.parametrize("score", [1.5, -0.1, float("nan"), float("inf")])
def test_task_score_outside_unit_interval_is_rejected(score: float) -> None:
    with pytest.raises(ValueError, match=re.escape("TaskScore.score must be in [0, 1]")):
        TaskScore(score)


def test_task_score_rejects_non_numbers_and_string_tags() -> None:
    with pytest.raises(ValueError, match="must be a number"):
        TaskScore("1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tags must be a tuple of strings, not a string"):
        TaskScore(1.0, tags="math")  # type: ignore[arg-type]
