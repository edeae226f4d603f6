"""RFT (Kimi K2.5): a run's successful trajectories, filtered by reward and deduplicated by task, become a version of
a trajectories dataset, from the API or the run page; bad input is refused naming the field and changes nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from apps.datasets.models import Dataset, DatasetVersion
from apps.runs.models import RunStatus, TrajectorySummary
from apps.runs.storage import storage_uri

pytestmark = pytest.mark.django_db


def _record(trajectory_id: str, task: str) -> dict[str, Any]:
    return {"id": trajectory_id, "task_id": task, "answer": "x", "turns": [{"role": "assistant", "content": "x"}]}


@pytest.fixture
def finished(run):  # type: ignore[no-untyped-def]
    """The run with six reported trajectories of three tasks, five of them stored in one file."""
    rows = [
        ("a-1", "a", 1.0, 2, True, ""),
        ("a-2", "a", 1.0, 3, True, ""),  # same reward, later step: preferred
        ("b-1", "b", 0.4, 1, True, ""),  # below the bar
        ("c-1", "c", 1.0, 1, True, "timed out"),  # an error never qualifies
        ("c-2", "c", 1.2, 2, False, ""),  # qualifies, but no stored record
        ("c-3", "c", 1.0, 4, True, ""),
    ]
    stored = [r for r in rows if r[4]]
    name = default_storage.save(
        f"runs/{run.pk}/trajectories/step-000001.jsonl",
        ContentFile("".join(json.dumps(_record(r[0], r[1])) + "\n" for r in stored)),
    )
    for trajectory_id, task, reward, step, has_record, error in rows:
        TrajectorySummary.objects.create(
            run=run,
            trajectory_id=trajectory_id,
            task_id=task,
            step=step,
            reward=reward,
            error=error,
            storage_uri=storage_uri(name) if has_record else "",
        )
    run.status = RunStatus.SUCCEEDED
    run.save(update_fields=["status"])
    return run


def test_the_api_exports_the_best_stored_trajectory_of_each_task(client_for, finished) -> None:  # type: ignore[no-untyped-def]
    response = client_for("operator").post(
        f"/api/v1/runs/{finished.pk}/rft/", {"dataset": "swarm-rft", "min_reward": 1.0}, format="json"
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    version = DatasetVersion.objects.get(pk=body["dataset_version"])
    with version.file.open("rb") as handle:
        kept = [json.loads(line)["id"] for line in handle.read().splitlines()]
    assert kept == ["a-2", "c-3"]
    rft = body["report"]["rft"]
    assert (rft["qualified"], rft["qualified_without_record"], rft["tasks"], rft["kept"]) == (4, 1, 2, 2)
    assert version.dataset.kind == "trajectories" and body["dataset"] == "swarm-rft"


def test_per_task_keeps_more_and_a_second_export_adds_a_version(client_for, finished) -> None:  # type: ignore[no-untyped-def]
    client = client_for("operator")
    first = client.post(f"/api/v1/runs/{finished.pk}/rft/", {"dataset": "r", "per_task": 2}, format="json")
    assert first.status_code == 201 and first.json()["report"]["rft"]["kept"] == 3
    second = client.post(
        f"/api/v1/runs/{finished.pk}/rft/", {"dataset": "r", "min_reward": 0.3, "per_task": 3}, format="json"
    )
    assert second.status_code == 201 and second.json()["report"]["rft"]["kept"] == 4
    assert Dataset.objects.get(name="r").versions.count() == 2


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"dataset": "bad name!"}, "dataset"),
        ({"dataset": "ok", "min_reward": 5}, "min_reward"),
        ({"dataset": "ok", "per_task": 0}, "per_task"),
        ({"dataset": "ok", "min_reward": "high"}, "min_reward"),
        ({}, "dataset"),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_nothing_is_stored(client_for, finished, body, field) -> None:  # type: ignore[no-untyped-def]
    before = DatasetVersion.objects.count()
    response = client_for("operator").post(f"/api/v1/runs/{finished.pk}/rft/", body, format="json")
    assert response.status_code == 400 and field in response.json()["fields"], response.json()
    assert DatasetVersion.objects.count() == before


def test_a_dataset_of_another_kind_is_refused_and_a_viewer_may_not_export(client_for, finished) -> None:  # type: ignore[no-untyped-def]
    from apps.datasets.services import dataset_create

    dataset_create(name="tasks-x", kind="tasks", owner=finished.created_by)
    refused = client_for("operator").post(f"/api/v1/runs/{finished.pk}/rft/", {"dataset": "tasks-x"}, format="json")
    assert refused.status_code == 400 and "is a tasks dataset" in refused.json()["detail"]
    forbidden = client_for("viewer").post(f"/api/v1/runs/{finished.pk}/rft/", {"dataset": "y"}, format="json")
    assert forbidden.status_code == 403


def test_the_run_page_form_exports(client, users, finished) -> None:  # type: ignore[no-untyped-def]
    client.force_login(users["operator"])
    response = client.post(f"/runs/{finished.pk}/rft/", {"dataset": "page-rft", "min_reward": "1", "per_task": "1"})
    assert response.status_code == 302
    assert Dataset.objects.get(name="page-rft").versions.get().row_count == 2
    refused = client.post(f"/runs/{finished.pk}/rft/", {"dataset": "page-rft", "min_reward": "9"}, follow=True)
    assert "no trajectory of run" in refused.content.decode()


def test_an_sft_run_on_the_export_trains_on_its_records_as_the_next_run_of_the_lineage(
    client_for, finished, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr("apps.runs.tasks.dispatch_run.delay", lambda run_id: None)
    client = client_for("operator")
    export = client.post(f"/api/v1/runs/{finished.pk}/rft/", {"dataset": "lineage-rft"}, format="json").json()
    body = {
        "kind": "sft",
        "dataset_version": export["dataset_version"],
        "reward_version": finished.reward_version_id,
        "config": {"teacher_model": "records", "base_model": "tiny-llama-smollm2-tokenizer", "environment": "search"},
    }
    launched = client.post("/api/v1/runs/", body, format="json")
    assert launched.status_code == 201, launched.json()
    from apps.runs.models import Run

    child = Run.objects.get(pk=launched.json()["id"])
    assert child.parent_id == finished.pk and child.spec["job"]["config"]["teacher_model"] == "records"

    wrong = client.post(
        "/api/v1/runs/", {**body, "config": {**body["config"], "teacher_model": "scripted-search"}}, format="json"
    )
    assert wrong.status_code == 400 and "set teacher_model to 'records'" in wrong.json()["detail"]
