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

The limits and the result types, and the reading of the launcher's report into a result, are in `results.py`.

Caveats: the exit status is under the program's control (it can `os._exit(0)` before its tests run), so graders
should also check for output the tests print after they pass.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from workers.sandbox import uids
from workers.sandbox.results import (
    EXIT_MEMORY,
    ISOLATION_ENV,
    ISOLATION_MODES,
    Captured,
    Observation,
    ObservationKind,
    Outcome,
    SandboxLimits,
    SandboxResult,
    classify,
    error_result,
    parse_report,
)
from workers.sandbox.uids import SandboxUnavailable

log = logging.getLogger("crucible.sandbox")

# The limits and results live in results.py; these are the sandbox's public names, imported from here.
__all__ = [
    "ISOLATION_ENV",
    "ISOLATION_MODES",
    "Observation",
    "ObservationKind",
    "Outcome",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailable",
    "isolation_mode",
    "run_python",
]

_LAUNCHER = Path(__file__).with_name("launcher.py")
_MAX_OPEN_FILES = 256
# How long past wall_seconds the launcher may take (interpreter start-up, namespace teardown) before it is killed.
_LAUNCHER_GRACE_SECONDS = 5.0
# How long to keep reading output after the launcher was killed or has exited.
_DRAIN_SECONDS = 2.0
_MAX_REPORT_BYTES = 1024 * 1024
_CHILD_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "CRUCIBLE_SANDBOX": "1"}


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
            return error_result(
                f"no free uid in {free[0]}-{free[-1]} ({uids.UIDS_ENV}) after {uids.LEASE_WAIT_SECONDS:g} s", started
            )
    try:
        workdir = tempfile.mkdtemp(prefix="crucible-sandbox-")
        try:
            try:
                _populate(Path(workdir), code, extra, lease)
            except OSError as exc:
                return error_result(f"could not prepare the sandbox directory: {exc}", started)
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
        "memory_exit_code": EXIT_MEMORY,
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


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    # The launcher leads its own session (start_new_session); the sandbox dies with it (parent-death signal).
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        proc.kill()


def _capture(proc: subprocess.Popen[bytes], report_r: int, limits: SandboxLimits, started: float) -> Captured:
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
    return Captured(bytes(kept[out_fd]), bytes(kept[err_fd]), bytes(kept[report_r]), truncated, backstop_fired)


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
                return error_result(f"could not start the sandbox launcher: {exc}", started)
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
    report = parse_report(captured.report)
    leftovers = 0
    if lease is not None:
        if (report or {}).get("swept"):
            lease.mark(True)
        else:
            # The launcher died (or failed) before its own last step: kill what runs under the uid now (the lease
            # stays marked dirty, so the next check under it kills leftovers first too).
            leftovers = uids.sweep_uid(lease.uid)
    return classify(captured, report, proc.returncode, limits, time.monotonic() - started, leftovers)
