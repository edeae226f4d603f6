"""Launching the real-time kinds through `POST /api/v1/runs/ {"kind": ...}`: each job gets exactly its input, and a
launch that cannot work is a 400 naming the field that creates nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.files.base import ContentFile

from apps.datasets.models import Dataset, DatasetKind, DatasetVersion
from apps.datasets.services import dataset_create, dataset_version_create
from apps.realtime.selectors import serve_target
from apps.realtime.services.serving import session_train_launch
from apps.rewards.services import reward_config_create
from apps.runs.models import Run
from apps.runs.services import worker_spec
from tests.apps.realtime.session_factories import TINY, serve_run, turn_event
from tests.factories import exact_answer_version
from workers.specs import ServeSpec, SessionTrainSpec, SimulateSpec

pytestmark = pytest.mark.django_db


@pytest.fixture
def queued(monkeypatch):  # type: ignore[no-untyped-def]
    runs: list[int] = []
    monkeypatch.setattr("apps.runs.tasks.dispatch_run.delay", runs.append)
    return runs


def launch(client_for, role: str = "operator", **body: Any) -> Any:  # type: ignore[no-untyped-def]
    return client_for(role).post("/api/v1/runs/", body, format="json")


def test_a_serving_run_of_a_gates_deployment_gets_its_control_url_route_and_base_model(  # type: ignore[no-untyped-def]
    client_for, queued, gate_with_deployment, settings, django_capture_on_commit_callbacks
):
    settings.CRUCIBLE_PUBLIC_URL = "http://cp.example:8000"
    with django_capture_on_commit_callbacks(execute=True):
        response = launch(
            client_for,
            kind="serve",
            model_name="crucible-coder",
            gate=gate_with_deployment["gate"].pk,
            replicas=2,
            options={"threads": 2, "max_new_tokens": 128},
        )
    assert response.status_code == 201, response.content
    run = Run.objects.get(pk=response.json()["id"])
    assert queued == [run.pk] and run.kind == "serve"
    spec = ServeSpec.model_validate(worker_spec(run))
    assert spec.control_url == f"http://cp.example:8000/api/v1/serving/{run.pk}/"
    assert spec.route_prefix == f"/serve/{run.pk}" and spec.base_model == TINY and spec.model_name == "crucible-coder"
    assert (spec.replicas, spec.threads, spec.max_new_tokens) == (2, 2, 128)
    assert run.spec["gate"] == gate_with_deployment["gate"].pk and run.spec["ab"] is None


def test_a_gate_without_a_deployment_needs_a_base_model_and_then_serves_it(client_for, queued, gate_with_deployment):
    from apps.gates.models import Deployment

    Deployment.objects.filter(gate=gate_with_deployment["gate"]).update(is_current=False)
    gate = gate_with_deployment["gate"].pk
    refused = launch(client_for, kind="serve", model_name="m", gate=gate)
    assert refused.status_code == 400 and "base_model" in refused.json()["fields"], refused.json()
    response = launch(client_for, kind="serve", model_name="m", gate=gate, base_model=TINY)
    assert response.status_code == 201, response.content
    target = serve_target(Run.objects.get(pk=response.json()["id"]))
    assert [(a["name"], a["checkpoint_id"]) for a in target["arms"]] == [("a", None)]


@pytest.mark.parametrize(
    "body, field, words",
    [
        ({"gate": 999_999}, "gate", "does not exist"),
        ({"checkpoint": 999_999, "base_model": TINY}, "checkpoint", "does not exist"),
        ({"base_model": "gpt-17"}, "base_model", "unknown model"),
        ({}, "base_model", "name the model to serve"),
        ({"base_model": TINY, "replicas": 0}, "replicas", "greater than or equal to 1"),
        ({"base_model": TINY, "ab": {"deployment": 999_999}}, "ab.deployment", "does not exist"),
        ({"base_model": TINY, "ab": {"share": 0.5}}, "ab.deployment", "required"),
        ({"base_model": TINY, "options": {"colour": "blue"}}, "options.colour", "not permitted"),
        ({"base_model": TINY, "options": {"threads": 0}}, "options.threads", "greater than or equal to 1"),
        ({"base_model": TINY, "options": {"route_prefix": "/x"}}, "options", "launch's own fields"),
        ({"base_model": TINY, "model_name": "has spaces"}, "model_name", "does not match"),
    ],
)
def test_a_serve_launch_that_cannot_work_is_a_400_naming_the_field(client_for, queued, body, field, words):
    response = launch(client_for, **{"kind": "serve", "model_name": "m", **body})
    assert response.status_code == 400, response.content
    problems = [line for line in response.json()["detail"].split("; ") if line.startswith(f"{field}: ")]
    assert problems and words in str(problems), response.json()
    assert not Run.objects.exists() and queued == []


def test_an_ab_split_with_a_deployment_of_another_base_model_or_a_bad_share_is_refused(  # type: ignore[no-untyped-def]
    client_for, queued, gate_with_deployment
):
    gate, old = gate_with_deployment["gate"].pk, gate_with_deployment["old_deployment"]
    ok = launch(client_for, kind="serve", model_name="m", gate=gate, ab={"deployment": old.pk, "share": 0.3})
    assert ok.status_code == 201, ok.content
    assert Run.objects.get(pk=ok.json()["id"]).spec["ab"] == {"deployment": old.pk, "share": 0.3}
    for share in (0, 1):
        bad = launch(client_for, kind="serve", model_name="m", gate=gate, ab={"deployment": old.pk, "share": share})
        assert bad.status_code == 400 and "ab.share" in bad.json()["fields"], bad.json()
    Run.objects.filter(pk=old.checkpoint.run_id).update(spec={"config": {"base_model": "smollm2-135m-instruct"}})
    other = launch(client_for, kind="serve", model_name="m", gate=gate, ab={"deployment": old.pk})
    assert other.status_code == 400 and "trained from" in str(other.json()["fields"]["ab.deployment"])


def test_a_viewer_cannot_launch(client_for, queued):
    assert launch(client_for, "viewer", kind="serve", model_name="m", base_model=TINY).status_code == 403


def _repo_tasks_version(owner) -> DatasetVersion:  # type: ignore[no-untyped-def]
    """A repo_tasks version row (its rows are the simulator's business, not the launch's)."""
    dataset = dataset_create(name="rt-tasks", kind=DatasetKind.REPO_TASKS, owner=owner)
    version = DatasetVersion(
        dataset=dataset, number=1, row_count=1, size_bytes=3, content_hash="0" * 64, created_by=owner
    )
    version.file.save("rt-tasks.jsonl", ContentFile(b"{}\n"), save=True)
    return version


def test_simulated_users_play_against_the_serving_runs_endpoint_with_feedback_to_the_api(  # type: ignore[no-untyped-def]
    client_for, users, queued, settings
):
    settings.CRUCIBLE_PUBLIC_URL = "http://cp.example:8000/"
    serving = serve_run(users["operator"], http_port=8111)
    tasks = _repo_tasks_version(users["operator"])
    response = launch(
        client_for,
        kind="simulate",
        serve_run=serving.pk,
        dataset_version=tasks.pk,
        sessions=5,
        concurrency=3,
        noise=0.1,
        tolerates_questions=0.5,
        options={"max_turns": 3, "seed": 7},
    )
    assert response.status_code == 201, response.content
    run = Run.objects.get(pk=response.json()["id"])
    spec = SimulateSpec.model_validate(worker_spec(run))
    assert spec.base_url == f"http://127.0.0.1:8111/serve/{serving.pk}/v1"
    assert spec.feedback_url == "http://cp.example:8000/api/v1/" and spec.model_name == "crucible-tiny"
    assert spec.tasks_uri.startswith("file://") and spec.tasks_uri.endswith(".jsonl")
    assert (spec.sessions, spec.concurrency, spec.noise, spec.tolerates_questions, spec.max_turns, spec.seed) == (
        5,
        3,
        0.1,
        0.5,
        3,
        7,
    )
    assert run.spec["serve_run"] == serving.pk and run.progress_total == 5


def test_a_simulate_launch_needs_a_live_serving_run_and_repository_tasks(client_for, users, queued, run):  # type: ignore[no-untyped-def]
    serving = serve_run(users["operator"])
    tasks = _repo_tasks_version(users["operator"])
    cases = [
        ({"serve_run": run.pk}, "serve_run", "name a serving run"),
        ({"dataset_version": run.dataset_version_id}, "dataset_version", "repo_tasks"),
        ({"sessions": 0}, "sessions", "greater than or equal to 1"),
        ({"noise": 2}, "noise", "less than or equal to 1"),
        ({"options": {"max_turns": 0}}, "options.max_turns", "greater than or equal to 1"),
        ({"serve_run": 999_999}, "serve_run", "does not exist"),
    ]
    before = Run.objects.count()
    for change, field, words in cases:
        body = {"kind": "simulate", "serve_run": serving.pk, "dataset_version": tasks.pk, **change}
        response = client_for("operator").post("/api/v1/runs/", body, format="json")
        assert response.status_code == 400, (change, response.content)
        assert field in response.json()["fields"] and words in str(response.json()["fields"][field]), response.json()
    Run.objects.filter(pk=serving.pk).update(status="stopped")
    ended = launch(client_for, kind="simulate", serve_run=serving.pk, dataset_version=tasks.pk)
    assert ended.status_code == 400 and "has ended" in str(ended.json()["fields"]["serve_run"])
    assert Run.objects.count() == before


@pytest.fixture
def sessions_version(users):  # type: ignore[no-untyped-def]
    event = turn_event("s-1", 0)
    row = {"session_id": "s-1", "serve_run_id": 1, "turns": [event["turn"]], "started_at": 1.0, "ended_at": 2.0}
    dataset = dataset_create(name="rt-sessions", kind=DatasetKind.SESSIONS, owner=users["operator"])
    return dataset_version_create(
        dataset=dataset, data=(json.dumps(row) + "\n").encode(), filename="sessions.jsonl", created_by=users["operator"]
    )


@pytest.fixture
def session_reward(users):  # type: ignore[no-untyped-def]
    spec = {"terms": [{"type": "session_feedback"}]}
    return reward_config_create(name="rt-reward", description="", spec=spec, owner=users["operator"]).versions.get()


def test_session_training_from_the_deployed_checkpoint_keeps_its_base_model_for_evals(  # type: ignore[no-untyped-def]
    users, queued, sessions_version, session_reward, gate_with_deployment
):
    checkpoint = gate_with_deployment["deployment"].checkpoint
    run = session_train_launch(
        user=users["operator"],
        dataset_version=sessions_version,
        reward_version=session_reward,
        base_model=TINY,
        checkpoint=checkpoint,
        config={"learning_rate": 1e-5},
        baseline="task_type_mean",
        spec={"cycle": 3},
    )
    spec = SessionTrainSpec.model_validate(worker_spec(run))
    assert spec.checkpoint_uri == checkpoint.uri and spec.base_model == TINY and spec.config.base_model == TINY
    assert spec.config.learning_rate == 1e-5 and spec.baseline == "task_type_mean"
    assert spec.sessions_uri.endswith(".jsonl") and spec.output_prefix.endswith(f"runs/{run.pk}")
    assert run.spec["cycle"] == 3 and run.spec["config"]["base_model"] == TINY  # what evals read
    assert run.dataset_version == sessions_version and run.reward_version == session_reward


def test_session_training_is_refused_with_the_field_named(  # type: ignore[no-untyped-def]
    client_for, users, queued, sessions_version, session_reward
):
    exact = exact_answer_version(owner=users["operator"])
    trajectories = Dataset.objects.create(name="not-sessions", kind=DatasetKind.TRAJECTORIES, owner=users["operator"])
    wrong = DatasetVersion(
        dataset=trajectories, number=1, row_count=1, size_bytes=3, content_hash="1" * 64, created_by=users["operator"]
    )
    wrong.file.save("t.jsonl", ContentFile(b"{}\n"), save=True)
    base = {
        "kind": "sessiontrain",
        "dataset_version": sessions_version.pk,
        "reward_version": session_reward.pk,
        "base_model": TINY,
    }
    cases = [
        ({"reward_version": exact.pk}, "reward_version", "session_feedback"),
        ({"dataset_version": wrong.pk}, "dataset_version", "sessions dataset"),
        ({"config": {"base_model": "smollm2-135m-instruct"}}, "config.base_model", "leave this out"),
        ({"config": {"learning_rate": -1}}, "config.learning_rate", "greater than or equal to 0"),
        ({"baseline": "group_mean"}, "baseline", "not a valid choice"),
        ({"max_samples": 0}, "max_samples", "greater than or equal to 1"),
        ({"base_model": "gpt-17"}, "base_model", "unknown model"),
    ]
    for change, field, words in cases:
        response = launch(client_for, **{**base, **change})
        assert response.status_code == 400, (change, response.content)
        assert field in response.json()["fields"] and words in str(response.json()["fields"][field]), response.json()
    assert launch(client_for, **base).status_code == 201
