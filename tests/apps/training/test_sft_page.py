"""The SFT warm-up's launch page, and the fine-tuned model it leaves offered to the training form."""

from __future__ import annotations

import pytest

from apps.runs.models import Run
from tests.factories import exact_answer_version, tasks_version
from workers.envs.registry import arithmetic_tasks

pytestmark = pytest.mark.django_db


@pytest.fixture
def queued(monkeypatch):  # type: ignore[no-untyped-def]
    runs: list[int] = []
    monkeypatch.setattr("apps.runs.tasks.dispatch_run.delay", runs.append)
    return runs


def test_an_operator_launches_an_sft_warm_up_from_the_page_and_a_bad_choice_is_named(client, users, queued):  # type: ignore[no-untyped-def]
    operator = users["operator"]
    tasks = tasks_version(owner=operator, rows=arithmetic_tasks(4, seed=1), name="arith")
    reward = exact_answer_version(owner=operator)
    client.force_login(operator)
    page = client.get("/runs/new/sft/").content.decode()
    assert "scripted-coding" in page and "scripted-search" in page and "arith" in page
    form = {
        "dataset_version": tasks.pk,
        "reward_version": reward.pk,
        "environment": "exact_answer",
        "teacher_model": "scripted-coding",
        "base_model": "tiny-llama-smollm2-tokenizer",
        "epochs": "1",
    }
    refused = client.post("/runs/new/sft/", form)
    assert refused.status_code == 200 and "agent for environment" in refused.content.decode()
    refused = client.post("/runs/new/sft/", {**form, "teacher_model": "tiny-llama-smollm2-tokenizer", "epochs": "x"})
    assert "epochs" in refused.content.decode() and not Run.objects.exists()
    made = client.post("/runs/new/sft/", {**form, "teacher_model": "tiny-llama-smollm2-tokenizer"})
    run = Run.objects.get(kind="sft")
    assert made.status_code == 302 and run.spec["config"]["epochs"] == 1
    assert client_viewer_cannot(client, users)


def client_viewer_cannot(client, users) -> bool:  # type: ignore[no-untyped-def]
    client.force_login(users["viewer"])
    return client.get("/runs/new/sft/").status_code == 403


def test_a_finished_warm_up_is_offered_as_the_base_model_of_a_training_run(client, users, tmp_path):  # type: ignore[no-untyped-def]
    model = tmp_path / "sft" / "model"
    model.mkdir(parents=True)
    Run.objects.create(
        kind="sft",
        name="warm",
        status="succeeded",
        spec={},
        summary={"model_uri": f"file://{model}"},
        created_by=users["operator"],
    )
    client.force_login(users["operator"])
    assert str(model) in client.get("/runs/new/train/").content.decode()
    assert str(model) in client.get("/runs/new/sft/").content.decode()
