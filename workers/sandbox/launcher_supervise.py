"""The sandbox launcher's supervision of the child, and its report: the wall-time limit, the setup and monitor
pipes, what the launcher observes from outside the program, the uid sweeps before and after, the report line.

Part of the launcher (launcher.py describes the whole design); standard library only, loaded by file path.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.sandbox import launcher_confine as confine
else:  # loaded by launcher.py, by file path and before this module, under this private name
    confine = sys.modules["crucible_sandbox_launcher_confine"]

_MAX_SETUP_MESSAGE = 64 * 1024
_MAX_OBSERVATION_BYTES = 256 * 1024  # what the launcher reads of the monitor's pipe; the rest is drained unread
_MAX_PROGRAM_OBSERVATIONS = 50  # distinct (kind, what, target) kept from the monitor
# How often the workspace's size is measured when no tmpfs caps it (rlimits-only mode).
_DISK_POLL_SECONDS = 0.2
# Peak resident memory above this share of the address-space limit is reported as a memory observation.
_MEMORY_NEAR = 0.75


def sweep_uid_before(plan: confine.Plan) -> None:
    """As root: kill whatever still runs under the check's uid (left by a run whose supervisor died).

    A helper takes the uid and calls kill(-1, SIGKILL), which reaches every process that uid may signal, all in
    one pass under the kernel's task-list lock, so a fork bomb cannot outrun it. Done before unshare, while a
    fork still lands in the caller's PID namespace.
    """
    pid = os.fork()
    if pid == 0:  # the helper: no Python-level cleanup, only system calls
        try:
            os.setgroups([])
            os.setresgid(plan.gid, plan.gid, plan.gid)
            os.setresuid(plan.uid, plan.uid, plan.uid)
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            os._exit(0)
        except BaseException:
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"could not clear uid {plan.uid} before the run (is it mapped in this user namespace?)")


def _sweep_uid_after(plan: confine.Plan) -> None:
    """As root, last thing: become the check's uid and kill every process left under it (never this one)."""
    os.setgroups([])
    os.setresgid(plan.gid, plan.gid, plan.gid)
    os.setresuid(plan.uid, plan.uid, plan.uid)
    # kill(-1) fails with ESRCH only when there is no other process at all, and succeeds even when none of the
    # processes it tried was ours to signal: its result says nothing about what was left.
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)


def _mib(size: float) -> str:
    return f"{size / (1024 * 1024):g} MiB"


def _uid_processes(uid: int) -> int:
    """How many processes have `uid` as their real uid (a /proc scan)."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", "rb") as fh:
                for line in fh:
                    if line.startswith(b"Uid:"):
                        count += int(line.split()[1]) == uid
                        break
        except (OSError, ValueError, IndexError):
            continue  # exited meanwhile
    return count


def _workspace_usage(path: str) -> tuple[int, list[tuple[str, int]]]:
    """(bytes the workspace takes on disk, [(relative path, size)] of its regular files), without following links."""
    total = 0
    files: list[tuple[str, int]] = []
    stack = [path]
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += st.st_blocks * 512
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
            elif entry.is_file(follow_symlinks=False):
                files.append((os.path.relpath(entry.path, path), st.st_size))
    return total, files


def _inspect_workspace(plan: confine.Plan, limits: dict[str, Any]) -> None:
    """After the run: files at the per-file size limit, a full workspace."""
    max_file = int(limits["max_file_bytes"])
    max_disk = int(limits["max_disk_bytes"])
    used, files = _workspace_usage(plan.workdir)
    for name, size in sorted(files, key=lambda item: -item[1])[:5]:
        if size >= max_file:
            confine.observe(plan, "limit", "file size", f"{name} reached the per-file limit of {_mib(max_file)}", name)
    if plan.tmpfs:
        try:
            st = os.statvfs(plan.workdir)
        except OSError:
            return
        free = st.f_bavail * st.f_frsize
        if free < max(64 * 1024, max_disk // 100):
            confine.observe(
                plan, "limit", "disk", f"the workspace filled its {_mib(max_disk)} tmpfs ({_mib(free)} left)"
            )
        elif st.f_favail == 0:
            confine.observe(
                plan, "limit", "disk", f"the workspace used all {int(limits['max_workspace_files'])} inodes"
            )
    elif used > max_disk:
        confine.observe(plan, "limit", "disk", f"the workspace took {_mib(used)}, over its {_mib(max_disk)} limit")


def _drain(fd: int, buffer: bytearray) -> bool:
    """Read what is there without blocking, up to the cap; False once there is nothing more to read (end of
    file, or the cap reached: from then on the program's monitor finds the pipe full and drops its lines)."""
    for _ in range(16):  # bounded, so that a program that never stops writing cannot hold the launcher here
        try:
            chunk = os.read(fd, min(65536, _MAX_OBSERVATION_BYTES - len(buffer)))
        except BlockingIOError:
            return True
        if not chunk:
            return False
        buffer += chunk
        if len(buffer) >= _MAX_OBSERVATION_BYTES:
            return False
    return True


def _program_observations(data: bytes) -> list[dict[str, Any]]:
    """The monitor's lines, merged by (kind, what, target) with a count; malformed lines are dropped."""
    merged: dict[tuple[str, str, str], dict[str, Any]] = {}
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if not isinstance(item, dict):
            continue
        fields = {name: str(item.get(name) or "")[:300] for name in ("kind", "what", "target", "detail")}
        if not fields["kind"] or not fields["what"]:
            continue
        key = (fields["kind"], fields["what"], fields["target"])
        if key in merged:
            merged[key]["count"] += 1
        elif len(merged) < _MAX_PROGRAM_OBSERVATIONS:
            merged[key] = {**fields, "source": "program", "count": 1}
    return list(merged.values())


def run(cfg: dict[str, Any], plan: confine.Plan, pid: int, started: float) -> dict[str, Any]:
    # One function on purpose: the supervision loop: the deadline, the setup pipe, the monitor pipe and the disk poll
    # share one poll() and its state.
    for fd in (plan.setup_w, plan.life_r, plan.obs_w, plan.ruleset_fd, *plan.python_roots.values()):
        if fd is not None:
            os.close(fd)
    limits = cfg["limits"]
    deadline = started + float(limits["wall_seconds"])
    poller = select.poll()
    poller.register(plan.setup_r, select.POLLIN)
    poller.register(plan.obs_r, select.POLLIN)
    pidfd: int | None
    try:
        pidfd = os.pidfd_open(pid)
        poller.register(pidfd, select.POLLIN)
    except OSError:
        pidfd = None  # kernel before 5.3 (degraded mode only: Landlock needs 5.13): poll the child instead
    setup = b""
    setup_open = True
    observed = bytearray()
    obs_open = True
    wall_killed = False
    disk_killed = False
    next_disk_check = time.monotonic() + _DISK_POLL_SECONDS
    while True:
        now = time.monotonic()
        remaining = deadline - now
        if remaining <= 0:
            if plan.is_root:
                alive = _uid_processes(plan.uid)
                if alive >= int(limits["max_processes"]):
                    confine.observe(
                        plan,
                        "limit",
                        "processes",
                        f"{alive} processes were running at the wall-time kill (limit {limits['max_processes']})",
                    )
            # Killing PID 1 of the namespace makes the kernel kill every other process in it.
            os.kill(pid, signal.SIGKILL)
            wall_killed = True
            break
        if not plan.tmpfs and now >= next_disk_check:
            # No tmpfs caps the workspace (rlimits-only mode): measure it, and stop the program past the limit.
            used, _ = _workspace_usage(plan.workdir)
            if used > int(limits["max_disk_bytes"]):
                os.kill(pid, signal.SIGKILL)
                disk_killed = True
                break
            next_disk_check = now + _DISK_POLL_SECONDS
        wait = remaining if plan.tmpfs else min(remaining, _DISK_POLL_SECONDS)
        if pidfd is None:
            wait = min(wait, 0.05)
        events = poller.poll(max(1, int(wait * 1000)))
        # WNOWAIT: look without reaping, so that wait4 below still collects the status and usage.
        exited = pidfd is None and os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        for fd, _ in events:
            if fd == pidfd:
                exited = True
            elif fd == plan.obs_r:
                if not _drain(plan.obs_r, observed):
                    poller.unregister(plan.obs_r)
                    obs_open = False
            elif setup_open:
                chunk = os.read(plan.setup_r, 65536)
                if chunk:
                    setup = (setup + chunk)[:_MAX_SETUP_MESSAGE]
                else:
                    poller.unregister(plan.setup_r)
                    setup_open = False
        if exited:
            break
    # For a namespace init, wait4 returns only once every process of the namespace has been reaped.
    _, status, usage = os.wait4(pid, 0)
    if pidfd is not None:
        os.close(pidfd)
    if not plan.pidns:
        # Degraded mode: no namespace to tear down, so at least kill what stayed in the child's session.
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    while setup_open:
        chunk = os.read(plan.setup_r, 65536)  # every writer is gone, so this reaches EOF
        setup = (setup + chunk)[:_MAX_SETUP_MESSAGE]
        setup_open = bool(chunk)
    os.close(plan.setup_r)
    os.close(plan.life_w)
    if obs_open:
        _drain(plan.obs_r, observed)  # only a degraded run can leave writers behind: take what is there
    os.close(plan.obs_r)

    exit_code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    message = _parse_setup(setup)
    if not message.get("ok"):
        how = f"exit status {exit_code}" if exit_code is not None else f"signal {sig}"
        detail = message.get("message") or f"the sandbox child ended during setup ({how})"
        if wall_killed:
            detail = f"the sandbox setup did not finish within the wall time limit: {detail}"
        return {"kind": "error", "message": str(detail), "swept": _finish(plan)}
    peak = usage.ru_maxrss * 1024  # KiB on Linux
    if peak >= _MEMORY_NEAR * int(limits["memory_bytes"]):
        confine.observe(
            plan, "limit", "memory", f"peak resident memory {_mib(peak)}, near the {_mib(limits['memory_bytes'])} limit"
        )
    if disk_killed:
        confine.observe(
            plan, "limit", "disk", f"the workspace grew past its {_mib(limits['max_disk_bytes'])} disk limit"
        )
    else:
        _inspect_workspace(plan, limits)
    layers = [*plan.layers, *(str(layer) for layer in message.get("layers", []))]
    isolation = "+".join(layers)
    if plan.missing:
        isolation += f" (degraded: no {', no '.join(plan.missing)})"
    swept = _finish(plan)
    return {
        "kind": "done",
        "exit_code": exit_code,
        "signal": sig,
        "wall_killed": wall_killed,
        "disk_killed": disk_killed,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "isolation": isolation,
        "landlock_abi": plan.landlock_abi,
        "uid": plan.uid,
        "per_check_uid": plan.is_root,
        "swept": swept,
        "observations": plan.observations,
        "program_observations": _program_observations(bytes(observed)),
    }


def _finish(plan: confine.Plan) -> bool:
    """As root, the last step: kill every process left under the check's uid. True once that was done."""
    if not plan.is_root:
        return False
    if not plan.pidns:
        # With a PID namespace nothing can be left (wait4 on its init returned); without one, count first.
        left = _uid_processes(plan.uid)
        if left:
            confine.observe(plan, "cleanup", "processes", f"{left} process(es) outlived the program and were killed")
    try:
        _sweep_uid_after(plan)
    except OSError:
        return False
    return True


def _parse_setup(data: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(data.decode("utf-8", "replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def write_report(fd: int, report: dict[str, Any]) -> None:
    data = (json.dumps(report) + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]
    os.close(fd)
