"""Run untrusted, model-written Python code in a confined child process and report how it ended.

    result = run_python(completion + "\\n\\n" + tests, limits=SandboxLimits(wall_seconds=5, cpu_seconds=5))
    if result.passed:            # exited 0
        ...
    result.outcome, result.detail, result.stdout, result.stderr

Each call gets a fresh private directory (`crucible-sandbox-*` under the system temp dir, mode 0700, owned by
the check's uid) holding the code as `main.py` plus the caller's `files`; it is the program's working directory,
the only place it may write, and is removed afterwards whatever happens. The program runs under `python -I -S`
with only PATH, LANG and CRUCIBLE_SANDBOX=1 in its environment (none of the caller's variables), with `stdin` as
its standard input.

What confines it (see `launcher.py` for how):

- a uid of its own: when the caller is root, each concurrent check leases a uid (and the gid of the same number)
  from CRUCIBLE_SANDBOX_UIDS (default 59000-59999; uids that have an account or a group are skipped) for its
  whole run, and the program runs under it with no supplementary groups and no_new_privs. RLIMIT_NPROC counts
  processes per uid, so one check's fork bomb cannot use up another's process limit, and no check can read,
  write or signal another's files or processes even without the layers below. At the end every process of
  that uid is killed (kill(-1) as the uid), then the uid is released; a check whose predecessor under the uid
  did not end that way (its worker died) starts with the same sweep. Leases are `flock`s on files in a
  root-only directory (/run/crucible-sandbox-uids, else under the temp dir), so separate worker processes on
  one machine never share a uid, and a crashed worker's leases free themselves. The range must be one that
  nothing else on the machine runs as. When the caller is not root there is no uid to give: the program runs
  as the caller's uid and gives up every capability in its user namespace, a weaker mode that every result
  says in its observations (kind "isolation");
- new network, PID, IPC and mount namespaces (plus a user namespace when the caller is not root): no network at
  all, not even loopback; the program is PID 1 of its namespace, so when it ends or is killed every process it
  started dies with it, and it can see or signal nothing outside;
- its directory is a tmpfs of `max_disk_bytes` (and a bounded number of files) mounted over the private
  directory in its own mount namespace, so the whole workspace is capped, not just each file;
- Landlock: reads and execution only below the Python installation, /usr, /lib, /lib64, /bin, plus
  /etc/ld.so.cache, /dev/null and /dev/urandom (and the caller's virtual environment, for a run that asks to start
  the project's interpreter: `run_python(..., python_environment=True)`); full access only to its own directory;
  no TCP bind/connect; no signals or abstract unix sockets out of its domain (each as far as the kernel's Landlock
  ABI supports);
- rlimits: CPU time, address space, process count, file size, open files, no core dumps.

The launcher enforces the wall-time limit; this module kills the launcher's whole process group when it overruns
by more than a grace period, and the sandbox dies with the launcher.

Observations: `SandboxResult.observations` lists what the program ran into, one `Observation` each, e.g.
`{"kind": "denied", "what": "read", "target": "/etc/shadow", "source": "program", ...}` or `{"kind": "limit",
"what": "processes", "source": "sandbox", ...}`. Kinds: "limit" (what: wall time, cpu time, memory, processes,
file size, disk, open files, output), "denied" (what: read, write, network, signal, exec), "cleanup" (processes
outlived the program and were killed) and "isolation" (a weaker mode is in force). Source "sandbox" is what the
launcher or this module saw from outside the program; source "program" comes from the monitor inside the
program's own process (monitor.py), which reports refused calls made through Python's own functions and which
the program could forge or silence. Neither is the confinement: a refused call is refused whether or not it is
reported.

Isolation mode, from the environment variable CRUCIBLE_SANDBOX_ISOLATION:

- "strict" (the default): every layer above is required (a caller that is not root runs the program under its
  own uid, as said above). When the machine cannot provide the namespaces, the workspace tmpfs or Landlock,
  `run_python` raises `SandboxUnavailable` instead of running anything.
- "rlimits-only": a degraded mode for machines without them. Layers that can be applied still are; missing
  ones are listed in `SandboxResult.isolation` ("... (degraded: no namespaces, no workspace tmpfs, no
  landlock)") and in an "isolation" observation. Without namespaces the program can reach the network and
  leave processes behind (as root these are killed with the check's uid at the end); without the tmpfs the
  workspace's size is measured every 0.2 s and the program killed past the limit. Do not use it for untrusted
  code on a machine that matters.

Caveats: the exit status is under the program's control (it can `os._exit(0)` before its tests run), so graders
should also check for output the tests print after they pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from workers.sandbox import uids
from workers.sandbox.uids import SandboxUnavailable

log = logging.getLogger("crucible.sandbox")


ISOLATION_ENV = "CRUCIBLE_SANDBOX_ISOLATION"
ISOLATION_MODES = ("strict", "rlimits-only")

_LAUNCHER = Path(__file__).with_name("launcher.py")
_MAX_OPEN_FILES = 256
_MAX_WORKSPACE_FILES = 4096  # inodes of the workspace tmpfs
# Share of the CPU limit that, used by a program the kernel SIGKILLed, marks the CPU limit as the cause.
_CPU_SPENT = 0.85
# Exit status the launcher's child uses for an uncaught MemoryError.
_EXIT_MEMORY = 77
# How long past wall_seconds the launcher may take (interpreter start-up, namespace teardown) before it is killed.
_LAUNCHER_GRACE_SECONDS = 5.0
# How long to keep reading output after the launcher was killed or has exited.
_DRAIN_SECONDS = 2.0
_MAX_REPORT_BYTES = 1024 * 1024
_CHILD_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "CRUCIBLE_SANDBOX": "1"}


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
    max_workspace_files: int = _MAX_WORKSPACE_FILES  # inodes of the workspace tmpfs (files and directories)

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


def isolation_mode() -> str:
    """The isolation mode from CRUCIBLE_SANDBOX_ISOLATION ("strict" when unset)."""
    mode = os.environ.get(ISOLATION_ENV, "").strip().lower() or "strict"
    if mode not in ISOLATION_MODES:
        raise SandboxUnavailable(f"{ISOLATION_ENV}={mode!r} is not one of {', '.join(ISOLATION_MODES)}")
    return mode


def run_python(
    code: str,
    *,
    limits: SandboxLimits = SandboxLimits(),  # noqa: B008 - frozen, so one shared default is safe
    files: Mapping[str, str | bytes] | None = None,
    stdin: str = "",
    python_environment: bool = False,
) -> SandboxResult:
    """Run `code` as a Python program in the sandbox and return how it ended.

    `files` maps relative paths to text (written as UTF-8) or bytes, written next to `main.py` (importable as
    modules). With `python_environment`, the program may also start the calling interpreter's environment as a
    subprocess (its virtual environment's `bin/python`, with the packages installed there, e.g. pytest): the
    environment's directory becomes readable and executable like the base installation, and, as root, every
    directory of the installation is made reachable by the check's uid even where an ancestor is closed to it
    (e.g. a pyenv under /root, mode 0700): a small tmpfs over that ancestor holds bind mounts of the installation
    alone, in the sandbox's own mount namespace. Raises
    `SandboxUnavailable` in strict mode when namespaces, the workspace tmpfs or Landlock are missing (and for a
    bad CRUCIBLE_SANDBOX_ISOLATION or CRUCIBLE_SANDBOX_UIDS), and `ValueError` for a bad file name; every other
    failure of the sandbox itself is an `Outcome.ERROR` result.
    """
    mode = isolation_mode()
    if not sys.platform.startswith("linux"):
        # The launcher is Linux-specific (prctl, pidfd, /proc) even in rlimits-only mode.
        raise SandboxUnavailable(f"the sandbox runs only on Linux, not on {sys.platform} ({ISOLATION_ENV}={mode})")
    extra = _checked_files(files)
    started = time.monotonic()
    lease: uids.Lease | None = None
    if os.geteuid() == 0:
        lease = uids.lease_uid()
        if lease is None:
            free = uids.sandbox_uids()
            return _error(
                f"no free uid in {free[0]}-{free[-1]} ({uids.UIDS_ENV}) after {uids.LEASE_WAIT_SECONDS:g} s", started
            )
    try:
        workdir = tempfile.mkdtemp(prefix="crucible-sandbox-")
        try:
            try:
                _populate(Path(workdir), code, extra, lease)
            except OSError as exc:
                return _error(f"could not prepare the sandbox directory: {exc}", started)
            return _execute(workdir, limits, stdin, mode, started, lease, python_environment)
        finally:
            _remove_tree(workdir)
    finally:
        if lease is not None:
            lease.release()


def _checked_files(files: Mapping[str, str | bytes] | None) -> dict[PurePosixPath, str | bytes]:
    checked: dict[PurePosixPath, str | bytes] = {}
    for name, content in (files or {}).items():
        rel = PurePosixPath(name)
        if not rel.parts or rel.is_absolute() or ".." in rel.parts or rel == PurePosixPath("main.py"):
            raise ValueError(f"file name {name!r} must be a relative path inside the sandbox, other than main.py")
        checked[rel] = content
    return checked


def _populate(workdir: Path, code: str, files: dict[PurePosixPath, str | bytes], lease: uids.Lease | None) -> None:
    (workdir / "main.py").write_text(code, encoding="utf-8")
    made: set[PurePosixPath] = set()
    for rel, content in files.items():
        target = workdir.joinpath(*rel.parts)
        if rel.parent not in made:
            target.parent.mkdir(parents=True, exist_ok=True)
            made.add(rel.parent)
        if isinstance(content, str):
            target.write_text(content, encoding="utf-8")
        else:
            target.write_bytes(content)
    if lease is not None:
        # The directory (0700 from mkdtemp) and everything in it belong to the check's uid alone.
        for root, dirs, names in os.walk(workdir):
            os.chown(root, lease.uid, lease.uid)
            for name in [*dirs, *names]:
                os.chown(os.path.join(root, name), lease.uid, lease.uid, follow_symlinks=False)


def _remove_tree(path: str) -> None:
    try:
        shutil.rmtree(path)
        return
    except FileNotFoundError:
        return
    except OSError:
        pass
    # The program may have made directories unreadable (only possible when we are not root): open them up.
    # Every process of the sandbox is dead by now, so nothing can swap a directory for a symlink meanwhile.
    for root, dirs, _ in os.walk(path):
        for name in dirs:
            child = os.path.join(root, name)
            if not os.path.islink(child):
                with contextlib.suppress(OSError):
                    os.chmod(child, 0o700)
    shutil.rmtree(path, ignore_errors=True)
    if os.path.exists(path):
        log.warning("could not remove sandbox directory %s", path)


def _python_dirs() -> list[str]:
    """The calling interpreter's installation and its virtual environment, as real paths."""
    return list(dict.fromkeys(os.path.realpath(p) for p in (sys.prefix, sys.exec_prefix, sys.base_prefix)))


def _build_config(
    workdir: str,
    limits: SandboxLimits,
    mode: str,
    report_fd: int,
    uid: int | None = None,
    python_environment: bool = False,
) -> dict[str, Any]:
    return {
        # Read and execute below these too, reachable by the check's uid (see run_python's python_environment).
        "python_dirs": _python_dirs() if python_environment else [],
        "mode": mode,
        "parent_pid": os.getpid(),
        "report_fd": report_fd,
        "workdir": workdir,
        "main": os.path.join(workdir, "main.py"),
        "uid": uid,  # None when we are not root: the launcher keeps the caller's uid
        "gid": uid,
        "memory_exit_code": _EXIT_MEMORY,
        "limits": {
            "wall_seconds": limits.wall_seconds,
            "cpu_seconds": limits.cpu_seconds,
            "memory_bytes": limits.memory_bytes,
            "max_processes": limits.max_processes,
            "max_file_bytes": limits.max_file_bytes,
            "max_disk_bytes": limits.max_disk_bytes,
            "max_workspace_files": limits.max_workspace_files,
            "max_open_files": _MAX_OPEN_FILES,
        },
    }


@dataclass
class _Captured:
    stdout: bytes
    stderr: bytes
    report: bytes
    truncated: bool
    backstop_fired: bool


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # The launcher leads its own session (start_new_session); the sandbox dies with it (parent-death signal).
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        proc.kill()


def _capture(proc: subprocess.Popen[bytes], report_r: int, limits: SandboxLimits, started: float) -> _Captured:
    """Read stdout, stderr and the launcher's report concurrently, keeping at most the caps, until all close."""
    assert proc.stdout is not None and proc.stderr is not None
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    caps = {out_fd: limits.max_output_bytes, err_fd: limits.max_output_bytes, report_r: _MAX_REPORT_BYTES}
    kept: dict[int, bytearray] = {fd: bytearray() for fd in caps}
    truncated = False
    backstop_fired = False
    deadline = started + limits.wall_seconds + _LAUNCHER_GRACE_SECONDS
    launcher_gone_at: float | None = None
    with selectors.DefaultSelector() as selector:
        for fd in caps:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            now = time.monotonic()
            if launcher_gone_at is None and report_r not in selector.get_map() and proc.poll() is not None:
                launcher_gone_at = now
                # The namespace is gone with the launcher; only a degraded run can leave writers behind.
                deadline = min(deadline, now + _DRAIN_SECONDS)
            if now >= deadline:
                if backstop_fired or launcher_gone_at is not None:
                    break
                # Keep reading until the pipes close: a program that fills them must never block its own kill.
                _kill_group(proc)
                backstop_fired = True
                deadline = now + _DRAIN_SECONDS
                continue
            for key, _ in selector.select(min(deadline - now, 0.25)):
                fd = int(key.fd)
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    selector.unregister(fd)
                    continue
                room = caps[fd] - len(kept[fd])
                if room > 0:
                    kept[fd] += chunk[:room]
                if len(chunk) > room and fd != report_r:
                    truncated = True
    return _Captured(bytes(kept[out_fd]), bytes(kept[err_fd]), bytes(kept[report_r]), truncated, backstop_fired)


def _execute(
    workdir: str,
    limits: SandboxLimits,
    stdin: str,
    mode: str,
    started: float,
    lease: uids.Lease | None,
    python_environment: bool = False,
) -> SandboxResult:
    report_r, report_w = os.pipe()
    uid = lease.uid if lease is not None else None
    try:
        with tempfile.TemporaryFile() as stdin_file:
            # A file rather than a pipe: no writer thread, and no deadlock when the program never reads it.
            stdin_file.write(stdin.encode("utf-8"))
            stdin_file.seek(0)
            config = _build_config(workdir, limits, mode, report_w, uid=uid, python_environment=python_environment)
            # Killing leftovers first costs a fork: needed only after a check that did not end with its sweep.
            config["sweep_before"] = lease is not None and not lease.clean
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", str(_LAUNCHER), json.dumps(config)],
                    stdin=stdin_file,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    pass_fds=(report_w,),
                    cwd=workdir,
                    env=dict(_CHILD_ENV),
                    start_new_session=True,
                )
            except (OSError, ValueError, subprocess.SubprocessError) as exc:
                return _error(f"could not start the sandbox launcher: {exc}", started)
            finally:
                os.close(report_w)
        with proc:
            try:
                captured = _capture(proc, report_r, limits, started)
            except BaseException:
                _kill_group(proc)  # e.g. KeyboardInterrupt in the caller: do not leave the sandbox running
                raise
            finally:
                try:
                    proc.wait(timeout=_DRAIN_SECONDS)
                except subprocess.TimeoutExpired:
                    _kill_group(proc)
                    proc.wait()
    finally:
        os.close(report_r)
    report = _parse_report(captured.report)
    leftovers = 0
    if lease is not None:
        if (report or {}).get("swept"):
            lease.mark(True)
        else:
            # The launcher died (or failed) before its own last step: kill what runs under the uid now (the lease
            # stays marked dirty, so the next check under it kills leftovers first too).
            leftovers = uids.sweep_uid(lease.uid)
    return _classify(captured, report, proc.returncode, limits, time.monotonic() - started, leftovers)


def _error(detail: str, started: float, stdout: str = "", stderr: str = "", truncated: bool = False) -> SandboxResult:
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


def _parse_report(data: bytes) -> dict[str, Any] | None:
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
    captured: _Captured, report: dict[str, Any] | None, launcher_status: int | None, limits: SandboxLimits
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
    if exit_code == _EXIT_MEMORY or (exit_code is not None and memory_error):
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
    captured: _Captured,
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


def _classify(
    captured: _Captured,
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
