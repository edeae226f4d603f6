"""What a sandbox run is given and what it gives back: the limits (`SandboxLimits`), how the run ended
(`Outcome`, `SandboxResult`, `Observation`), and the reading of the launcher's report and of the captured output
into a result (`classify`). `runner.py` runs the program and documents what the sandbox guarantees (the
observation kinds and sources, the isolation modes); the launcher writes the report this module reads.
"""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from workers.sandbox.uids import SandboxUnavailable

ISOLATION_ENV = "CRUCIBLE_SANDBOX_ISOLATION"
ISOLATION_MODES = ("strict", "rlimits-only")

MAX_WORKSPACE_FILES = 4096  # inodes of the workspace tmpfs
# Share of the CPU limit that, used by a program the kernel SIGKILLed, marks the CPU limit as the cause.
_CPU_SPENT = 0.85
# Exit status the launcher's child uses for an uncaught MemoryError.
EXIT_MEMORY = 77


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one run. Times in seconds, sizes in bytes."""

    wall_seconds: float = 10.0
    cpu_seconds: int = 10
    memory_bytes: int = 512 * 1024 * 1024  # RLIMIT_AS
    max_processes: int = 16  # RLIMIT_NPROC for the sandbox uid
    max_output_bytes: int = 64 * 1024  # stdout/stderr kept each; the rest dropped, noted truncated
    max_file_bytes: int = 16 * 1024 * 1024  # RLIMIT_FSIZE
    max_disk_bytes: int = 64 * 1024 * 1024  # the whole workspace (its tmpfs), the caller's files included
    max_workspace_files: int = MAX_WORKSPACE_FILES  # inodes of the workspace tmpfs (files and directories)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.wall_seconds) and self.wall_seconds > 0):
            raise ValueError(f"wall_seconds must be a positive number, got {self.wall_seconds!r}")
        for name in ("cpu_seconds", "memory_bytes", "max_processes", "max_disk_bytes", "max_workspace_files"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("max_output_bytes", "max_file_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")


class Outcome(StrEnum):
    """How the run ended."""

    OK = "ok"  # exited 0
    FAILED = "failed"  # nonzero exit (an exception, a failed assert)
    TIMEOUT = "timeout"  # wall time or CPU time exceeded
    MEMORY = "memory"  # MemoryError / allocation refused
    KILLED = "killed"  # died from a signal other than the above
    ERROR = "error"  # the sandbox itself could not start (never blamed on the code)


ObservationKind = Literal["limit", "denied", "cleanup", "isolation"]


@dataclass(frozen=True)
class Observation:
    """One thing the program ran into (see the module docstring for the kinds and the two sources)."""

    kind: str  # ObservationKind, or whatever a forged "program" line claimed
    what: str  # e.g. "processes", "memory", "read", "network"
    detail: str  # one human line
    target: str = ""  # the path, address or pid concerned, when there is one
    source: str = "sandbox"  # "sandbox": seen from outside the program; "program": its own monitor (forgeable)
    count: int = 1  # how many processes of the program reported it

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "what": self.what,
            "target": self.target,
            "detail": self.detail,
            "source": self.source,
            "count": self.count,
        }


@dataclass(frozen=True)
class SandboxResult:
    """The end of one run: outcome, exit status or signal, captured output (each stream capped) and timing."""

    outcome: Outcome
    exit_code: int | None
    signal: int | None
    stdout: str
    stderr: str
    truncated: bool
    wall_seconds: float
    detail: str  # one human line, e.g. "wall time limit 10.0 s exceeded"
    isolation: str  # what was applied, e.g. "netns+pidns+ipcns+mntns+tmpfs+rlimits+uid59000+landlock"
    observations: tuple[Observation, ...] = ()  # what the program ran into: limits, refusals, leftovers

    @property
    def passed(self) -> bool:
        return self.outcome is Outcome.OK

    def observed(self, kind: str, what: str | None = None) -> list[Observation]:
        """The observations of `kind` (and `what`, when given)."""
        return [o for o in self.observations if o.kind == kind and (what is None or o.what == what)]


@dataclass
class Captured:
    """What the runner read of the launcher's stdout, stderr and report pipe (each capped)."""

    stdout: bytes
    stderr: bytes
    report: bytes
    truncated: bool
    backstop_fired: bool


def error_result(
    detail: str, started: float, stdout: str = "", stderr: str = "", truncated: bool = False
) -> SandboxResult:
    return SandboxResult(
        outcome=Outcome.ERROR,
        exit_code=None,
        signal=None,
        stdout=stdout,
        stderr=stderr,
        truncated=truncated,
        wall_seconds=time.monotonic() - started,
        detail=f"sandbox error: {detail}",
        isolation="none",
    )


def _last_line(text: str, limit: int = 200) -> str:
    for line in reversed(text.splitlines()):
        if line.strip():
            line = line.strip()
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return ""


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def parse_report(data: bytes) -> dict[str, Any] | None:
    lines = data.decode("utf-8", "replace").strip().splitlines()
    if not lines:
        return None
    try:
        report = json.loads(lines[-1])
    except ValueError:
        return None
    return report if isinstance(report, dict) else None


def _mib(size: float) -> str:
    return f"{size / (1024 * 1024):g} MiB"


def _ended(
    captured: Captured, report: dict[str, Any] | None, launcher_status: int | None, limits: SandboxLimits
) -> tuple[Outcome, str, int | None, int | None]:
    """(outcome, detail, exit code, signal) of a run."""
    stderr = captured.stderr.decode("utf-8", "replace")
    if report is None:
        if captured.backstop_fired:
            return (
                Outcome.TIMEOUT,
                f"wall time limit {limits.wall_seconds} s exceeded; the sandbox did not stop itself",
                None,
                None,
            )
        hint = _last_line(stderr)
        return (
            Outcome.ERROR,
            f"sandbox error: the launcher ended (status {launcher_status}) without a report"
            + (f": {hint}" if hint else ""),
            None,
            None,
        )
    kind = report.get("kind")
    if kind == "unavailable":
        raise SandboxUnavailable(
            f"sandbox isolation unavailable: {report.get('message')}. Set {ISOLATION_ENV}=rlimits-only to run "
            "with resource limits only (no namespace, tmpfs or Landlock confinement)"
        )
    if kind != "done":
        return Outcome.ERROR, f"sandbox error: {report.get('message') or 'unknown launcher failure'}", None, None

    exit_code = report.get("exit_code")
    sig = report.get("signal")
    cpu_used = float(report.get("cpu_seconds") or 0.0)
    if report.get("wall_killed"):
        return Outcome.TIMEOUT, f"wall time limit {limits.wall_seconds} s exceeded", exit_code, sig
    if report.get("disk_killed"):
        return Outcome.KILLED, f"the workspace grew past its {_mib(limits.max_disk_bytes)} disk limit", None, sig
    if exit_code == 0:
        return Outcome.OK, "exited with status 0", 0, None
    memory_error = _last_line(stderr).startswith("MemoryError")
    if exit_code == EXIT_MEMORY or (exit_code is not None and memory_error):
        return Outcome.MEMORY, f"memory limit {_mib(limits.memory_bytes)} exceeded (MemoryError)", exit_code, None
    if sig is not None:
        # RLIMIT_CPU is set with soft == hard, so the kernel SIGKILLs at the limit (SIGXCPU would be ignored by
        # the namespace's init); a SIGKILL the launcher did not send, with the CPU budget spent, is the CPU limit.
        # The kernel checks the limit against tick-sampled CPU time, while wait4 reports the scheduler's precise
        # sum, which on a busy (virtual) machine can be several percent lower: hence "nearly spent".
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_used >= _CPU_SPENT * limits.cpu_seconds - 0.05):
            return Outcome.TIMEOUT, f"CPU time limit {limits.cpu_seconds} s exceeded", None, sig
        if sig in (signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS) and (
            memory_error or "Cannot allocate memory" in stderr or "out of memory" in stderr.lower()
        ):
            return Outcome.MEMORY, f"killed by {_signal_name(sig)} after running out of memory", None, sig
        return Outcome.KILLED, f"killed by {_signal_name(sig)}", None, sig
    hint = _last_line(stderr)
    return Outcome.FAILED, f"exited with status {exit_code}" + (f" ({hint})" if hint else ""), exit_code, None


def _observations(
    outcome: Outcome,
    detail: str,
    captured: Captured,
    report: dict[str, Any] | None,
    limits: SandboxLimits,
    leftovers: int,
) -> tuple[Observation, ...]:
    """What the run ran into: its outcome's limit, the launcher's and the monitor's findings, weaker modes."""
    found: list[Observation] = []
    if outcome is Outcome.TIMEOUT:
        found.append(Observation("limit", "cpu time" if detail.startswith("CPU") else "wall time", detail))
    elif outcome is Outcome.MEMORY:
        found.append(Observation("limit", "memory", detail))
    if captured.truncated:
        found.append(Observation("limit", "output", f"output beyond {limits.max_output_bytes} bytes a stream dropped"))
    report = report or {}
    for item in [*(report.get("observations") or []), *(report.get("program_observations") or [])]:
        if not isinstance(item, dict):
            continue
        fields = {name: str(item.get(name) or "")[:300] for name in ("kind", "what", "target", "detail", "source")}
        if not fields["kind"] or not fields["what"]:
            continue
        count = item.get("count", 1)
        found.append(
            Observation(
                fields["kind"],
                fields["what"],
                fields["detail"],
                target=fields["target"],
                source=fields["source"] if fields["source"] in ("sandbox", "program") else "program",
                count=count if isinstance(count, int) and count > 0 else 1,
            )
        )
    if leftovers:
        found.append(Observation("cleanup", "processes", f"{leftovers} process(es) outlived the launcher; killed"))
    if report.get("kind") == "done":
        if not report.get("per_check_uid"):
            found.append(
                Observation(
                    "isolation",
                    "uid",
                    "not running as root: the program runs under the caller's uid (without its capabilities, in "
                    "a user namespace of its own), not a uid of its own; checks are separated by the namespaces "
                    "and Landlock only",
                )
            )
        isolation = str(report.get("isolation") or "")
        if "(degraded:" in isolation:
            missing = isolation.split("(degraded:", 1)[1].rstrip(")").strip()
            found.append(Observation("isolation", "degraded", f"rlimits-only mode: {missing}"))
    merged: dict[tuple[str, str, str], Observation] = {}
    for observation in found:
        key = (observation.kind, observation.what, observation.target)
        if key in merged:
            first = merged[key]
            merged[key] = dataclasses.replace(first, count=first.count + observation.count)
        else:
            merged[key] = observation
    return tuple(merged.values())


def classify(
    captured: Captured,
    report: dict[str, Any] | None,
    launcher_status: int | None,
    limits: SandboxLimits,
    wall: float,
    leftovers: int = 0,
) -> SandboxResult:
    outcome, detail, exit_code, sig = _ended(captured, report, launcher_status, limits)
    return SandboxResult(
        outcome=outcome,
        exit_code=exit_code,
        signal=sig,
        stdout=captured.stdout.decode("utf-8", "replace"),
        stderr=captured.stderr.decode("utf-8", "replace"),
        truncated=captured.truncated,
        wall_seconds=wall,
        detail=detail,
        isolation=str(report.get("isolation") or "none") if report else "none",
        observations=_observations(outcome, detail, captured, report, limits, leftovers),
    )
