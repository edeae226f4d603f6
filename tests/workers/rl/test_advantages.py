"""Group advantages and DAPO's overlong penalty (docs/methods.md P1, P2, P3), against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from workers.rl.advantages import dapo_overlong_penalty, group_advantages


def test_advantages_are_rewards_minus_their_group_mean() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 0.0, 0.0, 1.0], dtype=torch.float64)

    result = group_advantages(rewards, group_size=4)

    # group 1: mean 0.5; group 2: mean 1.0
    expected = [0.5, -0.5, -0.5, 0.5, 2.0, -1.0, -1.0, 0.0]
    assert result.advantages.tolist() == pytest.approx(expected, abs=1e-12)
    assert result.keep.tolist() == [True] * 8
    assert (result.num_groups, result.dropped_groups) == (2, 0)


def test_group_scaling_divides_by_the_sample_std_plus_eps() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 2.0, 4.0, 6.0], dtype=torch.float64)

    result = group_advantages(rewards, group_size=3, scale="group", eps=1e-4)

    # group 1: mean 1/3, deviations (2/3, -1/3, -1/3), n-1 variance (4/9 + 1/9 + 1/9) / 2 = 1/3
    std1 = math.sqrt(1 / 3)
    # group 2: mean 4, deviations (-2, 0, 2), n-1 variance 8 / 2 = 4
    std2 = 2.0
    expected = [
        (2 / 3) / (std1 + 1e-4),
        (-1 / 3) / (std1 + 1e-4),
        (-1 / 3) / (std1 + 1e-4),
        -2 / (std2 + 1e-4),
        0.0,
        2 / (std2 + 1e-4),
    ]
    assert result.advantages.tolist() == pytest.approx(expected, rel=1e-12)


def test_groups_whose_rewards_are_all_equal_are_dropped_and_counted() -> None:
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, -1.0, -1.0])

    result = group_advantages(rewards, group_size=2)

    assert result.keep.tolist() == [False, False, True, True, False, False, False, False]
    assert (result.num_groups, result.dropped_groups, result.signal_groups) == (4, 3, 1)
    assert result.advantages.tolist() == [0.0, 0.0, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0]


def test_equal_groups_are_kept_when_dropping_is_turned_off() -> None:
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0])

    result = group_advantages(rewards, group_size=2, drop_equal_groups=False)

    assert result.keep.tolist() == [True, True, True, True]
    assert result.dropped_groups == 0
    assert result.signal_groups == 1  # counted whether or not equal groups are dropped
    assert result.advantages.tolist() == [0.0, 0.0, -0.5, 0.5]


def test_an_equal_group_gets_exactly_zero_advantage_even_when_its_float_mean_rounds() -> None:
    # In float64, (0.1 + 0.1 + 0.1) / 3 is 0.10000000000000002, so a plain r - mean is off by an ulp.
    assert (0.1 + 0.1 + 0.1) / 3 != 0.1
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.0, 0.2, 0.1], dtype=torch.float64)

    result = group_advantages(rewards, group_size=3, scale="group")

    assert result.advantages[:3].tolist() == [0.0, 0.0, 0.0]
    assert result.dropped_groups == 1


def test_integer_rewards_become_float_advantages() -> None:
    result = group_advantages(torch.tensor([1, 0, 0, 0]), group_size=4)

    assert result.advantages.is_floating_point()
    assert result.advantages.tolist() == [0.75, -0.25, -0.25, -0.25]


def test_it_rejects_a_batch_that_group_size_does_not_divide() -> None:
    with pytest.raises(ValueError, match=r"group_size=4 does not divide .* N=6"):
        group_advantages(torch.zeros(6), group_size=4)


@pytest.mark.parametrize("group_size", [0, 1, 2.0, True])
def test_it_rejects_a_group_size_below_two_or_not_an_integer(group_size: object) -> None:
    with pytest.raises(ValueError, match="group_size must be an integer >= 2"):
        group_advantages(torch.zeros(4), group_size=group_size)  # type: ignore[arg-type]


def test_it_rejects_rewards_that_are_not_one_dimensional() -> None:
    with pytest.raises(ValueError, match=r"rewards must be a 1-D tensor \[N\], got shape \(2, 2\)"):
        group_advantages(torch.zeros(2, 2), group_size=2)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_it_rejects_rewards_that_are_not_finite(bad: float) -> None:
    with pytest.raises(ValueError, match="rewards must all be finite"):
        group_advantages(torch.tensor([0.0, bad]), group_size=2)


def test_it_rejects_an_unknown_scale() -> None:
    with pytest.raises(ValueError, match="scale must be 'none' or 'group'"):
        group_advantages(torch.zeros(2), group_size=2, scale="batch")  # type: ignore[arg-type]


@pytest.mark.parametrize("eps", [-1e-4, math.nan])
def test_it_rejects_a_negative_or_nan_eps(eps: float) -> None:
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        group_advantages(torch.zeros(2), group_size=2, scale="group", eps=eps)


def test_the_overlong_penalty_is_zero_then_linear_then_minus_one() -> None:
    # L_max = 10, L_cache = 4: the soft band is (6, 10].
    lengths = torch.tensor([0, 5, 6, 7, 9, 10, 11, 50])

    penalty = dapo_overlong_penalty(lengths, max_len=10, cache_len=4)

    expected = [0.0, 0.0, 0.0, (6 - 7) / 4, (6 - 9) / 4, -1.0, -1.0, -1.0]
    assert penalty.tolist() == pytest.approx(expected, abs=1e-7)
    assert penalty.is_floating_point()


def test_the_overlong_penalty_at_the_boundaries_of_eq_13() -> None:
    # L_max = 20, L_cache = 5: 0 at |y| = L_max − L_cache = 15, −1/5 one token later, −1 at L_max and beyond.
    penalty = dapo_overlong_penalty(torch.tensor([15, 16, 19, 20, 21]), max_len=20, cache_len=5)
    assert penalty.tolist() == pytest.approx([0.0, -0.2, -0.8, -1.0, -1.0], abs=1e-7)
    # A band as wide as L_max starts at 0 tokens: only the empty completion goes unpenalised.
    wide = dapo_overlong_penalty(torch.tensor([0, 1, 4]), max_len=4, cache_len=4)
    assert wide.tolist() == pytest.approx([0.0, -0.25, -1.0], abs=1e-7)


def test_the_overlong_penalty_keeps_the_shape_of_its_input() -> None:
    penalty = dapo_overlong_penalty(torch.tensor([[8.0, 12.0], [1.0, 9.0]]), max_len=12, cache_len=4)

    assert penalty.shape == (2, 2)
    assert penalty.tolist() == [[0.0, -1.0], [0.0, -0.25]]


@pytest.mark.parametrize(
    ("max_len", "cache_len", "field"),
    [(0, 1, "max_len"), (10, 0, "cache_len"), (10, 11, "cache_len"), (10, 2.5, "cache_len")],
)
def test_the_overlong_penalty_rejects_bad_lengths(max_len: int, cache_len: int, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field} must be"):
        dapo_overlong_penalty(torch.tensor([1]), max_len=max_len, cache_len=cache_len)
