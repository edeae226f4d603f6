"""A run's learner strategy is chosen at launch (API and form) and its page shows where every rank ran."""

from __future__ import annotations

import pytest

from apps.runs.models import Run
from tests.factories import exact_answer_version, tasks_version
from workers.envs.registry import arithmetic_tasks

pytestmark = pytest.mark.django_db

TINY = {"base_model": "tiny-llama-smollm2-tokenizer", "steps": 2, "prompts_per_step": 2, "group_size": 2}


@pytest.fixture
def world(users):  # type: ignore[no-untyped-def]
    owner = users["operator"]
    return tasks_version(owner=owner, rows=arithmetic_tasks(8, seed=0)), exact_answer_version(owner=owner)


def test_the_api_and_the_form_launch_a_sharded_learner_and_the_page_shows_its_ranks(
    world, users, client, client_for, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr("apps.runs.tasks.dispatch_run.delay", lambda run_id: None)
    tasks, reward = world
    body = {
        "kind": "train",
        "dataset_version": tasks.pk,
        "reward_version": reward.pk,
        "config": {**TINY, "learner": {"strategy": "fsdp2", "ranks": 2}},
    }
    reply = client_for("operator").post("/api/v1/runs/", body, format="json")
    assert reply.status_code == 201, reply.json()
    run = Run.objects.get(pk=reply.json()["id"])
    assert run.spec["config"]["learner"] == {
        "strategy": "fsdp2",
        "ranks": 2,
        "mixed_precision": "fp32",
        "cpu_offload": False,
    }

    client.force_login(users["operator"])
    page = client.get("/runs/new/train/")
    html = page.content.decode()
    assert 'name="learner.strategy"' in html and 'name="learner.ranks"' in html
    form = {
        "dataset_version": tasks.pk,
        "reward_version": reward.pk,
        "base_model": TINY["base_model"],
        "steps": "2",
        "prompts_per_step": "2",
        "group_size": "2",
        "learner.strategy": "ddp",
        "learner.ranks": "2",
        "compute.placement": "split",
        "compute.per_rank": '{"cpus": 1, "memory_gb": 4}',
        "compute.per_engine": '{"cpus": 1, "custom": {"engine_node": 1}}',
    }
    posted = client.post("/runs/new/train/", form)
    assert posted.status_code == 302, posted.content.decode()[:2000]
    launched = Run.objects.exclude(pk=run.pk).get()
    assert launched.spec["config"]["learner"]["strategy"] == "ddp" and launched.spec["config"]["learner"]["ranks"] == 2
    assert launched.spec["config"]["compute"]["placement"] == "split"
    assert launched.spec["config"]["compute"]["per_engine"]["custom"] == {"engine_node": 1.0}
    # 2 ranks and 1 engine
    assert launched.resources["total"] == {"CPU": 3.0, "memory": 8.0 * 1024**3, "engine_node": 1.0}
    bad = client.post("/runs/new/train/", {**form, "compute.per_rank": "{cpus"})
    assert bad.status_code == 200 and "not valid JSON" in bad.content.decode()

    ranks = [
        {
            "role": "learner",
            "rank": r,
            "node_id": "f77305504f95f8915073",
            "node_ip": "10.0.0.7",
            "pid": 100 + r,
            "resources": {"CPU": 0.5, "memory_gb": 0.5},
            "devices": ["cpu"],
        }
        for r in range(2)
    ]
    engine = {**ranks[0], "role": "engine", "rank": 0, "pid": 300}
    resources = {"placement": "colocated", "total": {"CPU": 2.0, "memory_gb": 2.0}}
    Run.objects.filter(pk=run.pk).update(summary={"placement": [*ranks, engine], "resources": resources})
    detail = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'id="placement"' in detail and "learner strategy fsdp2" in detail
    assert detail.count("<td>learner</td>") == 2 and "10.0.0.7" in detail and "CPU 0.5" in detail
    assert detail.count("<td>engine</td>") == 1 and "share the learner's devices and sleep" in detail
    assert "in all CPU 2, memory_gb 2" in detail
