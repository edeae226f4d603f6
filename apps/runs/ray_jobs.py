"""The only module that talks to Ray: submit, status, stop and logs through the Ray Jobs API.

Every call has a deadline (CRUCIBLE_RAY_TIMEOUT seconds). The Ray SDK talks HTTP without a timeout, so a cluster
that accepts the connection and never answers would otherwise hang a Celery worker forever; here the call runs in a
daemon thread and the caller gets `RayUnavailable` naming the address when the deadline passes.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from django.conf import settings

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
WORKING_DIR_EXCLUDES = [".venv", ".git", "var", "node_modules", "staticfiles", "*.pyc", "__pycache__", "media"]

T = TypeVar("T")


class RayUnavailable(RuntimeError):
    """The cluster did not answer; the message names the address."""


class RayJobNotFound(RuntimeError):
    pass


@dataclass(frozen=True)
class RayJobState:
    status: str  # PENDING | RUNNING | SUCCEEDED | FAILED | STOPPED
    message: str


def _address(address: str | None) -> str:
    return address or settings.RAY_ADDRESS


def with_deadline(fn: Callable[[], T], *, address: str, what: str, timeout: float | None = None) -> T:
    """Run `fn` with a deadline. The thread of a call that overran is abandoned (daemon), never joined."""
    timeout = settings.RAY_SUBMIT_TIMEOUT if timeout is None else timeout
    value: list[T] = []  # what the call returned, or
    error: list[BaseException] = []  # what it raised

    def call() -> None:
        try:
            value.append(fn())
        except BaseException as exc:  # handed to the caller's thread below
            error.append(exc)

    thread = threading.Thread(target=call, name=f"ray-{what}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise RayUnavailable(
            f"Ray cluster at {address} did not answer {what} within {timeout:g}s (CRUCIBLE_RAY_TIMEOUT)"
        )
    if error:
        raise error[0]
    return value[0]


def _client(address: str) -> Any:
    from ray.job_submission import JobSubmissionClient

    try:
        return with_deadline(lambda: JobSubmissionClient(address), address=address, what="a connection")
    except RayUnavailable:
        raise
    except Exception as exc:  # ConnectionError, ValueError... the SDK raises several kinds
        raise RayUnavailable(f"Ray cluster at {address} did not answer: {exc}") from exc


def submit(*, submission_id: str, module: str, env_vars: dict[str, str], address: str | None = None) -> str:
    """Submit `python -m <module>`; submitting the same id twice is a no-op that returns the same id."""
    address = _address(address)
    client = _client(address)
    runtime_env = {
        "working_dir": str(settings.BASE_DIR),
        "excludes": WORKING_DIR_EXCLUDES,
        "env_vars": env_vars,
    }

    def call() -> str:
        return str(
            client.submit_job(
                entrypoint=f"{settings.RAY_JOB_PYTHON} -m {module}",
                submission_id=submission_id,
                runtime_env=runtime_env,
                metadata={"crucible": "1"},
            )
        )

    try:
        # Uploading the working directory takes longer than a status call: give it a few deadlines' worth.
        return with_deadline(call, address=address, what="the job submission", timeout=settings.RAY_SUBMIT_TIMEOUT * 3)
    except RayUnavailable:
        raise
    except RuntimeError as exc:
        if "already exists" in str(exc):
            return submission_id
        raise RayUnavailable(f"Ray cluster at {address} refused the job: {exc}") from exc
    except Exception as exc:
        raise RayUnavailable(f"Ray cluster at {address} did not answer: {exc}") from exc


def state(submission_id: str, address: str | None = None) -> RayJobState:
    address = _address(address)
    client = _client(address)
    try:
        info = with_deadline(lambda: client.get_job_info(submission_id), address=address, what="a status query")
    except RayUnavailable:
        raise
    except RuntimeError as exc:
        if "does not exist" in str(exc) or "404" in str(exc):
            raise RayJobNotFound(submission_id) from exc
        raise RayUnavailable(str(exc)) from exc
    except Exception as exc:
        raise RayUnavailable(str(exc)) from exc
    return RayJobState(
        status=str(info.status.value if hasattr(info.status, "value") else info.status), message=info.message or ""
    )


def logs_tail(submission_id: str, address: str | None = None, lines: int = 60) -> str:
    address = _address(address)
    try:
        client = _client(address)
        text = str(with_deadline(lambda: client.get_job_logs(submission_id), address=address, what="a logs query"))
    except Exception:
        return ""
    return "\n".join(ANSI_ESCAPE.sub("", line) for line in text.splitlines()[-lines:])


def stop(submission_id: str, address: str | None = None) -> bool:
    address = _address(address)
    client = _client(address)
    try:
        return bool(with_deadline(lambda: client.stop_job(submission_id), address=address, what="a stop request"))
    except RayUnavailable:
        raise
    except RuntimeError as exc:
        if "does not exist" in str(exc):
            return False
        raise RayUnavailable(str(exc)) from exc


def _query(fn: Callable[[], T], *, address: str, what: str, timeout: float | None = None) -> T:
    """A read of the cluster's state with a deadline; any failure is `RayUnavailable` naming the address."""
    try:
        return with_deadline(fn, address=address, what=what, timeout=timeout)
    except RayUnavailable:
        raise
    except Exception as exc:
        raise RayUnavailable(f"Ray cluster at {address} did not answer {what}: {exc}") from exc


@dataclass(frozen=True)
class RayNode:
    node_id: str
    ip: str
    alive: bool
    head: bool
    resources: dict[str, float]
    """Its total resources, without Ray's per-node marker resources (`node:<ip>`)."""


@dataclass(frozen=True)
class RayActor:
    actor_id: str
    class_name: str
    node_id: str
    pid: int
    job_id: str
    resources: dict[str, float]


def nodes(address: str | None = None, timeout: float | None = None) -> list[RayNode]:
    """The cluster's nodes and their total resources, from Ray's state API (the dashboard at `address`)."""
    from ray.util.state import list_nodes

    address = _address(address)
    deadline = settings.RAY_SUBMIT_TIMEOUT if timeout is None else timeout
    found = _query(
        lambda: list_nodes(address=address, limit=10_000, timeout=int(max(1, deadline))),
        address=address,
        what="a nodes query",
        timeout=deadline,
    )
    return [
        RayNode(
            node_id=node.node_id,
            ip=node.node_ip,
            alive=node.state == "ALIVE",
            head=bool(node.is_head_node),
            resources={k: float(v) for k, v in (node.resources_total or {}).items() if not k.startswith("node:")},
        )
        for node in found
    ]


def actors(address: str | None = None) -> list[RayActor]:
    """The cluster's alive actors: where each runs and what it holds."""
    from ray.util.state import list_actors

    address = _address(address)
    found = _query(
        lambda: list_actors(address=address, filters=[("state", "=", "ALIVE")], limit=10_000, detail=True, timeout=10),
        address=address,
        what="an actors query",
    )
    return [
        RayActor(
            actor_id=actor.actor_id,
            class_name=actor.class_name,
            node_id=actor.node_id or "",
            pid=int(actor.pid or 0),
            job_id=actor.job_id or "",
            resources={k: float(v) for k, v in (actor.required_resources or {}).items()},
        )
        for actor in found
    ]


def job_submissions(address: str | None = None) -> dict[str, str]:
    """Ray's internal job id -> submission id, for the cluster's jobs (an actor names the former)."""
    address = _address(address)
    client = _client(address)
    found = _query(lambda: client.list_jobs(), address=address, what="a jobs query")
    return {str(job.job_id): str(job.submission_id) for job in found if job.job_id and job.submission_id}


@dataclass(frozen=True)
class JobProcess:
    label: str
    """"driver" or the actor's class name."""
    pid: int
    node_id: str
    ip: str


def job_processes(submission_id: str, address: str | None = None) -> list[JobProcess]:
    """The live processes of one submitted job: its driver (while the job runs) and its alive actors."""
    from ray.util.state import list_actors

    address = _address(address)
    client = _client(address)
    info = _query(lambda: client.get_job_info(submission_id), address=address, what="a job query")
    found: list[JobProcess] = []
    driver = getattr(info, "driver_info", None)
    if driver is not None and str(getattr(info, "status", "")) in ("RUNNING", "JobStatus.RUNNING") and driver.pid:
        found.append(
            JobProcess(
                "driver", int(driver.pid), str(getattr(info, "driver_node_id", "") or ""), driver.node_ip_address
            )
        )
    if info.job_id:
        actors = _query(
            lambda: list_actors(
                address=address,
                filters=[("job_id", "=", info.job_id), ("state", "=", "ALIVE")],
                limit=1000,
                detail=True,
                timeout=10,
            ),
            address=address,
            what="an actors query",
        )
        for actor in actors:
            if actor.pid:
                found.append(JobProcess(actor.class_name, int(actor.pid), actor.node_id or "", ""))
    return found


def traceback(process: JobProcess, *, address: str | None = None, timeout: float = 30.0) -> str:
    """The process's Python stacks from Ray's dashboard (py-spy on its node). `RayUnavailable` with the reason when
    the dashboard cannot give them (profiling off on the head, the process gone, the node unreachable)."""
    address = _address(address)
    client = _client(address)
    where = f"node_id={process.node_id}" if process.node_id else f"ip={process.ip}"
    response = _query(
        lambda: client._do_request("GET", f"/worker/traceback?pid={process.pid}&{where}&native=0"),
        address=address,
        what="a stack dump",
        timeout=timeout,
    )
    if response.status_code != 200:
        # Whole: the dashboard's answer carries py-spy's error on the node, and a cut one hides why.
        raise RayUnavailable(f"the dashboard answered {response.status_code}: {response.text.strip()}")
    return str(response.text)
