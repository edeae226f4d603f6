"""The run queue (apps.runs.services.queue): a training run goes to Ray only when the cluster and its owner's GPU
quota can hold it; until then it is queued with its position and what it waits for; a run that can never fit is
refused at launch naming the resource. The cluster here is declared (CRUCIBLE_CLUSTER_NODES, as a team sharing a
cluster would); Ray's submission is recorded, not made (a test with the real Celery workers and Ray head is
tests/test_e2e.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction

from apps.runs import services
from apps.runs.models import Run, RunStatus
from apps.runs.services import lifecycle, queue
from tests.factories import exact_answer_version, tasks_version
from workers.envs.registry import arithmetic_tasks

pytestmark = pytest.mark.django_db(transaction=True)

TINY = {"base_model": "tiny-llama-smollm2-tokenizer", "steps": 2, "prompts_per_step": 2, "group_size": 2}
CLUSTER = '[{"CPU": 8, "GPU": 2, "memory_gb": 64}]'


@pytest.fixture
def cluster(settings, monkeypatch):  # type: ignore[no-untyped-def]
    """A declared two-GPU node; Celery's queue runs inline; Ray's submission is recorded."""
    settings.CLUSTER_NODES = CLUSTER
    submitted: list[str] = []

    def submit(*, submission_id: str, module: str, env_vars: dict[str, str], address: str | None = None) -> str:
        submitted.append(submission_id)
        return submission_id

    monkeypatch.setattr("apps.runs.ray_jobs.submit", submit)
    monkeypatch.setattr("apps.runs.tasks.dispatch_run.delay", lambda run_id: services.run_dispatch(run_id=run_id))
    monkeypatch.setattr("apps.runs.tasks.admit_queued_runs.delay", lambda: services.run_admit_queued())
    return submitted


@pytest.fixture
def launch(users, client_for) -> Callable[..., Any]:  # type: ignore[no-untyped-def]
    owner = users["operator"]
    tasks = tasks_version(owner=owner, rows=arithmetic_tasks(8, seed=0))
    reward = exact_answer_version(owner=owner)

    def make(
        gpus: float = 1, role: str = "operator", priority: int | None = None, compute: dict[str, Any] | None = None
    ) -> Any:
        body: dict[str, Any] = {
            "kind": "train",
            "dataset_version": tasks.pk,
            "reward_version": reward.pk,
            "config": {**TINY, "compute": compute or {"cpus": 1, "gpus": gpus, "memory_gb": 8}},
        }
        if priority is not None:
            body["priority"] = priority
        return client_for(role).post("/api/v1/runs/", body, format="json")

    return make


def _finish(run_id: int) -> None:
    with transaction.atomic():
        lifecycle.finish(Run.objects.select_for_update().get(pk=run_id), RunStatus.SUCCEEDED)


def _state(run_id: int) -> tuple[str, int | None]:
    run = Run.objects.get(pk=run_id)
    from apps.runs.selectors import queue_position

    return run.status, queue_position(run)


def test_runs_wait_in_the_queue_in_order_and_start_when_resources_free_up(cluster, launch, client_for) -> None:  # type: ignore[no-untyped-def]
    first, second = launch(gpus=1).json(), launch(gpus=1).json()
    third = launch(gpus=2).json()
    fourth = launch(gpus=1).json()
    assert Run.objects.get(pk=first["id"]).resources["total"]["GPU"] == 1.0
    assert [_state(r["id"]) for r in (first, second, third, fourth)] == [
        ("pending", None),
        ("pending", None),
        ("queued", 1),
        ("queued", 2),  # it would fit after one run ends, but it does not jump the run ahead of it
    ]
    assert len(cluster) == 2  # only the admitted runs went to Ray
    shown = client_for("viewer").get(f"/api/v1/runs/{third['id']}/").json()
    assert shown["status"] == "queued" and shown["queue_position"] == 1
    assert shown["queued_reason"].startswith("waiting for 2 GPU more: CRUCIBLE_CLUSTER_NODES has 8 CPU, 2 GPU")
    assert "behind run" in Run.objects.get(pk=fourth["id"]).queued_reason

    _finish(first["id"])
    assert _state(third["id"]) == ("queued", 1)  # 1 GPU free, it needs 2
    _finish(second["id"])
    assert _state(third["id"]) == ("pending", None) and _state(fourth["id"]) == ("queued", 1)
    _finish(third["id"])
    assert _state(fourth["id"]) == ("pending", None)
    assert sorted(cluster) == sorted(Run.objects.get(pk=r["id"]).submission_id for r in (first, second, third, fourth))


def test_a_run_the_cluster_can_never_hold_is_refused_naming_the_resource(cluster, launch) -> None:  # type: ignore[no-untyped-def]
    before = Run.objects.count()
    reply = launch(gpus=3)
    assert reply.status_code == 400
    [message] = reply.json()["fields"]["config.compute"]
    assert "no node has that much GPU" in message and "CRUCIBLE_CLUSTER_NODES has 8 CPU, 2 GPU, 64 GB memory" in message
    split = {
        "placement": "split",
        "per_rank": {"cpus": 1, "memory_gb": 8},
        "per_engine": {"cpus": 1, "custom": {"engine_node": 1}},
    }
    reply = launch(compute=split)
    [message] = reply.json()["fields"]["config.compute"]
    assert reply.status_code == 400 and "no node has that much engine_node" in message
    reply = launch(compute={**split, "rollout_workers": 8, "per_engine": {"cpus": 1}})
    assert reply.status_code == 400 and "cannot hold them all at once" in reply.json()["fields"]["config.compute"][0]
    assert Run.objects.count() == before  # nothing was made


def test_priority_puts_a_run_ahead_and_only_admins_may_raise_it(cluster, launch, client_for, users) -> None:  # type: ignore[no-untyped-def]
    running = launch(gpus=2).json()
    waiting = launch(gpus=1).json()
    assert launch(gpus=1, priority=5).status_code == 403  # an operator
    urgent = launch(gpus=1, role="admin", priority=5).json()
    assert _state(urgent["id"]) == ("queued", 1) and _state(waiting["id"]) == ("queued", 2)
    reply = client_for("operator").post(f"/api/v1/runs/{waiting['id']}/priority/", {"priority": -3}, format="json")
    assert reply.status_code == 200 and reply.json()["priority"] == -3
    assert client_for("viewer").post(f"/api/v1/runs/{waiting['id']}/priority/", {"priority": 0}).status_code == 403
    reply = client_for("admin").post(f"/api/v1/runs/{waiting['id']}/priority/", {"priority": 11}, format="json")
    assert reply.status_code == 400 and "priority" in reply.json()["fields"]
    _finish(running["id"])
    assert _state(urgent["id"])[0] == "pending" and _state(waiting["id"])[0] == "pending"


def test_a_queued_run_can_be_cancelled_and_the_queue_moves_up(cluster, launch, client_for) -> None:  # type: ignore[no-untyped-def]
    launch(gpus=2)
    a, b = launch(gpus=1).json(), launch(gpus=1).json()
    reply = client_for("operator").post(f"/api/v1/runs/{a['id']}/cancel/")
    assert reply.status_code == 202 and reply.json()["status"] == "stopped"
    assert "before it was submitted" in Run.objects.get(pk=a["id"]).failure_reason
    assert _state(b["id"]) == ("queued", 1)


def test_the_gpu_quota_refuses_what_it_can_never_allow_and_queues_the_rest(  # type: ignore[no-untyped-def]
    cluster, launch, users, settings
) -> None:
    operator = users["operator"]
    operator.gpu_quota = 1
    operator.save()
    reply = launch(gpus=2)
    assert reply.status_code == 400 and "operator-user's GPU quota is 1" in reply.json()["fields"]["config.compute"][0]
    mine = launch(gpus=1).json()
    mine_too = launch(gpus=1).json()
    assert _state(mine["id"])[0] == "pending" and _state(mine_too["id"])[0] == "queued"
    assert "waiting for operator-user's GPU quota: 1 of 1 GPU held" in Run.objects.get(pk=mine_too["id"]).queued_reason
    theirs = launch(gpus=1, role="admin").json()  # a run waiting on its owner's quota blocks nobody else
    assert _state(theirs["id"])[0] == "pending"
    settings.GPU_QUOTA = 1
    assert queue.quota_of(users["admin"]) == 1 and queue.quota_of(operator) == 1
    _finish(mine["id"])
    assert _state(mine_too["id"])[0] == "pending"


def test_without_a_known_cluster_runs_go_to_ray_at_once(cluster, launch, settings) -> None:  # type: ignore[no-untyped-def]
    settings.CLUSTER_NODES = ""
    settings.RAY_ADDRESS = "http://127.0.0.1:9"  # nothing answers: capacity unknown
    queue.forget_capacity()
    runs = [launch(gpus=2).json() for _ in range(2)]
    assert [_state(r["id"])[0] for r in runs] == ["pending", "pending"] and len(cluster) == 2


def test_a_malformed_cluster_declaration_names_the_setting() -> None:
    with pytest.raises(ImproperlyConfigured, match="CRUCIBLE_CLUSTER_NODES"):
        queue.declared_nodes('{"CPU": 8}')
    assert queue.declared_nodes('[{"CPU": 8, "memory_gb": 1}]') == [{"CPU": 8.0, "memory": 1024.0**3}]


def test_many_dispatches_at_once_never_overfill_the_cluster_or_submit_a_run_twice(cluster, launch, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr("apps.runs.tasks.dispatch_run.delay", lambda run_id: None)  # dispatched by the threads below
    ids = [launch(gpus=1).json()["id"] for _ in range(6)]
    errors: list[BaseException] = []

    def worker() -> None:  # as two Celery workers would, each taking every message once
        try:
            for run_id in ids:
                services.run_dispatch(run_id=run_id)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    admitted = Run.objects.filter(admitted_at__isnull=False)
    assert admitted.count() == 2 and Run.objects.filter(status=RunStatus.QUEUED).count() == 4
    assert sorted(cluster) == sorted(run.submission_id for run in admitted)  # each once


def test_the_queue_message_names_no_internal_address_and_no_fraction_of_a_gigabyte(  # type: ignore[no-untyped-def]
    cluster, launch, settings, monkeypatch
) -> None:
    from apps.runs.ray_jobs import RayNode
    from workers.rl.placement import GB, describe

    assert describe({"CPU": 1 / 3, "memory": 0.084 * GB}) == "0.33 CPU, 86 MB memory"
    assert describe({"memory": 3.5 * GB}) == "3.5 GB memory" and describe({"memory": 64 * GB}) == "64 GB memory"
    # Capacity from Ray itself (nothing declared): the launch error may name the address, the run page does not.
    settings.CLUSTER_NODES = ""
    settings.RAY_ADDRESS = "http://10.0.0.7:8265"
    queue._cache.clear()
    node = RayNode("n1", "10.0.0.7", True, True, {"CPU": 8.0, "GPU": 2.0, "memory": 64 * GB})
    monkeypatch.setattr("apps.runs.ray_jobs.nodes", lambda timeout=3: [node])
    first, second = launch(gpus=2).json(), launch(gpus=2).json()
    assert _state(first["id"]) == ("pending", None) and _state(second["id"]) == ("queued", 1)
    reason = Run.objects.get(pk=second["id"]).queued_reason
    assert reason.startswith("waiting for 2 GPU more: the Ray cluster has 8 CPU, 2 GPU, 64 GB memory"), reason
    assert "10.0.0.7" not in reason and "8265" not in reason
