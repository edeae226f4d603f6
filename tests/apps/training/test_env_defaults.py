"""A training launch that names no algorithm takes its environment's default (`Environment.default_algorithm`),
stores the resolved algorithm in the run's config and says on the run page where it came from; a named algorithm
is kept, and an environment without a default trains with grpo as before."""

from __future__ import annotations

from typing import ClassVar

import pytest
from django.test import Client

from apps.runs.models import Run
from tests.factories import exact_answer_version, tasks_version
from workers.envs import registry
from workers.envs.exact_answer import ExactAnswerEnv
from workers.envs.registry import arithmetic_tasks

pytestmark = pytest.mark.django_db

TINY = {"base_model": "tiny-llama-smollm2-tokenizer", "steps": 2, "prompts_per_step": 2, "group_size": 2}


class ComposerDefaultEnv(ExactAnswerEnv):
    """A test-only environment whose runs default to Composer 2's algorithm."""

    name: ClassVar[str] = "composer_default_test"
    default_algorithm: ClassVar[str | None] = "composer"


@pytest.fixture
def world(users, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr("apps.runs.tasks.dispatch_run.delay", lambda run_id: None)
    monkeypatch.setitem(registry.ENVIRONMENTS, ComposerDefaultEnv.name, ComposerDefaultEnv)
    owner = users["operator"]
    return {
        "tasks": tasks_version(owner=owner, rows=arithmetic_tasks(8, seed=0)),
        "reward": exact_answer_version(owner=owner),
    }


@pytest.fixture
def launch(world, client_for):  # type: ignore[no-untyped-def]
    def post(config):  # type: ignore[no-untyped-def]
        body = {
            "kind": "train",
            "dataset_version": world["tasks"].pk,
            "reward_version": world["reward"].pk,
            "config": config,
        }
        reply = client_for("operator").post("/api/v1/runs/", body, format="json")
        assert reply.status_code == 201, reply.json()
        return Run.objects.get(pk=reply.json()["id"])

    return post


def _page(users, run: Run) -> str:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(users["viewer"])
    response = client.get(f"/runs/{run.pk}/")
    assert response.status_code == 200
    return response.content.decode()


def test_a_launch_without_an_algorithm_stores_the_environments_default(launch, users):
    run = launch({**TINY, "environment": ComposerDefaultEnv.name})
    config = run.spec["config"]
    assert config["algorithm"] == "composer" and config["algorithm_default_of"] == ComposerDefaultEnv.name
    assert run.name.startswith("composer ")
    html = _page(users, run)
    assert "(default of environment composer_default_test: the launch named no algorithm)" in html
    assert "<td><code>loss.kl_estimator</code></td><td><code>k1</code></td>" in html


def test_a_launch_that_names_grpo_keeps_it(launch, users):
    run = launch({**TINY, "environment": ComposerDefaultEnv.name, "algorithm": "grpo"})
    assert run.spec["config"]["algorithm"] == "grpo" and run.spec["config"]["algorithm_default_of"] is None
    assert 'id="algorithm-default"' not in _page(users, run)


def test_an_environment_without_a_default_trains_with_grpo(launch):
    run = launch({**TINY, "environment": "exact_answer"})
    assert run.spec["config"]["algorithm"] == "grpo" and run.spec["config"]["algorithm_default_of"] is None


def test_the_launch_form_leaves_the_algorithm_to_the_environment_unless_one_is_picked(world, client):
    client.force_login(world["tasks"].created_by)
    page = client.get("/runs/new/train/").content.decode()
    assert "(the environment&#x27;s recipe default: composer on coding_agent" in page and "; grpo otherwise)" in page
    form = {
        "dataset_version": world["tasks"].pk,
        "reward_version": world["reward"].pk,
        "environment": ComposerDefaultEnv.name,
        "algorithm": "",
        **{key: str(value) for key, value in TINY.items()},
        "env_params": "{}",
    }
    assert client.post("/runs/new/train/", form).status_code == 302
    assert client.post("/runs/new/train/", {**form, "algorithm": "dapo"}).status_code == 302
    first, second = Run.objects.order_by("pk")
    assert first.spec["config"]["algorithm"] == "composer" and second.spec["config"]["algorithm"] == "dapo"
