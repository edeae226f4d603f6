"""Kimi K2.5's Toggle (docs/methods.md K4, K5): token-efficient RL as a reward transform the trainer applies before the
advantages, off unless a run turns it on (`TrainConfig.toggle`).

Budget (K5): for each task, budget(x) = the ρ-th percentile of the lengths |y| (sampled tokens) of its correct
samples (task reward >= `correct_at`), computed once at the start of training and then fixed. `budget_from`
says from which rollouts: "prepass" rolls every training task out once with the initial policy before step 1 (the
source's "at the start of training"); "first_rollout" takes each task's first rolled-out group instead (no extra
pass: a departure, for datasets too large to roll out twice). A task with no correct sample has no budget, and
the transform never zeroes its samples.

Phases (K4): at step t (0-based) the phase is ⌊t/m⌋ mod 2. In phase 0 a sample keeps its reward when its group's
mean reward is below λ (the task is still hard: solve it first) or its length is within the task's budget, and
gets 0 otherwise; in phase 1 every reward is kept. The paper writes |y_i| inside the indicator; it is read as the
length of the response being scored (docs/methods.md K4). λ, m and ρ are not given by the source: the defaults are ours.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from workers.rl.config_sections import ToggleConfig
from workers.rl.rollout import Sample

__all__ = ["ToggleConfig", "apply_toggle", "phase", "task_budgets"]


def phase(step: int, m: int) -> int:
    """K4's phase at 0-based step `step`: ⌊t/m⌋ mod 2."""
    return (step // m) % 2


def task_budgets(samples: Sequence[Sample], *, rho: float, correct_at: float) -> dict[str, float]:
    """K5: each task's budget, the `rho`-th percentile (linear interpolation) of its correct samples' lengths;
    tasks without a correct sample are left out."""
    lengths: dict[str, list[int]] = {}
    for sample in samples:
        if sample.reward >= correct_at:
            lengths.setdefault(sample.task_id, []).append(sample.sampled_tokens)
    return {task: float(np.percentile(values, rho)) for task, values in lengths.items()}


def apply_toggle(
    samples: Sequence[Sample], group_size: int, *, step: int, config: ToggleConfig, budgets: Mapping[str, float]
) -> tuple[list[float], dict[str, float]]:
    """The rewards of `samples` (contiguous groups of `group_size`) after K4 at `step`, and metrics: the phase, the
    share of samples whose reward was zeroed, the share of tasks with a budget."""
    rewards = [s.reward for s in samples]
    current = phase(step, config.m)
    zeroed = 0
    if current == 0:
        for start in range(0, len(samples), group_size):
            group = samples[start : start + group_size]
            mean = math.fsum(s.reward for s in group) / max(len(group), 1)
            if mean < config.lambda_:
                continue  # docs/methods.md K4: (1/K) Σ r < λ keeps the reward
            for offset, sample in enumerate(group):
                budget = budgets.get(sample.task_id)
                if budget is None or sample.sampled_tokens <= budget:
                    continue  # within budget (or no budget known): kept
                if rewards[start + offset] != 0.0:
                    zeroed += 1
                rewards[start + offset] = 0.0
    tasks = {s.task_id for s in samples}
    metrics = {
        "toggle/phase": float(current),
        "toggle/zeroed_share": zeroed / max(len(samples), 1),
        "toggle/tasks_with_budget": sum(1 for t in tasks if t in budgets) / max(len(tasks), 1),
    }
    return rewards, metrics
