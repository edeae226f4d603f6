"""Combine a `RewardSpec`'s terms into one scalar reward per trajectory (docs/methods.md X2).

    r_pre = Σ w·v over gain terms            (the reward before penalties)
    p     = Σ w·v over penalty terms
    r     = r_pre − p
    r     = max(r, floor)   if a floor is set and the trajectory completed without error
    r     = min(r, r_pre)   if cap_at_pre_penalty

With Context-1's terms this is X2's r = min(max(·, ε), r_pre). When the floor exceeds r_pre the cap wins, as
the min-outside-max order prescribes.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypedDict

from workers.rewards.schema import RewardSpec
from workers.trajectories import Trajectory


@dataclass(frozen=True)
class RewardResult:
    """The reward of one trajectory, in reward units.

    `terms` maps each term name to its unweighted value; `pre_penalty` is the weighted sum of gains (X2's
    r_pre) and `penalty` the weighted sum of penalty magnitudes that was subtracted. `dropped` is set when a term
    leaves the trajectory out (`_Term.drops`: a served session without feedback under `no_feedback="drop"`): it
    has no reward to train on, and its `reward` (computed as if the term were 0) belongs in no mean.
    """

    reward: float
    terms: dict[str, float]
    pre_penalty: float
    penalty: float
    dropped: bool = False


def combine_reward(spec: RewardSpec, gains: float, penalty: float, *, completed: bool) -> float:
    """The reward from the weighted gains and penalties (reward units), clamped as `spec` says: the floor for a
    trajectory that completed without error, then the cap at the gains (docs/methods.md X2)."""
    # docs/methods.md X2: r_pre − p_prune − p_turn (generalised to any weighted gains and penalties)
    raw = gains - penalty
    if spec.floor is not None and completed:
        # docs/methods.md X2: floor ε, only for trajectories that complete without error
        raw = max(raw, spec.floor)
    if spec.cap_at_pre_penalty:
        # docs/methods.md X2: upper clamp at r_pre
        raw = min(raw, gains)
    return raw


def score_trajectory(spec: RewardSpec, traj: Trajectory, *, step: int | None = None) -> RewardResult:
    """Score one trajectory with `spec`; returns the reward (reward units) and its parts. `step` (0-based, training
    only) scales the weights of annealed terms (`_Term.scale`: PARL's λ1, λ2); None leaves every weight as set."""
    values: dict[str, float] = {}
    gains = 0.0
    penalty = 0.0
    for term in spec.terms:
        value = term.value(traj)
        values[term.name] = value
        weight = term.weight * term.scale(step)
        if term.kind == "gain":
            gains += weight * value
        else:
            penalty += weight * value
    raw = combine_reward(spec, gains, penalty, completed=traj.error is None)
    dropped = any(term.drops(traj) for term in spec.terms)
    return RewardResult(reward=raw, terms=values, pre_penalty=gains, penalty=penalty, dropped=dropped)


def judgements_of(spec: RewardSpec, traj: Trajectory) -> dict[str, Any]:
    """The judgement of each judged term (`rubric_judge`) of `spec` on `traj`, by term name, as JSON: cached by the
    scoring that just ran, so this asks no model again. The rollout worker stores them with the record."""
    out: dict[str, Any] = {}
    for term in spec.terms:
        judgement = getattr(term, "judgement", None)
        if judgement is not None:
            out[term.name] = judgement(traj).to_json()
    return out


def annealed_weights(spec: RewardSpec, step: int) -> dict[str, float]:
    """The current weight of each annealed term at training step `step` (0-based), as run metrics
    `reward/lambda/<term name>`: PARL's λ1 and λ2 charted as they fall to 0."""
    return {
        f"reward/lambda/{term.name}": term.weight * term.scale(step)
        for term in spec.terms
        if getattr(term, "anneal", None) is not None
    }


def score_many(spec: RewardSpec, trajs: Iterable[Trajectory]) -> list[RewardResult]:
    """Score each trajectory with `spec`, in input order."""
    return [score_trajectory(spec, traj) for traj in trajs]


class Histogram(TypedDict):
    """`edges` has one more entry than `counts`; count i covers [edges[i], edges[i + 1])."""

    edges: list[float]
    counts: list[int]


def histogram(values: list[float], bins: int = 20) -> Histogram:
    """Equal-width histogram of `values` (any unit; edges share it).

    Returns {"edges": bins + 1 floats, "counts": bins ints}. Bins are half-open [a, b) except the last, which
    includes the maximum. Non-finite values are left out. With no finite values the edges span [0, 1] and
    every count is 0; when all values are equal the edges span value ± 0.5 so the bins keep a width.
    """
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        low, high = 0.0, 1.0
    else:
        low, high = min(finite), max(finite)
        if low == high:
            low, high = low - 0.5, high + 0.5
    width = (high - low) / bins
    edges = [low + i * width for i in range(bins)] + [high]
    counts = [0] * bins
    for v in finite:
        # Bisecting the stored edges (rather than dividing by the width) keeps each count consistent with the
        # edges that are reported, whatever the rounding.
        index = bisect.bisect_right(edges, v) - 1
        counts[min(max(index, 0), bins - 1)] += 1
    return {"edges": edges, "counts": counts}
