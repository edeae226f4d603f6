"""Test data built through the services, so tests exercise the same paths users do."""

from __future__ import annotations

from apps.accounts.models import User
from apps.datasets.models import DatasetKind, DatasetVersion
from apps.datasets.services import dataset_create, dataset_version_create
from apps.rewards.models import RewardConfigVersion
from apps.rewards.services import reward_config_create
from workers.rewards.schema import context1_spec


def trajectories_version(*, owner: User, data: bytes, name: str = "trajs") -> DatasetVersion:
    dataset = dataset_create(name=name, kind=DatasetKind.TRAJECTORIES, description="", owner=owner)
    return dataset_version_create(dataset=dataset, data=data, filename="t.jsonl", created_by=owner)


def context1_version(*, owner: User, name: str = "ctx1") -> RewardConfigVersion:
    config = reward_config_create(name=name, description="", spec=context1_spec().model_dump(mode="json"), owner=owner)
    return config.versions.get()


def tasks_version(*, owner: User, rows: list[dict[str, object]], name: str = "tasks") -> DatasetVersion:
    import json

    dataset = dataset_create(name=name, kind=DatasetKind.TASKS, description="", owner=owner)
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    return dataset_version_create(dataset=dataset, data=data, filename="tasks.jsonl", created_by=owner)


def exact_answer_version(*, owner: User, name: str = "exact") -> RewardConfigVersion:
    spec = {"terms": [{"type": "normalized_match"}]}
    return reward_config_create(name=name, description="", spec=spec, owner=owner).versions.get()
