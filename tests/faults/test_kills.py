"""Kill the stack's processes with SIGKILL during a real training run and count what survives.

The stack here is what `make run` supervises: daphne, a Celery worker (with beat), Redis (its own, embedded, so it
can be killed) and a local Ray head, with `controlplane.devstack.Supervisor` restarting what dies. The run is GRPO
on the tiny model. Events are counted by their sequence numbers (`apps.runs.selectors.event_accounting`): every seq
up to the worker's own `end` event stored once, none missing, none twice.

The drill itself is `controlplane.faultdrill`; bench/fault_drill.py runs it against a live `make run`.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from controlplane import devstack

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
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
        gcs_port=0,
        dashboard_port=0,
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
        head.stop(timeout=3.0)  # a throwaway cluster: no need to wait for a graceful drain


# About a minute: slow. tests/faults/test_delivery.py and test_supervisor.py kill single processes in the default suite.
@pytest.mark.slow
def test_every_kill_of_the_issue_in_one_run_loses_nothing_and_the_run_resumes(stack, users):
    """One training run, and in turn: the Celery worker, Redis and the web process are SIGKILLed (the run goes on);
    then the worst moment: the web process is stopped as a checkpoint is written and the driver is SIGKILLed with
    its events unsent. The run fails naming SIGKILL, the checkpoint is found in storage by its checksum, and the
    resumed job replays the dead driver's spool into the parent run before it trains the remaining steps once."""
    from apps.accounts.services import api_token_create
    from controlplane import faultdrill
    from tests.factories import exact_answer_version, tasks_version
    from workers.envs.registry import arithmetic_tasks

    operator = users["operator"]
    _, token = api_token_create(user=operator, name="drill", scopes=["read", "launch"])
    supervisor = stack["supervisor"]
    target = faultdrill.Target(
        web=stack["web"],
        pid_of=lambda name: supervisor.items[name].proc.pid if name in supervisor.items else None,
        media_root=Path(django_settings.MEDIA_ROOT),
        spool_dir=stack["spool"],
        api_token=token,
    )
    figures = faultdrill.drill(
        target,
        dataset_version=tasks_version(owner=operator, rows=arithmetic_tasks(16, seed=3), name="drill-tasks").pk,
        reward_version=exact_answer_version(owner=operator, name="drill-exact").pk,
    )
    logs = {p.name: p.read_text()[-2000:] for p in (stack["var"] / "log").glob("*.log")}
    context = (figures, stack["said"], logs)
    assert set(figures["restart_seconds"]) == {"worker", "redis", "web"}, context
    assert figures["running_after_restarts"], context
    assert figures["parent_status"] == "failed" and "SIGKILL" in figures["parent_reason"], context
    assert not figures["checkpoint_reported"] and figures["spooled_lines"] > 0, context
    assert figures["resumed_from"] == figures["checkpoint_step"], context  # found in storage by its checksum
    assert figures["child_status"] == "succeeded", context
    parent, child = figures["parent_accounting"], figures["child_accounting"]
    assert parent["missing"] == 0 and parent["duplicates"] == 0 and parent["late"] > 0, context
    assert child["missing"] == 0 and child["duplicates"] == 0 and child["ended"] == "succeeded", context
    assert figures["spool_left"] == 0, context
    start, steps = figures["checkpoint_step"], faultdrill.STEPS
    assert figures["parent_steps"][:start] == list(range(1, start + 1)), context
    assert len(set(figures["parent_steps"])) == len(figures["parent_steps"]), context
    assert figures["parent_trajectories"] == len(figures["parent_steps"]) * 2 * 2, context
    assert figures["child_steps"] == list(range(start + 1, steps + 1)), context  # each remaining step once
