"""Splitting a tasks version into train and held-out test versions (API), and a benchmark version made from one."""

from __future__ import annotations

import json

import pytest

from apps.benchmarks.models import BenchmarkVersion
from apps.datasets.models import Dataset, DatasetKind, DatasetVersion
from apps.datasets.services import dataset_create
from tests.factories import tasks_version
from workers.envs.registry import arithmetic_tasks

pytestmark = pytest.mark.django_db


def ids(version: DatasetVersion) -> set[str]:
    with version.file.open("rb") as handle:
        return {json.loads(line)["id"] for line in handle.read().splitlines() if line.strip()}


def test_a_split_is_deterministic_disjoint_and_complete(client_for, users):  # type: ignore[no-untyped-def]
    source = tasks_version(owner=users["operator"], rows=arithmetic_tasks(20, seed=3), name="arith")
    api = client_for("operator")
    first = api.post(f"/api/v1/dataset-versions/{source.pk}/split/", {"test_fraction": 0.25, "seed": 1}, format="json")
    assert first.status_code == 201, first.content
    train = DatasetVersion.objects.get(pk=first.json()["train"]["id"])
    test = DatasetVersion.objects.get(pk=first.json()["test"]["id"])
    assert (train.dataset.name, test.dataset.name) == ("arith-train", "arith-test")
    assert len(ids(test)) == 5 and ids(train) | ids(test) == ids(source) and not ids(train) & ids(test)
    assert test.validation_report["split"] == {"split_of": source.pk, "part": "test", "seed": 1, "test_fraction": 0.25}
    again = api.post(f"/api/v1/dataset-versions/{source.pk}/split/", {"test_fraction": 0.25, "seed": 1}, format="json")
    assert again.json()["test"]["id"] == test.pk  # the same split links the same versions
    other = api.post(f"/api/v1/dataset-versions/{source.pk}/split/", {"test_fraction": 0.25, "seed": 2}, format="json")
    assert ids(DatasetVersion.objects.get(pk=other.json()["test"]["id"])) != ids(test)


@pytest.mark.parametrize(
    "body, field",
    [
        ({"test_fraction": 1.0}, "test_fraction"),
        ({"test_fraction": 0}, "test_fraction"),
        ({"train_dataset": "same", "test_dataset": "same"}, "test_dataset"),
        ({"train_dataset": "a corpus"}, "train_dataset"),
        ({"test_dataset": "a-corpus"}, "test_dataset"),
    ],
)
def test_a_bad_split_is_a_400_naming_the_field_and_stores_nothing(client_for, users, body, field):  # type: ignore[no-untyped-def]
    source = tasks_version(owner=users["operator"], rows=arithmetic_tasks(6, seed=3), name="arith")
    dataset_create(name="a-corpus", kind=DatasetKind.CORPUS, owner=users["operator"])
    before = DatasetVersion.objects.count()
    response = client_for("operator").post(f"/api/v1/dataset-versions/{source.pk}/split/", body, format="json")
    assert response.status_code == 400 and field in response.json()["fields"], response.content
    assert DatasetVersion.objects.count() == before and not Dataset.objects.filter(name="arith-train").exists()


def test_a_viewer_cannot_split(client_for, users):  # type: ignore[no-untyped-def]
    source = tasks_version(owner=users["operator"], rows=arithmetic_tasks(6, seed=3), name="arith")
    assert (
        client_for("viewer").post(f"/api/v1/dataset-versions/{source.pk}/split/", {}, format="json").status_code == 403
    )


def test_a_benchmark_version_takes_the_held_out_part_and_excludes_it_from_training(client_for, users):  # type: ignore[no-untyped-def]
    source = tasks_version(owner=users["operator"], rows=arithmetic_tasks(10, seed=3), name="arith")
    api = client_for("operator")
    test_id = api.post(f"/api/v1/dataset-versions/{source.pk}/split/", {}, format="json").json()["test"]["id"]
    benchmark = api.post("/api/v1/benchmarks/", {"name": "arith-heldout", "environment": "exact_answer"}, format="json")
    made = api.post(
        f"/api/v1/benchmarks/{benchmark.json()['id']}/versions/", {"dataset_version": test_id}, format="json"
    )
    assert made.status_code == 201, made.content
    version = BenchmarkVersion.objects.get(pk=made.json()["id"])
    assert version.task_count == 2 and list(version.excluded_training_data.values_list("pk", flat=True)) == [test_id]
    both = api.post(
        f"/api/v1/benchmarks/{benchmark.json()['id']}/versions/",
        {"dataset_version": test_id, "tasks": [{"id": "x", "prompt": "1+1?", "answer": "2"}]},
        format="json",
    )
    assert both.status_code == 400
