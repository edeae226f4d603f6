"""The stall watchdog (apps/runs/stall.py): silent runs are marked stalled with their processes' stack dumps, live
ones never are, a run that talks again recovers; the API, the list filter, the webhook and the launch check."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.runs import ray_jobs, services, stall
from apps.runs.models import Run, RunStatus
from apps.webhooks.models import WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db


def _running(run: Run, *, silent_for: float, limit: int | None = 60) -> Run:
    config = {"stall_after_seconds": limit} if limit is not None else {}
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.RUNNING,
        spec={**run.spec, "config": config},
        started_at=timezone.now() - timedelta(hours=1),
        last_event_at=timezone.now() - timedelta(seconds=silent_for),
    )
    run.refresh_from_db()
    return run


def test_only_runs_silent_past_their_own_limit_are_picked(run, settings):
    _running(run, silent_for=30, limit=60)
    assert stall.silent_runs() == []  # slow but live: 30 s of silence under a 60 s limit
    _running(run, silent_for=90, limit=60)
    assert stall.silent_runs() == [run.pk]
    settings.STALL_SECONDS = 120
    _running(run, silent_for=90, limit=None)  # no limit in its spec: the setting's
    assert stall.silent_runs() == []
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    assert stall.silent_runs() == []


def test_a_silent_run_is_marked_with_the_reason_and_a_webhook_and_recovers_when_it_talks(run, users, client_for):
    endpoint = WebhookEndpoint.objects.create(
        url="https://hooks.example.com/crucible", events=["run.stalled"], created_by=users["admin"]
    )
    _running(run, silent_for=600, limit=60)
    marked = stall.run_mark_stalled(run_id=run.pk)
    assert marked.stalled_at is not None
    assert marked.stall_report.startswith("No event for 600 s (limit 60 s)")
    assert "no Ray job was submitted" in marked.stall_report  # a dump that cannot be taken: the state stands
    [delivery] = WebhookDelivery.objects.filter(endpoint=endpoint)
    assert delivery.event == "run.stalled" and delivery.payload["run"]["id"] == run.pk
    assert stall.run_mark_stalled(run_id=run.pk).stalled_at == marked.stalled_at  # a duplicate task: no change
    assert WebhookDelivery.objects.count() == 1

    api = client_for("viewer")
    assert api.get(f"/api/v1/runs/{run.pk}/").json()["stalled_at"] is not None
    assert [r["id"] for r in api.get("/api/v1/runs/?stalled=true").json()["results"]] == [run.pk]
    assert api.get("/api/v1/runs/?stalled=false").json()["results"] == []
    assert api.get("/api/v1/runs/?stalled=perhaps").status_code == 400

    from workers.events import EventBatch

    batch = EventBatch.model_validate({"events": [{"seq": 1, "kind": "progress", "done": 1, "total": 2}]}).events
    services.ingest_batch(run_id=run.pk, events=batch, publish=False)
    run.refresh_from_db()
    assert run.stalled_at is None and run.stall_report.startswith("Recovered at")
    assert stall.silent_runs() == []


def test_the_dump_of_a_hanging_local_process_names_the_function_it_hangs_in():
    program = (
        "import time\ndef hang_in_the_environment():\n    while True:\n        time.sleep(0.5)\n"
        "hang_in_the_environment()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", program])
    try:
        time.sleep(1.0)
        process = ray_jobs.JobProcess("driver", proc.pid, "", "127.0.0.1")
        # No Ray cluster answers at this address: the dump falls back to py-spy on this machine.
        dump = stall.stack_dump(process, address="http://127.0.0.1:1")
        assert "hang_in_the_environment" in dump, dump
    finally:
        proc.kill()
        proc.wait()
    gone = stall.stack_dump(ray_jobs.JobProcess("driver", proc.pid, "", "127.0.0.1"), address="http://127.0.0.1:1")
    assert gone.startswith("no dump:") and f"no process {proc.pid}" in gone


def test_a_stopped_process_is_dumped_without_suspending_it():
    """py-spy suspends the process it reads unless told not to, and cannot suspend one that is already stopped
    (SIGSTOP, a debugger): the dump must still name where it stopped."""
    import signal

    program = "import time\ndef stopped_in_here():\n    while True:\n        time.sleep(0.2)\nstopped_in_here()\n"
    proc = subprocess.Popen([sys.executable, "-c", program])
    try:
        time.sleep(1.0)
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(0.2)
        dump = stall.stack_dump(ray_jobs.JobProcess("driver", proc.pid, "", "127.0.0.1"), address="http://127.0.0.1:1")
        assert "stopped_in_here" in dump, dump
    finally:
        proc.kill()
        proc.wait()


def test_a_failed_dump_keeps_py_spys_whole_message(tmp_path, monkeypatch):
    """The message's head (the error) and tail (its causes) both reach the report, however long it is."""
    head = "Error: Failed to get stack traces"
    tail = "1: the last cause, which names the real problem"
    fake = tmp_path / "py-spy"
    fake.write_text(
        f"#!/bin/sh\necho '{head}' >&2\nprintf 'x%.0s' $(seq 1 800) >&2\necho >&2\necho '{tail}' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(RuntimeError) as failed:
        stall.py_spy_dump(os.getpid())
    message = str(failed.value)
    assert message.startswith(head) and message.endswith(tail) and len(message) > 800, message


def test_the_dashboards_refusal_is_kept_whole(monkeypatch):
    long = "py-spy on the node: " + "y" * 600 + " the end of the reason"

    class Answer:
        status_code = 500
        text = long

    class Client:
        def _do_request(self, method: str, path: str) -> Answer:
            return Answer()

    monkeypatch.setattr(ray_jobs, "_client", lambda address: Client())
    with pytest.raises(ray_jobs.RayUnavailable) as refused:
        ray_jobs.traceback(ray_jobs.JobProcess("driver", 1, "n", ""), address="http://127.0.0.1:1")
    assert str(refused.value).endswith("the end of the reason")


def test_the_limit_is_the_phase_the_job_said_it_is_in(run, settings):
    from apps.runs import services
    from workers.events import EventBatch

    _running(run, silent_for=90, limit=600)
    spec = {**run.spec, "config": {"stall_after_seconds": 600, "stall_limits": {"weight_sync": 60}}}
    Run.objects.filter(pk=run.pk).update(spec=spec)
    assert stall.silent_runs() == []  # no phase yet: 600 s
    events = EventBatch.model_validate(
        {"events": [{"seq": 1, "kind": "progress", "done": 1, "total": 4, "phase": "weight_sync"}]}
    ).events
    services.ingest_batch(run_id=run.pk, events=events, publish=False)
    run.refresh_from_db()
    assert run.phase == "weight_sync" and stall.stall_limit(run) == 60
    Run.objects.filter(pk=run.pk).update(last_event_at=timezone.now() - timedelta(seconds=90))
    assert stall.silent_runs() == [run.pk]  # 90 s into a weight sync allowed 60
    with pytest.raises(Exception, match="phase"):
        EventBatch.model_validate({"events": [{"seq": 2, "kind": "progress", "done": 1, "total": 4, "phase": "nap"}]})
