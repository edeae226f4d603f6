"""The only module that talks to Ray: submit, status, stop and logs through the Ray Jobs API."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.conf import settings

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
WORKING_DIR_EXCLUDES = [".venv", ".git", "var", "node_modules", "staticfiles", "*.pyc", "__pycache__", "media"]


class RayUnavailable(RuntimeError):
    """The cluster did not answer; the message names the address."""


class RayJobNotFound(RuntimeError):
    pass


@dataclass(frozen=True)
class RayJobState:
    status: str  # PENDING | RUNNING | SUCCEEDED | FAILED | STOPPED
    message: str


def _client(address: str | None = None) -> Any:
    from ray.job_submission import JobSubmissionClient

    address = address or settings.RAY_ADDRESS
    try:
        return JobSubmissionClient(address)
    except Exception as exc:  # ConnectionError, ValueError... the SDK raises several kinds
        raise RayUnavailable(f"Ray cluster at {address} did not answer: {exc}") from exc


def submit(*, submission_id: str, module: str, env_vars: dict[str, str], address: str | None = None) -> str:
    """Submit `python -m <module>`; submitting the same id twice is a no-op that returns the same id."""
    client = _client(address)
    runtime_env = {
        "working_dir": str(settings.BASE_DIR),
        "excludes": WORKING_DIR_EXCLUDES,
        "env_vars": env_vars,
    }
    try:
        return str(
            client.submit_job(
                entrypoint=f"{settings.RAY_JOB_PYTHON} -m {module}",
                submission_id=submission_id,
                runtime_env=runtime_env,
                metadata={"crucible": "1"},
            )
        )
    except RuntimeError as exc:
        if "already exists" in str(exc):
            return submission_id
        raise RayUnavailable(f"Ray cluster at {address or settings.RAY_ADDRESS} refused the job: {exc}") from exc
    except Exception as exc:
        raise RayUnavailable(f"Ray cluster at {address or settings.RAY_ADDRESS} did not answer: {exc}") from exc


def state(submission_id: str, address: str | None = None) -> RayJobState:
    client = _client(address)
    try:
        info = client.get_job_info(submission_id)
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
    try:
        text = str(_client(address).get_job_logs(submission_id))
    except Exception:
        return ""
    return "\n".join(ANSI_ESCAPE.sub("", line) for line in text.splitlines()[-lines:])


def stop(submission_id: str, address: str | None = None) -> bool:
    try:
        return bool(_client(address).stop_job(submission_id))
    except RuntimeError as exc:
        if "does not exist" in str(exc):
            return False
        raise RayUnavailable(str(exc)) from exc
