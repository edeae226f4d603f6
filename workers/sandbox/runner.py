"""Run untrusted, model-written Python code in a confined child process and report how it ended.

    result = run_python(completion + "\\n\\n" + tests, limits=SandboxLimits(wall_seconds=5, cpu_seconds=5))
    if result.passed:            # exited 0
        ...
    result.outcome, result.detail, result.stdout, result.stderr

Each call gets a fresh private directory (`crucible-sandbox-*` under the system temp dir) holding the code as
`main.py` plus the caller's `files`; it is the program's working directory, the only place it may write, and is
removed afterwards whatever happens. The program runs under `python -I -S` with only PATH, LANG and
CRUCIBLE_SANDBOX=1 in its environment (none of the caller's variables), with `stdin` as its standard input.

What confines it (see `launcher.py` for how):

- new network, PID and IPC namespaces (plus a user namespace when the caller is not root): no network at all,
  not even loopback; the program is PID 1 of its namespace, so when it ends or is killed every process it
  started dies with it, and it can see or signal nothing outside;
- Landlock: reads and execution only below the Python installation, /usr, /lib, /lib64, /bin, plus
  /etc/ld.so.cache, /dev/null and /dev/urandom; full access only to its own directory; no TCP bind/connect;
  no signals or abstract unix sockets out of its domain (each as far as the kernel's Landlock ABI supports);
- rlimits: CPU time, address space, process count, file size, open files, no core dumps;
- when the caller is root, the program runs as uid/gid 65534 (nobody) with no supplementary groups and
  no_new_privs; otherwise it gives up every capability in its user namespace.

The launcher enforces the wall-time limit; this module kills the launcher's whole process group when it overruns
by more than a grace period, and the sandbox dies with the launcher.

Isolation mode, from the environment variable CRUCIBLE_SANDBOX_ISOLATION:

- "strict" (the default): every layer above is required. When the machine cannot provide namespaces or
  Landlock, `run_python` raises `SandboxUnavailable` instead of running anything.
- "rlimits-only": a degraded mode for machines without them. Layers that can be applied still are; missing
  ones are listed in `SandboxResult.isolation` ("... (degraded: no namespaces, no landlock)"). Without
  namespaces the program can reach the network and leave processes behind; do not use it for untrusted code on
  a machine that matters.

Caveats: the exit status is under the program's control (it can `os._exit(0)` before its tests run), so graders
should also check for output the tests print after they pass. As root, RLIMIT_NPROC counts every process of uid
65534 on the machine, so concurrent sandboxes share the `max_processes` budget and a fork bomb in one can make
process creation fail in the others until it is killed.
"""

from __future__ import annotations

import contextlib
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
from typing import Any

log = logging.getLogger("crucible.sandbox")

ISOLATION_ENV = "CRUCIBLE_SANDBOX_ISOLATION"
ISOLATION_MODES = ("strict", "rlimits-only")

_LAUNCHER = Path(__file__).with_name("launcher.py")
_SANDBOX_UID = 65534
_SANDBOX_GID = 65534
_MAX_OPEN_FILES = 256
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

    def __post_init__(self) -> None:
        if not (math.isfinite(self.wall_seconds) and self.wall_seconds > 0):
            raise ValueError(f"wall_seconds must be a positive number, got {self.wall_seconds!r}")
        for name in ("cpu_seconds", "memory_bytes", "max_processes"):
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
    isolation: str  # what was applied, e.g. "netns+pidns+ipcns+rlimits+uid65534+landlock"

    @property
    def passed(self) -> bool:
        return self.outcome is Outcome.OK


class SandboxUnavailable(RuntimeError):
    """The machine cannot provide the isolation the current mode requires (see CRUCIBLE_SANDBOX_ISOLATION)."""


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
    files: dict[str, str] | None = None,
    stdin: str = "",
) -> SandboxResult:
    """Run `code` as a Python program in the sandbox and return how it ended.

    `files` maps relative paths to text written next to `main.py` (importable as modules). Raises
    `SandboxUnavailable` in strict mode when namespaces or Landlock are missing, and `ValueError` for a bad file
    name; every other failure of the sandbox itself is an `Outcome.ERROR` result.
    """
    mode = isolation_mode()
    if not sys.platform.startswith("linux"):
        # The launcher is Linux-specific (prctl, pidfd, /proc) even in rlimits-only mode.
        raise SandboxUnavailable(f"the sandbox runs only on Linux, not on {sys.platform} ({ISOLATION_ENV}={mode})")
    extra = _checked_files(files)
    started = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="crucible-sandbox-")
    try:
        try:
            _populate(Path(workdir), code, extra)
        except OSError as exc:
            return _error(f"could not prepare the sandbox directory: {exc}", started)
        return _execute(workdir, limits, stdin, mode, started)
    finally:
        _remove_tree(workdir)


def _checked_files(files: Mapping[str, str] | None) -> dict[PurePosixPath, str]:
    checked: dict[PurePosixPath, str] = {}
    for name, content in (files or {}).items():
        rel = PurePosixPath(name)
        if not rel.parts or rel.is_absolute() or ".." in rel.parts or rel == PurePosixPath("main.py"):
            raise ValueError(f"file name {name!r} must be a relative path inside the sandbox, other than main.py")
        checked[rel] = content
    return checked


def _populate(workdir: Path, code: str, files: dict[PurePosixPath, str]) -> None:
    (workdir / "main.py").write_text(code, encoding="utf-8")
    for rel, content in files.items():
        target = workdir.joinpath(*rel.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
    if os.geteuid() == 0:
        # The program runs as uid 65534: it must own its directory to write there (mkdtemp made it 0700).
        for root, dirs, names in os.walk(workdir):
            os.chown(root, _SANDBOX_UID, _SANDBOX_GID)
            for name in [*dirs, *names]:
                os.chown(os.path.join(root, name), _SANDBOX_UID, _SANDBOX_GID, follow_symlinks=False)


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


def _build_config(workdir: str, limits: SandboxLimits, mode: str, report_fd: int) -> dict[str, Any]:
    return {
        "mode": mode,
        "parent_pid": os.getpid(),
        "report_fd": report_fd,
        "workdir": workdir,
        "main": os.path.join(workdir, "main.py"),
        "uid": _SANDBOX_UID,
        "gid": _SANDBOX_GID,
        "memory_exit_code": _EXIT_MEMORY,
        "limits": {
            "wall_seconds": limits.wall_seconds,
            "cpu_seconds": limits.cpu_seconds,
            "memory_bytes": limits.memory_bytes,
            "max_processes": limits.max_processes,
            "max_file_bytes": limits.max_file_bytes,
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


def _execute(workdir: str, limits: SandboxLimits, stdin: str, mode: str, started: float) -> SandboxResult:
    report_r, report_w = os.pipe()
    try:
        with tempfile.TemporaryFile() as stdin_file:
            # A file rather than a pipe: no writer thread, and no deadlock when the program never reads it.
            stdin_file.write(stdin.encode("utf-8"))
            stdin_file.seek(0)
            config = _build_config(workdir, limits, mode, report_w)
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
    return _classify(captured, proc.returncode, limits, time.monotonic() - started)


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


def _classify(captured: _Captured, launcher_status: int | None, limits: SandboxLimits, wall: float) -> SandboxResult:
    stdout = captured.stdout.decode("utf-8", "replace")
    stderr = captured.stderr.decode("utf-8", "replace")
    report = _parse_report(captured.report)

    def result(outcome: Outcome, detail: str, exit_code: int | None = None, sig: int | None = None) -> SandboxResult:
        isolation = str(report.get("isolation") or "none") if report else "none"
        return SandboxResult(outcome, exit_code, sig, stdout, stderr, captured.truncated, wall, detail, isolation)

    if report is None:
        if captured.backstop_fired:
            return result(
                Outcome.TIMEOUT, f"wall time limit {limits.wall_seconds} s exceeded; the sandbox did not stop itself"
            )
        hint = _last_line(stderr)
        return result(
            Outcome.ERROR,
            f"sandbox error: the launcher ended (status {launcher_status}) without a report"
            + (f": {hint}" if hint else ""),
        )
    kind = report.get("kind")
    if kind == "unavailable":
        raise SandboxUnavailable(
            f"sandbox isolation unavailable: {report.get('message')}. Set {ISOLATION_ENV}=rlimits-only to run "
            "with resource limits only (no namespace or Landlock confinement)"
        )
    if kind != "done":
        return result(Outcome.ERROR, f"sandbox error: {report.get('message') or 'unknown launcher failure'}")

    exit_code = report.get("exit_code")
    sig = report.get("signal")
    cpu_used = float(report.get("cpu_seconds") or 0.0)
    if report.get("wall_killed"):
        return result(Outcome.TIMEOUT, f"wall time limit {limits.wall_seconds} s exceeded", exit_code, sig)
    if exit_code == 0:
        return result(Outcome.OK, "exited with status 0", 0)
    memory_error = _last_line(stderr).startswith("MemoryError")
    if exit_code == _EXIT_MEMORY or (exit_code is not None and memory_error):
        mib = limits.memory_bytes / (1024 * 1024)
        return result(Outcome.MEMORY, f"memory limit {mib:g} MiB exceeded (MemoryError)", exit_code)
    if sig is not None:
        # RLIMIT_CPU is set with soft == hard, so the kernel SIGKILLs at the limit (SIGXCPU would be ignored by
        # the namespace's init); a SIGKILL the launcher did not send, with the CPU budget spent, is the CPU limit.
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_used >= limits.cpu_seconds - 0.05):
            return result(Outcome.TIMEOUT, f"CPU time limit {limits.cpu_seconds} s exceeded", None, sig)
        if sig in (signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS) and (
            memory_error or "Cannot allocate memory" in stderr or "out of memory" in stderr.lower()
        ):
            return result(Outcome.MEMORY, f"killed by {_signal_name(sig)} after running out of memory", None, sig)
        return result(Outcome.KILLED, f"killed by {_signal_name(sig)}", None, sig)
    hint = _last_line(stderr)
    return result(Outcome.FAILED, f"exited with status {exit_code}" + (f" ({hint})" if hint else ""), exit_code)
