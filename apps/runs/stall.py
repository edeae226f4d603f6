"""The stall watchdog: a running job that has sent no event for longer than its limit is marked *stalled*, with a
stack dump of each of its processes (the Ray job's driver and its actors), so the page says where it hangs.

Silence is measured from the run's latest ingested batch (`Run.last_event_at`), else from its start. The limit is
the run's `config.stall_limits.<phase>` for the phase its job last reported (`Run.phase`), else its
`config.stall_after_seconds` when it has one (training runs do), else `CRUCIBLE_STALL_SECONDS`. A run
that talks again is no longer stalled (ingest clears it). Beat checks every reconcile (`tasks.reconcile_runs`);
the dumps are taken in their own task (`tasks.mark_stalled`).

Dumps come from Ray's dashboard (`/worker/traceback`, py-spy on the process's node: the head needs
`RAY_DASHBOARD_ENABLE_PROFILING=1`, which `make run` and docker compose set), else from py-spy here when the
process runs on this machine. A dump that cannot be taken (the process is gone, profiling is off) is reported
with its reason; the stalled state stands.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.runs import ray_jobs
from apps.runs.models import Run, RunStatus
from apps.webhooks.services import webhook_emit

log = logging.getLogger(__name__)

DUMP_TIMEOUT = 30.0
REPORT_MAX_CHARS = 200_000


def stall_limit(run: Run) -> float:
    """Seconds of silence this run may have: its spec's `config.stall_limits.<phase>` for the phase its job said it
    is in, else `config.stall_after_seconds`, else the setting."""
    config = (run.spec or {}).get("config") or {}
    if not isinstance(config, dict):
        return float(settings.STALL_SECONDS)
    limits = config.get("stall_limits")
    if run.phase and isinstance(limits, dict):
        by_phase = limits.get(run.phase)
        if isinstance(by_phase, int | float) and by_phase > 0:
            return float(by_phase)
    value = config.get("stall_after_seconds")
    return float(value) if isinstance(value, int | float) and value > 0 else float(settings.STALL_SECONDS)


def silent_runs(now: datetime | None = None) -> list[int]:
    """Running runs, not yet marked, whose silence is past their limit."""
    now = now or timezone.now()
    found = []
    candidates = Run.objects.filter(status=RunStatus.RUNNING, stalled_at__isnull=True).only(
        "pk", "spec", "phase", "last_event_at", "started_at", "created_at"
    )
    for run in candidates:
        since = run.last_event_at or run.started_at or run.created_at
        if now - since > timedelta(seconds=stall_limit(run)):
            found.append(run.pk)
    return found


def run_mark_stalled(*, run_id: int, now: datetime | None = None) -> Run:
    """Mark a silent run stalled with its processes' stack dumps, and tell the webhooks. Does nothing when the run
    ended, talked since, or was already marked (a duplicate task: the mark is claimed first, then the dumps)."""
    now = now or timezone.now()
    run = Run.objects.get(pk=run_id)
    since = run.last_event_at or run.started_at or run.created_at
    silent = (now - since).total_seconds()
    limit = stall_limit(run)
    if run.status != RunStatus.RUNNING or run.stalled_at is not None or silent <= limit:
        return run
    during = f" in phase {run.phase}" if run.phase else ""
    header = f"No event for {silent:.0f} s{during} (limit {limit:.0f} s) since {since:%Y-%m-%d %H:%M:%S} UTC."
    claimed = Run.objects.filter(
        pk=run_id, status=RunStatus.RUNNING, stalled_at__isnull=True, last_event_at=run.last_event_at
    ).update(stalled_at=now, stall_report=f"{header}\n\nTaking stack dumps...")
    if not claimed:
        return Run.objects.get(pk=run_id)
    dumps = job_stack_dumps(run)
    report = (header + "\n\n" + "\n\n".join(f"== {label} ==\n{text}" for label, text in dumps))[:REPORT_MAX_CHARS]
    with transaction.atomic():
        # Only while still marked by this claim: a batch that arrived meanwhile cleared it (the run is alive).
        Run.objects.filter(pk=run_id, stalled_at=now).update(stall_report=report)
        webhook_emit(
            event="run.stalled",
            payload={
                "run": {"id": run.pk, "kind": run.kind, "name": run.name},
                "silent_seconds": round(silent),
                "limit_seconds": limit,
                "report": report[:20_000],
            },
        )
    log.warning("run %s stalled: no event for %.0f s", run_id, silent)
    return Run.objects.get(pk=run_id)


def job_stack_dumps(run: Run) -> list[tuple[str, str]]:
    """(process label, stack dump or the reason there is none) for the run's Ray job: its driver, then each alive
    actor."""
    if not run.ray_job_id:
        return [("job", "no Ray job was submitted")]
    try:
        processes = ray_jobs.job_processes(run.ray_job_id, address=run.ray_address or None)
    except ray_jobs.RayUnavailable as exc:
        return [("job", f"no dump: {exc}")]
    if not processes:
        return [("job", "no dump: Ray lists no live process of this job (it may have exited)")]
    out = []
    for process in processes:
        label = f"{process.label} (pid {process.pid}, node {process.ip or process.node_id[:12]})"
        out.append((label, stack_dump(process, address=run.ray_address or None)))
    return out


def stack_dump(process: ray_jobs.JobProcess, *, address: str | None = None) -> str:
    """One process's Python stacks: from Ray's dashboard, else py-spy here when the process is local."""
    reasons = []
    try:
        return ray_jobs.traceback(process, address=address, timeout=DUMP_TIMEOUT)
    except ray_jobs.RayUnavailable as exc:
        reasons.append(f"Ray's dashboard: {exc}")
    if Path(f"/proc/{process.pid}").exists():
        try:
            return py_spy_dump(process.pid)
        except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
            reasons.append(f"py-spy here: {exc}")
    else:
        reasons.append(f"py-spy here: no process {process.pid} on this machine")
    return "no dump: " + "; ".join(reasons)


def py_spy_dump(pid: int) -> str:
    """`py-spy dump --nonblocking --pid <pid>` (the Python stack of every thread). Without suspending the process:
    py-spy cannot suspend one that is stopped (SIGSTOP, a debugger, a job paused by its supervisor); a stack read
    while a process runs on can be a little inconsistent, which a stall report can live with. A failure raises
    RuntimeError with py-spy's whole message (its error and every cause, without the Rust backtrace that pushed
    them out of view)."""
    binary = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not os.path.exists(binary):
        raise RuntimeError("py-spy is not installed")
    done = subprocess.run(
        [binary, "dump", "--nonblocking", "--pid", str(pid)],
        capture_output=True,
        text=True,
        timeout=DUMP_TIMEOUT,
        check=False,
        env={**os.environ, "RUST_BACKTRACE": "0"},
    )
    if done.returncode != 0:
        raise RuntimeError((done.stderr or done.stdout).strip() or f"exit code {done.returncode}")
    return done.stdout
