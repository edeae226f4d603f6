"""Group-relative advantages and DAPO's soft overlong penalty (docs/methods.md section 4: P1, P2, P3).

Rollouts arrive as one flat reward vector in which every prompt's completions sit next to each other: rewards
``[0, group_size)`` belong to the first prompt, ``[group_size, 2 * group_size)`` to the second, and so on. Each
completion's advantage is its reward minus its group's mean (the GRPO baseline); GRPO (P1) and GSPO (P5) also
divide by the group's standard deviation, Dr. GRPO (P2) does not.

A group whose rewards are all equal carries no learning signal (every advantage is 0). Here such groups are
marked in ``keep`` and counted; the learner skips them without changing how the rest is normalised (GRPO, Dr. GRPO
and GSPO still count them, as their papers average over the whole batch), and DAPO's dynamic sampling
(`workers.rl.sampling`) filters and refills before the learner. Which scale each algorithm uses is in
`workers.rl.algorithms`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

AdvantageScale = Literal["none", "group"]


@dataclass(frozen=True)
class AdvantageResult:
    """Advantages of one flat batch of rollouts.

    Attributes:
        advantages: float tensor ``[N]``, one advantage per completion, in reward units when ``scale="none"`` and
            dimensionless when ``scale="group"``. Exactly 0 for completions of a group whose rewards are all equal.
        keep: bool tensor ``[N]``; False for every completion of a dropped (all-equal) group.
        dropped_groups: how many of the ``num_groups`` groups were dropped.
        num_groups: ``N // group_size``.
        signal_groups: how many of the ``num_groups`` groups carry a signal (rewards not all equal), counted
            whether or not ``drop_equal_groups`` is on: the run's "share of groups with signal".
    """

    advantages: Tensor
    keep: Tensor
    dropped_groups: int
    num_groups: int
    signal_groups: int


def group_advantages(
    rewards: Tensor,
    group_size: int,
    *,
    scale: AdvantageScale = "none",
    drop_equal_groups: bool = True,
    eps: float = 1e-4,
) -> AdvantageResult:
    """Group-mean-baseline advantages over contiguous groups of ``group_size`` completions.

    Args:
        rewards: ``[N]`` scalar rewards, grouped contiguously (see the module docstring). Integer rewards are
            converted to the default float dtype; finite values only.
        group_size: completions per prompt (GRPO's G); at least 2, and must divide N.
        scale: ``"none"`` gives ``A_i = r_i - mean(r)`` (Dr. GRPO, P2); ``"group"`` gives
            ``A_i = (r_i - mean(r)) / (std(r) + eps)`` (GRPO, P1) where ``std`` is the sample standard deviation
            (Bessel's n-1 correction) and ``eps`` is added to it, as TRL 1.16 does. P1 writes a plain
            ``/ std(r)``; the ``eps`` only matters for groups whose rewards barely differ.
        drop_equal_groups: mark groups whose rewards are all exactly equal with ``keep=False`` and count them in
            ``dropped_groups``. Their advantages are 0 either way; when False, ``keep`` is all True.
        eps: added to the group std when ``scale="group"``; must be finite and >= 0.

    Returns:
        An `AdvantageResult` with tensors on the device of ``rewards``.

    Raises:
        ValueError: naming the argument, for a non-1-D or non-finite ``rewards``, a ``group_size`` below 2 or not
            dividing N, an unknown ``scale`` or a bad ``eps``.
    """
    # One function on purpose: argument checks, then the formula of each scaling mode on the same grouped tensor
    # (docs/methods.md).
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be a 1-D tensor [N], got shape {tuple(rewards.shape)}.")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2:
        raise ValueError(f"group_size must be an integer >= 2 (completions per prompt), got {group_size!r}.")
    num_rewards = rewards.shape[0]
    if num_rewards % group_size != 0:
        raise ValueError(
            f"group_size={group_size} does not divide the number of rewards N={num_rewards}: every prompt needs "
            f"exactly group_size completions, stored next to each other."
        )
    if scale not in ("none", "group"):
        raise ValueError(f"scale must be 'none' or 'group', got {scale!r}.")
    if not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}.")

    values = rewards if rewards.is_floating_point() else rewards.to(torch.get_default_dtype())
    values = values.detach()
    if not bool(torch.isfinite(values).all()):
        raise ValueError("rewards must all be finite; found NaN or inf (score unscorable rollouts before this).")

    num_groups = num_rewards // group_size
    grouped = values.view(num_groups, group_size)
    # docs/methods.md P1/P2: the group mean is the baseline.
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale == "group":
        # docs/methods.md P1: divide by the group std (n-1, + eps as in TRL).
        centred = centred / (grouped.std(dim=1, keepdim=True, correction=1) + eps)

    # docs/methods.md P3: a group that is all correct or all wrong has no signal. Compare exactly, and force those
    # advantages to exactly 0 (a float mean of equal values can be off by one ulp).
    constant = (grouped == grouped[:, :1]).all(dim=1)
    advantages = torch.where(constant.unsqueeze(1), torch.zeros_like(centred), centred).reshape(num_rewards)

    if drop_equal_groups:
        keep = (~constant).repeat_interleave(group_size)
        dropped = int(constant.sum().item())
    else:
        keep = torch.ones(num_rewards, dtype=torch.bool, device=values.device)
        dropped = 0
    return AdvantageResult(
        advantages=advantages,
        keep=keep,
        dropped_groups=dropped,
        num_groups=num_groups,
        signal_groups=num_groups - int(constant.sum().item()),
    )


def dapo_overlong_penalty(lengths: Tensor, max_len: int, cache_len: int) -> Tensor:
    """DAPO's soft overlong penalty R_length (docs/methods.md P3, eq. 13), to be added to the task reward. The learner
    adds it for ``dapo`` runs (`EffectiveSettings.overlong_penalty`) with |y| the episode's sampled tokens and L_max
    the most the policy can sample in one episode.

    Args:
        lengths: completion lengths |y| in tokens, any shape (typically ``[N]``), integer or float.
        max_len: L_max, the generation limit in tokens (>= 1).
        cache_len: L_cache, the width of the soft band in tokens (1 <= cache_len <= max_len).

    Returns:
        A float tensor shaped like ``lengths`` with values in [-1, 0]: 0 up to ``max_len - cache_len`` tokens,
        falling linearly to -1 at ``max_len``, and -1 beyond it.

    Raises:
        ValueError: naming the argument, for a bad ``max_len`` or ``cache_len``.
    """
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len must be an integer >= 1 (L_max in tokens), got {max_len!r}.")
    if isinstance(cache_len, bool) or not isinstance(cache_len, int) or not 1 <= cache_len <= max_len:
        raise ValueError(
            f"cache_len must be an integer in [1, max_len={max_len}] (L_cache in tokens), got {cache_len!r}."
        )

    length = lengths if lengths.is_floating_point() else lengths.to(torch.get_default_dtype())
    soft_start = max_len - cache_len
    # docs/methods.md P3 eq. 13, middle case: ((L_max - L_cache) - |y|) / L_cache. It is 0 at the start of the band,
    # -1 at L_max and below -1 past it, so clamping to [-1, 0] gives the two outer cases.
    return ((soft_start - length) / cache_len).clamp(min=-1.0, max=0.0)
