"""The fault drill: SIGKILL a supervised stack's processes during a real training run and count what survives.

In turn, during one GRPO run on the tiny model: the Celery worker, Redis (when the stack runs its own) and the
web process are killed (the run must go on); then the web process is stopped just before a checkpoint is written
and the job's driver is killed with that checkpoint's report unsent. The run must fail with a reason that names
SIGKILL; a resume must find the checkpoint in storage and train each remaining step once; the resumed job must
replay the dead driver's spooled events into the parent run. Events are counted by their sequence numbers
(`apps.runs.selectors.event_accounting`).

Used by tests/faults/test_kills.py (on a stack of its own) and by bench/fault_drill.py (against `make run`).
Import it once Django is set up against the stack's database; the stack's processes must be on this machine.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from apps.runs.models import Checkpoint, MetricPoint, Run
from apps.runs.selectors import event_accounting
from controlplane.devstack import job_driver_pids, port_answers

STEPS = 40  # a tiny model's steps take a fraction of a second: enough of them to kill the job mid-run


@dataclass
class Target:
    """A running stack, as the drill sees it."""

    web: str  # e.g. http://127.0.0.1:8000
    pid_of: Callable[[str], int | None]  # the supervised process's current pid ("web", "worker", "redis")
    media_root: Path  # where the runs' checkpoints land
    spool_dir: Path  # CRUCIBLE_SPOOL_DIR of the stack's Ray jobs
    api_token: str  # an operator's API token
    log: Callable[[str], None] = print


def until(what: str, check: Callable[[], Any], timeout: float = 180, every: float = 0.3) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def kill_and_wait(target: Target, name: str) -> float:
    """SIGKILL the supervised process `name`; returns the seconds until the supervisor had a new one running."""
    old = target.pid_of(name)
    assert old is not None, f"no {name} process to kill"
    started = time.monotonic()
    os.kill(old, signal.SIGKILL)
    until(f"{name} to be restarted", lambda: target.pid_of(name) not in (None, old) and _alive(target.pid_of(name)))
    return time.monotonic() - started


def _steps(run_id: int) -> int:
    return MetricPoint.objects.filter(run_id=run_id, name="loss").count()


def _ended(run_id: int) -> Any:
    run = Run.objects.get(pk=run_id)
    return run if run.is_terminal else None


def _post(api: httpx.Client, path: str, **kwargs: Any) -> httpx.Response:
    for _ in range(60):  # the web process may be restarting from a kill
        try:
            return api.post(path, **kwargs)
        except httpx.TransportError:
            time.sleep(1)
    raise TimeoutError(f"the web process did not answer POST {path} for a minute")


def _spools(target: Target, run_id: int) -> list[Path]:
    """This run's spool files (named after its ingest URL; a node's spool dir holds other runs' too)."""
    return [p for p in target.spool_dir.glob("*.jsonl") if f"-runs-{run_id}-ingest" in p.name]


def drill(target: Target, *, dataset_version: int, reward_version: int, steps: int = STEPS) -> dict[str, Any]:
    """Run the drill; returns its figures (and raises only when the stack stops answering altogether)."""
    api = httpx.Client(
        base_url=target.web + "/api/v1", headers={"Authorization": f"Bearer {target.api_token}"}, timeout=60
    )
    config = {
        "base_model": "tiny-llama-smollm2-tokenizer",
        "steps": steps,
        "prompts_per_step": 2,
        "group_size": 2,
        "checkpoint_every": 2,
        "sampling": {"max_new_tokens": 6},
        "compute": {"cpus": 1, "memory_gb": 2},
    }
    body = {"kind": "train", "dataset_version": dataset_version, "reward_version": reward_version, "config": config}
    reply = _post(api, "/runs/", json=body)
    assert reply.status_code == 201, reply.text
    run_id = int(reply.json()["id"])
    figures: dict[str, Any] = {"run": run_id, "restart_seconds": {}}
    target.log(f"run {run_id}: {steps} GRPO steps on the tiny model")

    kills = [("worker", 1), ("redis", 2), ("web", 3)]
    for name, step in kills:
        if target.pid_of(name) is None:
            target.log(f"no supervised {name} (an external one): not killed")
            continue
        until(f"step {step}", lambda s=step: _steps(run_id) >= s)  # type: ignore[misc]
        figures["restart_seconds"][name] = round(kill_and_wait(target, name), 1)
        target.log(f"killed {name} at step {_steps(run_id)}; back in {figures['restart_seconds'][name]}s")
    host, port = target.web.rsplit("/", 1)[-1].split(":")
    until("the web process to listen", lambda: port_answers(host, int(port)), timeout=60)
    until("step 5 after the restarts", lambda: _steps(run_id) >= 5)
    figures["running_after_restarts"] = Run.objects.get(pk=run_id).status == "running"

    folder = target.media_root / f"runs/{run_id}/checkpoints"
    drivers = until("the job's driver", lambda: job_driver_pids(run_id))
    web = target.pid_of("web")
    assert web is not None
    for pid in drivers:  # held still while the stage is set (a tiny model's steps are fast)
        os.kill(pid, signal.SIGSTOP)
    # The next checkpoint the job writes from here on: its report cannot reach the control plane.
    checkpoint_step = next((s for s in range(2, steps, 2) if not (folder / f"step-{s:06d}.pt.sha256").exists()), None)
    if checkpoint_step is None:
        for pid in drivers:
            os.kill(pid, signal.SIGCONT)
        raise RuntimeError(f"the run wrote its checkpoints up to step {steps} before the drill got there; more steps")
    os.kill(web, signal.SIGSTOP)  # the control plane stops answering
    try:
        for pid in drivers:
            os.kill(pid, signal.SIGCONT)
        until(f"checkpoint {checkpoint_step}", (folder / f"step-{checkpoint_step:06d}.pt.sha256").exists, every=0.02)
        for pid in drivers:  # frozen at once, then killed: its events since the web stopped are unsent
            os.kill(pid, signal.SIGSTOP)
        for pid in drivers:
            os.kill(pid, signal.SIGKILL)
    finally:
        os.kill(web, signal.SIGKILL)  # the supervisor restarts it
    target.log(f"web stopped, driver killed just after checkpoint {checkpoint_step} was written")
    parent = until("the run to fail", lambda: _ended(run_id), timeout=120)
    spooled = [line for p in _spools(target, run_id) for line in p.read_text().splitlines()[1:]]
    figures.update(
        parent_status=parent.status,
        parent_reason=parent.failure_reason,
        checkpoint_step=checkpoint_step,
        checkpoint_reported=Checkpoint.objects.filter(run=parent, step=checkpoint_step).exists(),
        spooled_lines=len(spooled),
        before_resume=event_accounting(parent),
    )
    target.log(f"run {run_id} {parent.status}: {parent.failure_reason}")

    resumed = _post(api, f"/runs/{run_id}/resume/")
    assert resumed.status_code == 201, resumed.text
    child = Run.objects.get(pk=resumed.json()["id"])
    figures["resumed_from"] = child.spec["resume_from"]["step"]
    target.log(f"resumed as run {child.pk} from step {figures['resumed_from']}")
    child = until("the resumed run to end", lambda: _ended(child.pk), timeout=300)
    parent.refresh_from_db()
    parent_steps = list(MetricPoint.objects.filter(run=parent, name="loss").values_list("step", flat=True))
    child_steps = list(MetricPoint.objects.filter(run=child, name="loss").values_list("step", flat=True))
    figures.update(
        child=child.pk,
        child_status=child.status,
        child_reason=child.failure_reason,
        parent_accounting=event_accounting(parent),
        child_accounting=event_accounting(child),
        parent_steps=sorted(parent_steps),
        child_steps=sorted(child_steps),
        parent_trajectories=parent.trajectories.count(),
        spool_left=len(_spools(target, run_id)),
    )
    return figures


def summary(figures: dict[str, Any]) -> list[str]:
    """The drill's figures as lines a person reads."""
    parent, child = figures["parent_accounting"], figures["child_accounting"]
    reason = figures["parent_reason"].splitlines() or [""]
    reason_text = reason[0] if len(reason) == 1 else f"{reason[0]} ... {reason[-1].strip()}"
    return [
        "restarts (SIGKILL -> running again): " + ", ".join(f"{k} {v}s" for k, v in figures["restart_seconds"].items()),
        f"run went on through them: {figures['running_after_restarts']}",
        f"driver killed after checkpoint {figures['checkpoint_step']} (reported: {figures['checkpoint_reported']}); "
        f"run {figures['parent_status']}: {reason_text}",
        f"resume started from step {figures['resumed_from']}; resumed run {figures['child_status']}",
        f"parent events: {parent['stored']} stored of {parent['last_seq']}, missing {parent['missing']}, "
        f"duplicated {parent['duplicates']}, late (replayed from the spool) {parent['late']}",
        f"resumed run events: {child['stored']} stored of {child['last_seq']}, missing {child['missing']}, "
        f"duplicated {child['duplicates']}, ended {child['ended']}",
        f"steps: parent {len(figures['parent_steps'])} (each once: "
        f"{len(set(figures['parent_steps'])) == len(figures['parent_steps'])}), resumed run "
        f"{figures['child_steps'][:1]}..{figures['child_steps'][-1:]} ({len(figures['child_steps'])})",
    ]
