"""Kill the stack's processes with SIGKILL during a real training run and count what survives.

The stack here is what `make run` supervises: daphne, a Celery worker (with beat), Redis (its own, embedded, so it
can be killed) and a local Ray head, with `controlplane.devstack.Supervisor` restarting what dies. The run is GRPO
on the tiny model. Events are counted by their sequence numbers (`apps.runs.selectors.event_accounting`): every seq
up to the worker's own `end` event stored once, none missing, none twice.

bench/fault_drill.py runs the same drill against a live `make run` and prints the figures.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings as django_settings

from controlplane import devstack

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
STEPS = 24  # a tiny model's steps take a fraction of a second: enough of them to kill the job mid-run
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def stack(tmp_path_factory, django_db_setup, django_db_blocker):  # type: ignore[no-untyped-def]
    var = tmp_path_factory.mktemp("faults-var")
    db = django_settings.DATABASES["default"]
    host = db["HOST"] or "127.0.0.1"
    database_url = f"postgresql://{db['USER']}@/{db['NAME']}?host={host}&port={db['PORT'] or 5432}"
    redis_url, redis_proc = devstack.start_embedded_redis(var / "redis")
    redis_port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    spool = var / "spool"
    head = devstack.start_ray_head(
        var,
        gcs_port=devstack.free_port(),
        dashboard_port=devstack.free_port(),
        env={"CRUCIBLE_SPOOL_DIR": str(spool)},
    )
    web_port = devstack.free_port()
    env = {
        **os.environ,
        **devstack.ray_client_env(var),
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "RAY_ADDRESS": head.address,
        "CRUCIBLE_PUBLIC_URL": f"http://127.0.0.1:{web_port}",
        "CRUCIBLE_MEDIA_ROOT": str(django_settings.MEDIA_ROOT),
        "CRUCIBLE_RECONCILE_SECONDS": "1",
        "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
    }
    procs = devstack.ProcessGroup(var / "log")
    supervisor = devstack.Supervisor(pid_file=var / "pids.json")
    said: list[str] = []
    stopping = threading.Event()
    celery = [str(BIN / "celery"), "-A", "controlplane", "worker", "-B", "--concurrency=1", "--loglevel=INFO"]
    supervisor.add(
        "web",
        lambda: procs.start(
            "web",
            [str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(web_port), "controlplane.asgi:application"],
            env=env,
        ),
    )
    supervisor.add("worker", lambda: procs.start("worker", [*celery, "--schedule", str(var / "beat")], env=env))
    supervisor.add("redis", lambda: devstack.start_embedded_redis(var / "redis", redis_port)[1], redis_proc)

    def supervise() -> None:
        while not stopping.wait(0.3):
            said.extend(supervisor.tick())

    thread = threading.Thread(target=supervise, daemon=True)
    thread.start()
    try:
        devstack.wait_for_port("127.0.0.1", web_port, timeout=60)
        yield {
            "web": f"http://127.0.0.1:{web_port}",
            "web_port": web_port,
            "redis_port": redis_port,
            "supervisor": supervisor,
            "said": said,
            "var": var,
            "spool": spool,
        }
    finally:
        stopping.set()
        thread.join()
        for item in supervisor.items.values():
            devstack.stop_session(item.proc.pid)
        head.stop()


def _api(operator: Any, stack: dict[str, Any], name: str) -> httpx.Client:
    from apps.accounts.services import api_token_create

    _, token = api_token_create(user=operator, name=name, scopes=["read", "launch"])
    return httpx.Client(base_url=stack["web"] + "/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=60)


def _launch(api: httpx.Client, operator: Any, steps: int, name: str) -> int:
    from tests.factories import exact_answer_version, tasks_version
    from workers.envs.registry import arithmetic_tasks

    tasks = tasks_version(owner=operator, rows=arithmetic_tasks(16, seed=3), name=f"{name}-tasks")
    reward = exact_answer_version(owner=operator, name=f"{name}-exact")
    config = {
        "base_model": "tiny-llama-smollm2-tokenizer",
        "steps": steps,
        "prompts_per_step": 2,
        "group_size": 2,
        "checkpoint_every": 2,
        "sampling": {"max_new_tokens": 6},
        "compute": {"cpus": 1, "memory_gb": 2},
    }
    body = {"kind": "train", "dataset_version": tasks.pk, "reward_version": reward.pk, "config": config}
    for _ in range(30):  # the web process may be restarting from an earlier kill
        try:
            reply = api.post("/runs/", json=body)
            break
        except httpx.TransportError:
            time.sleep(1)
    assert reply.status_code == 201, reply.text
    return int(reply.json()["id"])


def _until(what: str, check, timeout: float = 180, every: float = 0.3) -> Any:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def _steps(run_id: int) -> int:
    from apps.runs.models import MetricPoint

    return MetricPoint.objects.filter(run_id=run_id, name="loss").count()


def _kill(stack: dict[str, Any], name: str) -> int:
    """SIGKILL the supervised process `name`; returns once the supervisor has started a new one."""
    item = stack["supervisor"].items[name]
    old = item.proc.pid
    os.kill(old, signal.SIGKILL)
    _until(f"{name} to be restarted", lambda: item.proc.pid != old and item.proc.poll() is None, timeout=60)
    return old


def _done(run_id: int):  # type: ignore[no-untyped-def]
    from apps.runs.models import Run

    run = Run.objects.get(pk=run_id)
    return run if run.is_terminal else None


def test_every_kill_of_the_issue_in_one_run_loses_nothing_and_the_run_resumes(stack, users):
    """One training run, and in turn: the Celery worker, Redis and the web process are SIGKILLed (the run goes on);
    then the worst moment: the web process is stopped as a checkpoint is written and the driver is SIGKILLed with
    its events unsent. The run fails naming SIGKILL, the checkpoint is found in storage by its checksum, and the
    resumed job replays the dead driver's spool into the parent run before it trains the remaining steps once."""
    from apps.runs.models import Checkpoint, MetricPoint, Run
    from apps.runs.selectors import event_accounting

    operator = users["operator"]
    api = _api(operator, stack, "kills")
    run_id = _launch(api, operator, steps=STEPS, name="kills")
    _until("step 1", lambda: _steps(run_id) >= 1)
    _kill(stack, "worker")
    _until("step 2", lambda: _steps(run_id) >= 2)
    _kill(stack, "redis")
    _until("step 3", lambda: _steps(run_id) >= 3)
    _kill(stack, "web")
    devstack.wait_for_port("127.0.0.1", stack["web_port"], timeout=60)
    _until("step 5 after the restarts", lambda: _steps(run_id) >= 5)
    assert Run.objects.get(pk=run_id).status == "running"

    folder = Path(django_settings.MEDIA_ROOT) / f"runs/{run_id}/checkpoints"
    drivers = _until("the job's driver", lambda: devstack.job_driver_pids(run_id))
    web = stack["supervisor"].items["web"].proc
    os.kill(web.pid, signal.SIGSTOP)  # the control plane stops answering
    try:
        # The next checkpoint the job writes from here on: its report cannot reach the control plane.
        target = next(step for step in range(2, STEPS, 2) if not (folder / f"step-{step:06d}.pt.sha256").exists())
        checkpoint = folder / f"step-{target:06d}.pt.sha256"
        _until(f"checkpoint {target} in storage", checkpoint.exists, timeout=180, every=0.02)
        for pid in drivers:  # frozen at once (a tiny model's steps are fast), then killed
            os.kill(pid, signal.SIGSTOP)
        for pid in drivers:  # it has made events it could not send: this checkpoint's event among them
            os.kill(pid, signal.SIGKILL)
    finally:
        os.kill(web.pid, signal.SIGKILL)  # the supervisor restarts it
    parent = _until("the run to fail", lambda: _done(run_id), timeout=120)
    assert parent.status == "failed" and "SIGKILL" in parent.failure_reason, parent.failure_reason
    unsent = [line for p in stack["spool"].glob("*.jsonl") for line in p.read_text().splitlines()[1:]]
    assert unsent, "the killed driver left its unsent events in the spool"
    assert not Checkpoint.objects.filter(run=parent, step=target).exists()  # its event is in the spool only

    for _ in range(60):
        try:
            resumed = api.post(f"/runs/{run_id}/resume/")
            break
        except httpx.TransportError:
            time.sleep(1)
    assert resumed.status_code == 201, resumed.text
    child = Run.objects.get(pk=resumed.json()["id"])
    start = child.spec["resume_from"]["step"]
    assert start == target  # found in storage by its checksum
    child = _until("the resumed run to end", lambda: _done(child.pk), timeout=240)
    logs = {p.name: p.read_text()[-2000:] for p in (stack["var"] / "log").glob("*.log")}
    assert child.status == "succeeded", (child.failure_reason, child.log_tail, stack["said"], logs)

    parent.refresh_from_db()
    accounting = event_accounting(parent)
    assert accounting["missing"] == 0 and accounting["duplicates"] == 0, accounting
    assert accounting["late"] > 0, ("the replayed events arrived after the parent had failed", accounting)
    assert not list(stack["spool"].glob("*.jsonl"))
    parent_steps = list(
        MetricPoint.objects.filter(run=parent, name="loss").order_by("step").values_list("step", flat=True)
    )
    assert parent_steps[:target] == list(range(1, target + 1)) and len(set(parent_steps)) == len(parent_steps)
    assert parent.trajectories.count() == len(parent_steps) * 2 * 2
    child_accounting = event_accounting(child)
    assert child_accounting["ended"] == "succeeded" and child_accounting["missing"] == 0, child_accounting
    child_steps = list(MetricPoint.objects.filter(run=child, name="loss").values_list("step", flat=True))
    assert sorted(child_steps) == list(range(start + 1, STEPS + 1))  # each remaining step once
    assert sum("restarted" in line for line in stack["said"]) >= 4, stack["said"]
