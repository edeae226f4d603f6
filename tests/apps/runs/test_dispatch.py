from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.runs import services
from apps.runs.models import Run, RunStatus
from apps.runs.services import lifecycle
from apps.training import services as training_services
from tests.factories import context1_version, trajectories_version

pytestmark = pytest.mark.django_db


def test_launch_dispatches_only_after_the_row_commits(
    users, trajectories_jsonl, django_capture_on_commit_callbacks, monkeypatch
):
    queued: list[int] = []
    monkeypatch.setattr("apps.runs.tasks.dispatch_run.delay", queued.append)
    owner = users["operator"]
    dataset_version = trajectories_version(owner=owner, data=trajectories_jsonl)
    reward_version = context1_version(owner=owner)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        run = training_services.run_launch_rescore(
            created_by=owner, dataset_version=dataset_version, reward_version=reward_version
        )
        assert queued == []
    assert len(callbacks) >= 1
    assert queued == [run.pk]


def test_a_ray_cluster_that_does_not_answer_fails_the_run_with_that_reason(run, settings):
    settings.RAY_ADDRESS = "http://127.0.0.1:1"
    services.run_dispatch(run_id=run.pk, final_attempt=True)
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert "127.0.0.1:1" in run.failure_reason
    assert run.finished_at is not None


def test_a_cluster_silent_past_the_limit_fails_a_running_row(run, settings):
    settings.RAY_ADDRESS = "http://127.0.0.1:1"
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.RUNNING,
        ray_job_id=run.submission_id,
        ray_address="http://127.0.0.1:1",
        ray_checked_at=timezone.now(),
    )
    assert services.run_reconcile(run_id=run.pk).status == RunStatus.RUNNING
    later = timezone.now() + lifecycle.RAY_SILENCE_LIMIT + timedelta(seconds=1)
    run = services.run_reconcile(run_id=run.pk, now=later)
    assert run.status == RunStatus.FAILED
    assert "has not answered" in run.failure_reason


def test_cancelling_before_submission_stops_the_run_and_a_second_cancel_is_refused(run, users):
    from rest_framework.exceptions import ValidationError

    services.run_cancel(run=run, user=users["operator"])
    run.refresh_from_db()
    assert run.status == RunStatus.STOPPED
    with pytest.raises(ValidationError):
        services.run_cancel(run=run, user=users["operator"])


def test_a_dispatch_after_cancel_submits_nothing(run, settings):
    settings.RAY_ADDRESS = "http://127.0.0.1:1"  # would fail loudly if it tried
    Run.objects.filter(pk=run.pk).update(cancel_requested_at=timezone.now())
    assert services.run_dispatch(run_id=run.pk).status == RunStatus.STOPPED


def test_the_worker_spec_is_self_contained(run):
    spec = services.worker_spec(run)
    assert spec["input_uri"].startswith("file://")
    assert spec["reward"] == run.reward_version.spec
    assert spec["ingest_url"].endswith(f"/api/v1/runs/{run.pk}/ingest/")
    assert "token" not in str(spec).lower()


def test_a_cluster_that_accepts_connections_but_never_answers_fails_the_run_instead_of_hanging(run, settings):
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts (the kernel completes the handshake) and never replies
    try:
        settings.RAY_ADDRESS = f"http://127.0.0.1:{silent.getsockname()[1]}"
        settings.RAY_SUBMIT_TIMEOUT = 1
        services.run_dispatch(run_id=run.pk, final_attempt=True)
    finally:
        silent.close()
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert "did not answer" in run.failure_reason and "CRUCIBLE_RAY_TIMEOUT" in run.failure_reason


def test_a_cancel_that_lands_during_submission_stops_the_job_just_submitted(
    run, users, monkeypatch, django_capture_on_commit_callbacks
):
    from apps.runs import ray_jobs

    stops: list[int] = []
    monkeypatch.setattr("apps.runs.tasks.cancel_run.delay", stops.append)

    def submit(**kwargs):  # type: ignore[no-untyped-def]
        # The user cancels while the (slow) submission is in flight: the row is not locked meanwhile.
        services.run_cancel(run=run, user=users["operator"])
        return kwargs["submission_id"]

    monkeypatch.setattr(ray_jobs, "submit", submit)
    with django_capture_on_commit_callbacks(execute=True):
        services.run_dispatch(run_id=run.pk)
    run.refresh_from_db()
    assert run.status == RunStatus.STOPPED
    assert run.ray_job_id == run.submission_id
    assert stops == [run.pk]


def test_reconcile_re_sends_a_stop_that_was_lost(run, monkeypatch):
    from apps.runs import ray_jobs

    stopped: list[str] = []
    monkeypatch.setattr(ray_jobs, "stop", lambda job_id, address=None: stopped.append(job_id) or True)
    monkeypatch.setattr(ray_jobs, "state", lambda job_id, address=None: ray_jobs.RayJobState("RUNNING", ""))
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.RUNNING, ray_job_id=run.submission_id, cancel_requested_at=timezone.now()
    )
    services.run_reconcile(run_id=run.pk)
    assert stopped == [run.submission_id]


def test_submission_ids_differ_for_two_runs_that_share_a_primary_key(run):
    other = Run(pk=run.pk, ingest_nonce="f" * 32)
    assert run.submission_id != other.submission_id
    assert run.submission_id.startswith(f"crucible-run-{run.pk}-")
