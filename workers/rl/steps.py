"""What one training step draws and shows, apart from the `Trainer` that runs the steps: its prompts (the seeded
data order, or a weighted draw of the hard-data upsampler or the curriculum), its F-beta (X3), Toggle's budgets
and rewards (K4, K5), the advantages shown on the run page and the trajectory summaries the run stores; and what a
training run hands the trainer (`TrainJob`)."""

from __future__ import annotations

import dataclasses
import json
import random
from typing import Any, Protocol

import ray
import torch

from workers.reporting import Reporter
from workers.rl.advantages import group_advantages
from workers.rl.config import TrainConfig
from workers.rl.rollout import Sample
from workers.rl.sampling import Curriculum, HardUpsampler
from workers.rl.toggle import apply_toggle, task_budgets
from workers.storage import read_bytes, write_bytes

UPSAMPLE_STATE_SUFFIX = ".sampling.json"
"""Beside a checkpoint: the hard-data upsampler's per-task needs at that step (JSON), read back on resume."""


def data_order(num_rows: int, seed: int, step: int, per_step: int) -> list[int]:
    """Row indices for `step`: epochs of a seeded permutation, so a resumed run continues the same order."""
    out: list[int] = []
    position = step * per_step
    while len(out) < per_step:
        epoch, offset = divmod(position, num_rows)
        order = list(range(num_rows))
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        take = min(per_step - len(out), num_rows - offset)
        out += order[offset : offset + take]
        position += take
    return out


def annealed_beta(config: TrainConfig, step: int, num_rows: int) -> float | None:
    """docs/methods.md X3: the F-beta of `step` (0-based) under `config.beta_schedule`, moved between epochs (an epoch
    is `num_rows` prompts, `prompts_per_step` a step); None without a schedule."""
    schedule = config.beta_schedule
    return schedule.beta(step * config.prompts_per_step // num_rows) if schedule else None


def step_prompts(
    num_rows: int, seed: int, step: int, per_step: int, upsampler: HardUpsampler | Curriculum | None
) -> tuple[list[int], list[float]]:
    """`step`'s prompt rows and, with hard-data upsampling, the weights they were drawn with: the data order
    (`data_order`, every task once per epoch; no weights) when `upsampler` is None, else its weighted draw."""
    if upsampler is None:
        return data_order(num_rows, seed, step, per_step), []
    return upsampler.draw(step, per_step)


TOGGLE_BUDGETS_FILE = "toggle-budgets.json"


def toggle_budgets(
    job: TrainJob, rows: list[dict[str, Any]], rollouts: list[Any], reporter: Reporter
) -> dict[str, float]:
    """K5's budgets, computed once and stored beside the run's outputs (a resumed run reads them back). With
    `budget_from="prepass"` every task is rolled out once (`group_size` samples) with the initial policy now; with
    "first_rollout" the budgets fill in as tasks are first rolled out (`toggled`)."""
    config = job.config
    assert config.toggle is not None
    uri = f"{job.output_prefix}/{TOGGLE_BUDGETS_FILE}"
    try:
        stored = json.loads(read_bytes(uri, job.storage_options))
        reporter.log(f"toggle: {len(stored)} task budgets read back from {uri}")
        return {str(k): float(v) for k, v in stored.items()}
    except (OSError, ValueError):
        pass
    if config.toggle.budget_from != "prepass":
        return {}
    reporter.log(f"toggle: rolling out {len(rows)} tasks once to fix their length budgets (K5)")
    futures = [
        worker.rollout.remote(rows[i :: len(rollouts)], config.group_size, config.seed + 7_919, f"budget-w{i}-")
        for i, worker in enumerate(rollouts)
        if rows[i :: len(rollouts)]
    ]
    samples = [s for result in ray.get(futures) for s in result.samples]
    budgets = task_budgets(samples, rho=config.toggle.rho, correct_at=config.toggle.correct_at)
    write_bytes(uri, json.dumps(budgets).encode(), job.storage_options)
    reporter.log(f"toggle: budgets for {len(budgets)} of {len(rows)} tasks (the others had no correct sample)")
    return budgets


def toggled(
    batch: list[Sample], config: TrainConfig, step: int, budgets: dict[str, float]
) -> tuple[list[Sample], dict[str, float]]:
    """The batch with K4's rewards for `step` (copies: the rolled-out samples keep their task reward)."""
    toggle = config.toggle
    assert toggle is not None
    if toggle.budget_from == "first_rollout":
        fresh = [s for s in batch if s.task_id not in budgets]
        for task, budget in task_budgets(fresh, rho=toggle.rho, correct_at=toggle.correct_at).items():
            budgets.setdefault(task, budget)
    rewards, metrics = apply_toggle(batch, config.group_size, step=step, config=toggle, budgets=budgets)
    metrics["toggle/task_reward_mean"] = sum(s.reward for s in batch) / max(len(batch), 1)
    return [dataclasses.replace(s, reward=r) for s, r in zip(batch, rewards, strict=True)], metrics


def shown_advantages(samples: list[Sample], group_size: int, scale: str) -> list[float | None]:
    """Each sample's advantage in its group from its task reward, as `group_advantages` computes it (the learner's
    can differ slightly where the algorithm shapes the reward first: a KL reward penalty, DAPO's overlong
    penalty). None for every sample where the step does not split into whole groups."""
    if group_size < 2 or not samples or len(samples) % group_size:
        return [None] * len(samples)
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float64)
    result = group_advantages(rewards, group_size, scale=scale, drop_equal_groups=False)  # type: ignore[arg-type]
    return [round(float(a), 6) for a in result.advantages]


def trajectory_summary(sample: Sample, step: int) -> dict[str, Any]:
    return {
        "trajectory_id": sample.trajectory["id"],
        "task_id": sample.task_id,
        "step": step,
        "reward": sample.reward,
        "terms": sample.terms,
        "num_turns": sample.num_turns,
        "completion_tokens": sample.sampled_tokens,
        "error": sample.error,
    }


class TrainJob(Protocol):
    """What a training run gives the trainer (`workers.specs.TrainSpec` is one)."""

    config: TrainConfig
    reward: dict[str, Any]
    storage_options: dict[str, Any]
    output_prefix: str
    resume_from: str | None
