"""Rejection-sampling fine-tuning data from a run (Kimi K2.5's RFT, docs/methods.md section 1, "Rewards, GRMs, RFT"):
the run's successful trajectories, filtered by reward and deduplicated by task, become a version of a
trajectories dataset, the input of a later SFT run or any re-scoring.

Only trajectories whose full record is stored can be exported: a training run keeps every record unless it lowered
`trajectory_sample_rate` (then a share of each step's groups plus every flagged one; older runs: the first
`trajectory_samples_per_step`);
the report says how many qualified by reward but had no stored record. The source leaves the acceptance rule open:
ours keeps a trajectory that completed without error and whose reward reaches `min_reward`, the best `per_task`
of each task (highest reward, then latest step).
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from django.db import transaction
from rest_framework.exceptions import ValidationError

from apps.accounts.models import User
from apps.common.validators import SLUG
from apps.datasets.models import Dataset, DatasetKind, DatasetVersion
from apps.datasets.services import dataset_create, dataset_version_create
from apps.runs.models import Run, TrajectorySummary
from apps.runs.storage import read_storage_uri

RFT_FILE = "rft.jsonl"
# Keys a training step adds to a stored record for its pages (workers.rl.token_view), left out of exported rows.
VIEW_ONLY_KEYS = frozenset({"tokens"})
MAX_PER_TASK = 64


def _check(run: Run, dataset: str, min_reward: Any, per_task: Any) -> dict[str, list[str]]:
    problems: dict[str, list[str]] = {}
    if not SLUG.fullmatch(dataset or ""):
        problems["dataset"] = ["use 1-100 letters, digits, '-' or '_' (e.g. swarm-rft)"]
    else:
        existing = Dataset.objects.filter(name=dataset).first()
        if existing is not None and existing.kind != DatasetKind.TRAJECTORIES:
            problems["dataset"] = [
                f"{dataset!r} is a {existing.kind} dataset; name a trajectories dataset or a new one"
            ]
    if isinstance(min_reward, bool) or not isinstance(min_reward, int | float) or min_reward != min_reward:
        problems["min_reward"] = ["must be a number: the lowest reward a kept trajectory may have"]
    if isinstance(per_task, bool) or not isinstance(per_task, int) or not 1 <= per_task <= MAX_PER_TASK:
        problems["per_task"] = [f"must be an integer in [1, {MAX_PER_TASK}]: trajectories kept per task"]
    if not run.trajectories.exists():
        problems["run"] = [f"run {run.pk} reported no trajectories"]
    return problems


@transaction.atomic
def rft_dataset_create(
    *, run: Run, dataset: str, user: User, min_reward: Any = 1.0, per_task: Any = 1
) -> DatasetVersion:
    """A new version of the trajectories dataset `dataset` (created if missing) holding `run`'s kept trajectories;
    400 naming the field when an input is wrong or nothing qualifies. The version's report says what was kept."""
    problems = _check(run, dataset, min_reward, per_task)
    if problems:
        raise ValidationError(problems)
    qualified = list(
        TrajectorySummary.objects.filter(run=run, reward__gte=float(min_reward), error="").order_by(
            "task_id", "-reward", "-step", "trajectory_id"
        )
    )
    stored = [s for s in qualified if s.storage_uri]
    picked: dict[str, list[TrajectorySummary]] = defaultdict(list)
    for summary in stored:
        if len(picked[summary.task_id]) < per_task:
            picked[summary.task_id].append(summary)
    by_file: dict[str, set[str]] = defaultdict(set)
    for summaries in picked.values():
        for summary in summaries:
            by_file[summary.storage_uri].add(summary.trajectory_id)
    records: dict[str, dict[str, Any]] = {}
    for uri, wanted in by_file.items():
        try:
            data = read_storage_uri(uri)
        except (FileNotFoundError, OSError):
            continue
        for line in data.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and str(record.get("id")) in wanted:
                # The token-level view is the trajectory page's, not a dataset row's.
                records[str(record["id"])] = {k: v for k, v in record.items() if k not in VIEW_ONLY_KEYS}
    kept = [records[s.trajectory_id] for summaries in picked.values() for s in summaries if s.trajectory_id in records]
    if not kept:
        raise ValidationError(
            {
                "min_reward": [
                    f"no trajectory of run {run.pk} completed with reward >= {min_reward:g} and a stored record "
                    f"({len(qualified)} reached the reward, {len(stored)} of them stored); lower min_reward, or keep "
                    "trajectory_sample_rate at 1 on the runs you mean to reuse"
                ]
            }
        )
    report = {
        "rft": {
            "run": run.pk,
            "min_reward": float(min_reward),
            "per_task": per_task,
            "qualified": len(qualified),
            "qualified_without_record": len(qualified) - len(stored),
            "tasks": len(picked),
            "kept": len(kept),
            "environment": (run.spec.get("config") or {}).get("environment"),
        }
    }
    target = Dataset.objects.filter(name=dataset).first() or dataset_create(
        name=dataset,
        kind=DatasetKind.TRAJECTORIES,
        owner=user,
        description=f"Rejection-sampled trajectories of run {run.pk} (RFT)",
    )
    data = "".join(json.dumps(record, sort_keys=True) + "\n" for record in kept).encode()
    return dataset_version_create(
        dataset=target,
        data=data,
        filename=RFT_FILE,
        created_by=user,
        notes=f"RFT from run {run.pk}: {len(kept)} trajectories of {len(picked)} tasks with reward >= {min_reward:g}",
        report=report,
    )
