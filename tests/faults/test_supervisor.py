"""`make run` keeps its processes alive: a killed one comes back after a back-off, the others are not touched, and
runs on a Ray head the launcher stops end with that as their reason."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from controlplane.devstack import Supervisor, stop_session


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)


def _wait_exit(proc: subprocess.Popen[bytes]) -> None:
    proc.wait(timeout=10)


def test_a_killed_process_is_restarted_with_a_back_off_and_the_others_keep_running():
    said: list[str] = []
    supervisor = Supervisor()
    web = supervisor.add("web", _sleeper)
    head = supervisor.add("ray-head", _sleeper)
    try:
        os.kill(web.pid, signal.SIGKILL)
        _wait_exit(web)
        t0 = time.monotonic()
        said += supervisor.tick(now=t0)
        assert said == ["web exited with -9; restarting it in 1s"]
        assert supervisor.tick(now=t0 + 0.5) == []  # not yet due
        said += supervisor.tick(now=t0 + 1.1)
        assert said[-1] == "web restarted (restart 1)"
        new_web = supervisor.items["web"].proc
        assert new_web.pid != web.pid and new_web.poll() is None
        assert supervisor.items["ray-head"].proc is head and head.poll() is None  # untouched
        # dying again at once doubles the back-off
        os.kill(new_web.pid, signal.SIGKILL)
        _wait_exit(new_web)
        assert supervisor.tick(now=t0 + 2) == ["web exited with -9; restarting it in 2s"]
    finally:
        for item in supervisor.items.values():
            stop_session(item.proc.pid, timeout=2)


def test_a_process_that_cannot_start_is_retried_not_fatal():
    attempts: list[int] = []

    def start() -> subprocess.Popen[bytes]:
        attempts.append(1)
        if len(attempts) == 2:
            raise OSError("port in use")
        return _sleeper()

    supervisor = Supervisor()
    first = supervisor.add("worker", start)
    try:
        os.kill(first.pid, signal.SIGKILL)
        _wait_exit(first)
        supervisor.tick(now=0)
        assert "could not be started (port in use)" in supervisor.tick(now=5)[0]
        assert supervisor.tick(now=100)[0] == "worker restarted (restart 1)"
    finally:
        stop_session(supervisor.items["worker"].proc.pid, timeout=2)


@pytest.mark.django_db
def test_runs_on_a_stopped_launchers_cluster_end_with_that_reason(run):
    from apps.runs.models import Run, RunStatus
    from apps.runs.services.lifecycle import runs_stopped_with_cluster

    address = "http://127.0.0.1:8265"
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, ray_job_id=run.submission_id, ray_address=address)
    assert runs_stopped_with_cluster(ray_address="http://elsewhere:8265") == []
    assert runs_stopped_with_cluster(ray_address=address) == [run.pk]
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and "launcher (make run) was stopped" in run.failure_reason


def test_an_embedded_data_dir_from_an_older_postgresql_is_refused_with_the_fix(tmp_path):
    from controlplane.devstack import start_embedded_postgres

    (tmp_path / "pg").mkdir()
    (tmp_path / "pg" / "PG_VERSION").write_text("16\n")
    with pytest.raises(SystemExit, match=r"PostgreSQL 16 cluster.*mv .*pg-old"):
        start_embedded_postgres(tmp_path / "pg")
