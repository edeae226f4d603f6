"""The "did it learn?" statistics (workers.evals.stats): the reward's least-squares trend with its t interval, the
paired eval verdict and the share of groups with signal, against values computed by hand."""

from __future__ import annotations

import math

import pytest

from workers.evals.learned import eval_verdict, linear_trend, signal_share

# Student's t quantiles t_{0.975, df} from a printed table.
T975 = {2: 4.302652729911275, 3: 3.182446305284263}


def test_linear_trend_matches_a_hand_computed_fit_whose_interval_contains_zero() -> None:
    # mean x = 1.5, Sxx = 5, Sxy = 4.5: slope 0.9, intercept 0.9; residuals 0.1, 0.2, -0.7, 0.4: SSE = 0.7.
    trend = linear_trend([0, 1, 2, 3], [1, 2, 2, 4], window=2)
    assert trend is not None
    half = T975[2] * math.sqrt(0.7 / 2 / 5)
    assert trend.slope == pytest.approx(0.9)
    assert (trend.ci_low, trend.ci_high) == pytest.approx((0.9 - half, 0.9 + half))
    assert trend.verdict == "flat"  # [-0.24, 2.04] contains 0: four noisy points cannot tell
    assert (trend.start, trend.end) == pytest.approx((0.9, 3.6))
    assert (trend.first_mean, trend.last_mean, trend.window, trend.n) == pytest.approx((1.5, 3.0, 2, 4))


def test_linear_trend_calls_a_steady_rise_improving() -> None:
    # mean x = 20, Sxx = 1000, Sxy = 98: slope 0.098 per step; SSE = 0.036 on 3 degrees of freedom.
    trend = linear_trend([0, 10, 20, 30, 40], [0, 1.1, 1.9, 3.1, 3.9])
    assert trend is not None
    half = T975[3] * math.sqrt(0.036 / 3 / 1000)
    assert trend.slope == pytest.approx(0.098)
    assert (trend.ci_low, trend.ci_high) == pytest.approx((0.098 - half, 0.098 + half))
    assert trend.verdict == "improving" and trend.ci_low > 0
    falling = linear_trend([0, 10, 20, 30, 40], [-v for v in (0, 1.1, 1.9, 3.1, 3.9)])
    assert falling is not None and falling.verdict == "worsening"
    # The default window of 10 shrinks to half the points (2 of 5) so the first and last windows never overlap.
    assert (trend.window, trend.first_mean, trend.last_mean) == pytest.approx((2, 0.55, 3.5))


def test_linear_trend_perfect_fit_and_too_little_data() -> None:
    exact = linear_trend([1, 2, 3], [0.5, 0.25, 0.0])
    assert exact is not None and exact.verdict == "worsening" and exact.ci_low == exact.ci_high == -0.25
    assert linear_trend([1, 2], [0, 1]) is None  # no degree of freedom left for the error
    assert linear_trend([5, 5, 5], [0, 1, 2]) is None  # every x equal: no slope


@pytest.mark.parametrize(
    "x, y, kwargs, message",
    [
        ([0, 1, 2], [0, 1], {}, "same length"),
        ([0, 1, float("nan")], [0, 1, 2], {}, "finite"),
        ([0, 1, 2], [0, 1, 2], {"confidence": 1.0}, "confidence"),
        ([0, 1, 2], [0, 1, 2], {"window": 0}, "window"),
    ],
)
def test_linear_trend_rejects_bad_input(x: list[float], y: list[float], kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        linear_trend(x, y, **kwargs)  # type: ignore[arg-type]


def test_eval_verdict() -> None:
    assert eval_verdict(0.13, 0.003) == "better"
    assert eval_verdict(-0.13, 0.003) == "worse"
    assert eval_verdict(0.13, 0.2) == "no_difference"
    assert eval_verdict(0.0, 0.0) == "no_difference"
    assert eval_verdict(0.13, 0.04, alpha=0.01) == "no_difference"
    with pytest.raises(ValueError, match="alpha"):
        eval_verdict(0.1, 0.01, alpha=0)
    with pytest.raises(ValueError, match="p_two_sided"):
        eval_verdict(0.1, 1.5)


def test_signal_share_weights_steps_by_their_groups() -> None:
    # Steps of 4 and 12 groups with 1 and 9 with signal: 10 / 16, not the mean of 25% and 75%.
    assert signal_share([4, 12], [1, 9]) == pytest.approx(10 / 16)
    assert signal_share([], []) is None and signal_share([0, 0], [0, 0]) is None
    with pytest.raises(ValueError, match="exceed"):
        signal_share([4], [5])
    with pytest.raises(ValueError, match="pair up"):
        signal_share([4], [])
