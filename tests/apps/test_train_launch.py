"""Training runs are checked when they are created: a bad run is a 400 naming the field, never a late failure."""

from __future__ import annotations

import pytest

from apps.runs.models import Checkpoint, Run, RunStatus
from tests.factories import context1_version, exact_answer_version, tasks_version
from workers.envs.registry import arithmetic_tasks

pytestmark = pytest.mark.django_db

TINY = {"base_model": "tiny-llama-smollm2-tokenizer", "steps": 2, "prompts_per_step": 2, "group_size": 2}


@pytest.fixture
def launch(users, client_for):  # type: ignore[no-untyped-def]
    owner = users["operator"]
    tasks = tasks_version(owner=owner, rows=arithmetic_tasks(8, seed=0))
    reward = exact_answer_version(owner=owner)

    def post(config=None, role="operator", **overrides):  # type: ignore[no-untyped-def]
        body = {
            "kind": "train",
            "dataset_version": tasks.pk,
            "reward_version": reward.pk,
            "config": TINY if config is None else config,
            **overrides,
        }
        return client_for(role).post("/api/v1/runs/", body, format="json")

    post.tasks, post.reward = tasks, reward  # type: ignore[attr-defined]
    return post


def test_a_valid_training_run_is_created_with_its_typed_spec(launch, monkeypatch):
    queued: list[int] = []
    monkeypatch.setattr("apps.runs.tasks.dispatch_run.delay", queued.append)
    reply = launch()
    assert reply.status_code == 201, reply.json()
    run = Run.objects.get(pk=reply.json()["id"])
    assert run.kind == "train" and run.progress_total == 2
    config = run.spec["config"]
    assert config["algorithm"] == "grpo" and config["group_size"] == 2 and config["compute"]["cpus"] == 2
    from apps.runs.services import worker_spec

    spec = worker_spec(run)
    assert spec["config"] == config and spec["resume_from"] is None and spec["input_uri"].startswith("file://")


def test_a_viewer_cannot_launch_a_training_run(launch):
    assert launch(role="viewer").status_code == 403
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    ("config", "field", "words"),
    [
        ({**TINY, "base_model": "/nowhere/model"}, "config.base_model", "unknown base model"),
        ({**TINY, "group_size": 1}, "config.group_size", "greater than or equal to 2"),
        ({**TINY, "algorithm": "ppo"}, "config.algorithm", "grpo"),
        ({**TINY, "environment": "chess"}, "config.environment", "exact_answer"),
        ({**TINY, "prompts_per_step": 50}, "config.prompts_per_step", "only 8 tasks"),
        ({**TINY, "learning_rate": -1}, "config.learning_rate", "greater than or equal to 0"),
        ({**TINY, "surprise": 1}, "config.surprise", "Extra inputs"),
        ({**TINY, "loss": {"epsilon": 0.2}}, "config.loss", "epsilon_high"),
        ({**TINY, "loss": {"kl_estimator": "k9"}}, "config.loss", "kl_estimator"),
        ({**TINY, "loss": {"algorithm": "cispo"}}, "config.loss", "unknown setting"),
        ({**TINY, "mode": "async", "max_staleness": 0}, "config", "max_staleness >= 1"),
    ],
)
def test_a_bad_config_is_a_400_naming_the_field(launch, config, field, words):
    reply = launch(config)
    assert reply.status_code == 400, reply.json()
    fields = reply.json()["fields"]
    assert field in fields and words in " ".join(fields[field]), fields
    assert not Run.objects.exists()


def test_a_run_that_cannot_fit_in_memory_is_refused_with_the_fix(launch):
    reply = launch({**TINY, "base_model": "smollm2-135m-instruct", "max_tokens_per_pack": 65536})
    assert reply.status_code == 400
    message = " ".join(reply.json()["fields"]["config.compute.memory_gb"])
    assert "needs about" in message and "gradient_checkpointing" in message


def test_tasks_without_the_fields_the_environment_needs_are_refused_by_row(users, launch):
    bad = tasks_version(owner=users["operator"], rows=[{"id": "q1", "question": "2+2?", "answer": "4"}], name="bad")
    reply = launch(dataset_version=bad.pk, config={**TINY, "prompts_per_step": 1})
    assert reply.status_code == 400
    assert "task row 1" in " ".join(reply.json()["fields"]["dataset_version"])
    assert "prompt" in " ".join(reply.json()["fields"]["dataset_version"])


def test_a_reward_whose_terms_need_inputs_the_environment_does_not_produce_is_refused(users, launch):
    retrieval = context1_version(owner=users["operator"])
    reply = launch(reward_version=retrieval.pk)
    assert reply.status_code == 400
    assert "f_beta" in " ".join(reply.json()["fields"]["reward_version"])


def test_a_trajectories_dataset_cannot_train(users, launch, trajectories_jsonl):
    from tests.factories import trajectories_version

    trajectories = trajectories_version(owner=users["operator"], data=trajectories_jsonl)
    reply = launch(dataset_version=trajectories.pk)
    assert reply.status_code == 400 and "kind 'tasks'" in " ".join(reply.json()["fields"]["dataset_version"])


def test_resume_continues_from_the_latest_checkpoint_as_a_linked_run(launch, client_for, monkeypatch):
    monkeypatch.setattr("apps.runs.tasks.dispatch_run.delay", lambda run_id: None)
    parent = Run.objects.get(pk=launch().json()["id"])
    api = client_for("operator")
    early = api.post(f"/api/v1/runs/{parent.pk}/resume/")
    assert early.status_code == 400 and "stop it first" in early.json()["detail"]
    Run.objects.filter(pk=parent.pk).update(status=RunStatus.STOPPED)
    none_yet = api.post(f"/api/v1/runs/{parent.pk}/resume/")
    assert none_yet.status_code == 400 and "no checkpoint" in none_yet.json()["detail"]
    Checkpoint.objects.create(run=parent, step=1, uri="file:///tmp/c1.pt")
    Checkpoint.objects.create(run=parent, step=2, uri="file:///tmp/c2.pt")
    assert client_for("viewer").post(f"/api/v1/runs/{parent.pk}/resume/").status_code == 403
    finished = api.post(f"/api/v1/runs/{parent.pk}/resume/")  # step 2 of 2: nothing left to train
    assert finished.status_code == 400 and "finished all 2 steps" in finished.json()["detail"]
    Checkpoint.objects.filter(run=parent, step=2).delete()  # as if it crashed after step 1's checkpoint
    reply = api.post(f"/api/v1/runs/{parent.pk}/resume/")
    assert reply.status_code == 201, reply.json()
    child = Run.objects.get(pk=reply.json()["id"])
    assert child.parent_id == parent.pk and child.spec["resume_from"]["step"] == 1
    assert child.spec["config"] == parent.spec["config"] and child.progress_done == 1
