"""What the control plane does with a job it can no longer ask: the worker's own outcome wins over a guess, the
reason names the cause, late events are stored once and counted, and a resume finds the latest checkpoint in the
run's lineage, even one whose report was lost."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from apps.runs import ray_jobs, services
from apps.runs.models import Checkpoint, MetricPoint, Run, RunStatus
from apps.runs.services.lifecycle import explain_ray_failure
from workers.events import EVENTS_LIST
from workers.storage import run_key

pytestmark = pytest.mark.django_db


def _ingest(run: Run, events: list[dict]) -> int:  # type: ignore[type-arg]
    """What the ingest endpoint stores (tests/apps/runs/test_ingest.py covers the HTTP side); returns accepted."""
    return services.ingest_batch(run_id=run.pk, events=EVENTS_LIST.validate_python(events)).accepted


def _lost(monkeypatch):  # type: ignore[no-untyped-def]
    def state(job_id, address=None):  # type: ignore[no-untyped-def]
        raise ray_jobs.RayJobNotFound(job_id)

    monkeypatch.setattr(ray_jobs, "state", state)


def test_a_job_ray_lost_after_the_worker_reported_success_is_marked_succeeded(run, monkeypatch):
    _lost(monkeypatch)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, ray_job_id=run.submission_id)
    assert _ingest(run, [{"seq": 1, "kind": "end", "outcome": "succeeded"}]) == 1
    run = services.run_reconcile(run_id=run.pk)
    assert run.status == RunStatus.SUCCEEDED and run.failure_reason == ""


def test_a_job_ray_lost_without_a_word_from_the_worker_fails_with_the_cause(run, monkeypatch):
    _lost(monkeypatch)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, ray_job_id=run.submission_id)
    run = services.run_reconcile(run_id=run.pk)
    assert run.status == RunStatus.FAILED
    assert "cluster was restarted or replaced" in run.failure_reason and "launcher" in run.failure_reason


def test_a_job_that_reported_its_own_failure_keeps_its_error(run, monkeypatch):
    _lost(monkeypatch)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, ray_job_id=run.submission_id)
    _ingest(run, [{"seq": 1, "kind": "end", "outcome": "failed", "error": "ValueError: bad shard"}])
    run = services.run_reconcile(run_id=run.pk)
    assert run.status == RunStatus.FAILED and run.failure_reason == "the job failed: ValueError: bad shard"


@pytest.mark.parametrize(
    ("message", "words"),
    [
        ("Job entrypoint command failed with exit code -9", "SIGKILL"),
        ("Job entrypoint command failed with exit code 137", "out-of-memory"),
        ("Job entrypoint command failed with exit code -15", "SIGTERM"),
        ("Job entrypoint command failed with exit code 1", None),
    ],
)
def test_a_ray_failure_says_what_an_exit_code_means(message, words):
    explained = explain_ray_failure(message)
    assert explained.startswith(message)
    assert (words in explained) if words else explained == message


def test_events_for_an_ended_run_are_stored_once_and_counted_as_late(run):
    Run.objects.filter(pk=run.pk).update(status=RunStatus.FAILED)
    batch = [
        {"seq": 1, "kind": "metric", "step": 3, "values": {"loss": 0.5}},
        {"seq": 2, "kind": "log", "lines": ["x"]},
    ]
    assert _ingest(run, batch) == 2
    assert _ingest(run, batch) == 0  # a second replay adds nothing
    run.refresh_from_db()
    assert run.late_events == 2 and run.status == RunStatus.FAILED
    assert MetricPoint.objects.filter(run=run).count() == 1


# --- resume along a lineage ----------------------------------------------------------------------------------
TINY = {"base_model": "tiny-llama-smollm2-tokenizer", "steps": 6, "prompts_per_step": 2, "group_size": 2}


@pytest.fixture
def train_run(users, monkeypatch):  # type: ignore[no-untyped-def]
    from apps.training.services import run_launch_train
    from tests.factories import exact_answer_version, tasks_version
    from workers.envs.registry import arithmetic_tasks

    monkeypatch.setattr("apps.runs.tasks.dispatch_run.delay", lambda run_id: None)
    owner = users["operator"]
    run = run_launch_train(
        created_by=owner,
        dataset_version=tasks_version(owner=owner, rows=arithmetic_tasks(8, seed=0)),
        reward_version=exact_answer_version(owner=owner),
        config=TINY,
    )
    shutil.rmtree(default_storage.path(f"runs/{run.pk}"), ignore_errors=True)
    yield run
    shutil.rmtree(default_storage.path(f"runs/{run.pk}"), ignore_errors=True)


def _write_checkpoint(
    run: Run, step: int, *, checksum: bool = True, corrupt: bool = False, owner: str | None = None
) -> None:
    blob = f"weights of run {run.pk} at step {step}".encode() * 100
    name = f"runs/{run.pk}/checkpoints/step-{step:06d}.pt"
    default_storage.save(name, ContentFile(blob[:-10] if corrupt else blob))
    if checksum:
        key = run_key(services.ingest_token_for(run) if owner is None else owner)
        meta = {"sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob), "run_key": key}
        default_storage.save(name + ".sha256", ContentFile(json.dumps(meta).encode()))


def test_resume_finds_a_checkpoint_whose_report_was_lost_and_skips_a_torn_one(train_run, users, client_for):
    Run.objects.filter(pk=train_run.pk).update(status=RunStatus.FAILED)
    Checkpoint.objects.create(run=train_run, step=2, uri="file:///x/step-000002.pt")
    _write_checkpoint(train_run, 2)
    _write_checkpoint(train_run, 4)  # written whole, its event never arrived
    _write_checkpoint(train_run, 5, corrupt=True)  # cut short by the kill
    _write_checkpoint(train_run, 6, checksum=False)  # the kill came before its checksum
    _write_checkpoint(train_run, 7, owner="cri_another_database")  # left by an earlier run with the same id
    reply = client_for("operator").post(f"/api/v1/runs/{train_run.pk}/resume/")
    assert reply.status_code == 201, reply.json()
    child = Run.objects.get(pk=reply.json()["id"])
    assert child.spec["resume_from"]["step"] == 4
    assert sorted(train_run.checkpoints.values_list("step", flat=True)) == [2, 4]


def test_a_resumed_run_that_died_before_its_first_checkpoint_resumes_from_its_parents(train_run, client_for):
    api = client_for("operator")
    Run.objects.filter(pk=train_run.pk).update(status=RunStatus.FAILED)
    Checkpoint.objects.create(run=train_run, step=3, uri="file:///x/step-000003.pt")
    child = Run.objects.get(pk=api.post(f"/api/v1/runs/{train_run.pk}/resume/").json()["id"])
    Run.objects.filter(pk=child.pk).update(status=RunStatus.FAILED)  # died before writing anything
    reply = api.post(f"/api/v1/runs/{child.pk}/resume/")
    assert reply.status_code == 201, reply.json()
    grandchild = Run.objects.get(pk=reply.json()["id"])
    assert grandchild.parent_id == child.pk and grandchild.spec["resume_from"]["step"] == 3
    # once the child writes a later checkpoint, that one wins
    Run.objects.filter(pk=grandchild.pk).update(status=RunStatus.FAILED)
    Checkpoint.objects.create(run=child, step=5, uri="file:///x/step-000005.pt")
    again = api.post(f"/api/v1/runs/{grandchild.pk}/resume/")
    assert again.status_code == 201 and Run.objects.get(pk=again.json()["id"]).spec["resume_from"]["step"] == 5


def _write_sharded_checkpoint(run: Run, step: int, *, torn: bool = False) -> None:
    """A sharded checkpoint's folder (two ranks' shards and the metadata) and its manifest of checksums; `torn`:
    one shard was cut short after the manifest was computed."""
    folder = f"runs/{run.pk}/checkpoints/step-{step:06d}.dcp"
    files = {
        name: f"{name} of run {run.pk} at step {step}".encode() * 50
        for name in ("__0_0.distcp", "__1_0.distcp", ".metadata")
    }
    for name, blob in files.items():
        default_storage.save(f"{folder}/{name}", ContentFile(blob[:-5] if torn and name == "__1_0.distcp" else blob))
    meta = {
        "files": {
            name: {"sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob)} for name, blob in files.items()
        },
        "run_key": run_key(services.ingest_token_for(run)),
    }
    default_storage.save(folder + ".sha256", ContentFile(json.dumps(meta).encode()))


def test_resume_finds_a_whole_sharded_checkpoint_and_skips_one_with_a_torn_shard(train_run, client_for):
    Run.objects.filter(pk=train_run.pk).update(status=RunStatus.FAILED)
    _write_checkpoint(train_run, 2)
    _write_sharded_checkpoint(train_run, 4)
    _write_sharded_checkpoint(train_run, 6, torn=True)
    reply = client_for("operator").post(f"/api/v1/runs/{train_run.pk}/resume/")
    assert reply.status_code == 201, reply.json()
    child = Run.objects.get(pk=reply.json()["id"])
    assert child.spec["resume_from"]["step"] == 4
    assert child.spec["resume_from"]["uri"].endswith(f"runs/{train_run.pk}/checkpoints/step-000004.dcp")
