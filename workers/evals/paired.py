"""Paired comparisons of two models on the same tasks (`compare_paired`): per-task scores, per-slice statistics with
a bootstrap interval, the exact tests and Holm's adjustment across slices, and a decision per slice
(`workers.evals.stats` holds the tests themselves)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from workers.evals.stats import (
    SLICE_KINDS,
    SliceKind,
    bootstrap_means,
    check_boot,
    check_confidence,
    finite_array,
    holm_adjust,
    mcnemar_exact,
    percentile_ci,
    sign_test,
)

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
    check_confidence(confidence)
    check_boot(n_boot, seed)
    b = finite_array("before", before)
    a = finite_array("after", after)
    if a.size != b.size:
        raise ValueError(f"before and after must pair up one to one (got {b.size} and {a.size} values)")
    diffs = a - b
    mean_diff = math.fsum(diffs.tolist()) / diffs.size
    means = bootstrap_means(diffs, n_boot, seed)
    low, high = percentile_ci(means, confidence)
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
    # One function on purpose: pairing, the interval and the two tests read the same paired arrays; the steps follow
    # the docstring's order.
    if not (isinstance(alpha, int | float) and 0.0 < alpha < 1.0):
        raise ValueError(f"alpha must be strictly between 0 and 1 (got {alpha!r})")
    check_confidence(confidence)
    check_boot(n_boot, seed)
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
