"""The sandbox launcher's child, PID 1 of the new namespaces: it restricts itself, then runs the untrusted code.

Part of the launcher (launcher.py describes the whole design and the setup pipe's protocol); standard library
only, loaded by the launcher by file path before it forks, so nothing here needs a file once the child is
confined.
"""

from __future__ import annotations

import builtins
import ctypes
import json
import os
import platform
import resource
import select
import signal
import sys
import traceback
import types
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from workers.sandbox import launcher_confine as confine
    from workers.sandbox import launcher_linux as linux
else:  # loaded by launcher.py, by file path and before this module, under this private name
    linux = sys.modules["crucible_sandbox_launcher_linux"]

# Exit status of a child that failed before the code ran (only meaningful together with a missing "ok").
_EXIT_SETUP = 70
# The monitor's wrappers, like this module's own frame, are left out of the code's tracebacks.
_MONITOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "monitor.py")


def _close_fds_except(keep: set[int]) -> None:
    # Drop everything inherited from the caller (its sockets, database connections) before the code can see it.
    lowest = 0
    for fd in sorted(keep):
        if fd > lowest:
            os.closerange(lowest, fd)
        lowest = fd + 1
    os.closerange(lowest, resource.getrlimit(resource.RLIMIT_NOFILE)[1])


def _set_rlimits(limits: dict[str, Any]) -> None:
    cpu = int(limits["cpu_seconds"])
    for which, value in (
        (resource.RLIMIT_CORE, 0),
        # soft == hard: the kernel then sends SIGKILL at the limit. SIGXCPU (the soft-limit signal) would be
        # ignored by a namespace init that has no handler for it, so it would only postpone the kill.
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_AS, int(limits["memory_bytes"])),
        (resource.RLIMIT_FSIZE, int(limits["max_file_bytes"])),
        (resource.RLIMIT_NOFILE, int(limits["max_open_files"])),
        # Counted per uid; root ignores it, which is one reason the child must not stay root.
        (resource.RLIMIT_NPROC, int(limits["max_processes"])),
    ):
        # Never above the hard limit we were given: an unprivileged caller could not raise it, and lower is safer.
        hard = resource.getrlimit(which)[1]
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))


def _drop_privileges(plan: confine.Plan) -> str:
    if plan.is_root:
        os.setgroups([])
        os.setresgid(plan.gid, plan.gid, plan.gid)
        os.setresuid(plan.uid, plan.uid, plan.uid)
        if os.getuid() != plan.uid or os.geteuid() != plan.uid or os.getegid() != plan.gid:
            raise RuntimeError("the uid/gid change did not take")
        try:
            os.setuid(0)
        except PermissionError:
            pass
        else:
            raise RuntimeError("root could be regained after the uid change")
        return f"uid{plan.uid}"
    # In our own user namespace we hold every capability there; give them all up (permitted = 0 is final).
    header = linux.CapHeader(version=linux.LINUX_CAPABILITY_VERSION_3, pid=0)
    data = (linux.CapData * 2)()
    linux.check(int(linux.libc.capset(ctypes.byref(header), data)), "capset")
    return "nocaps"


def _reroute_sys_path(plan: confine.Plan) -> None:
    """Point import locations the sandbox uid cannot traverse at the held /proc/self/fd/N magic links.

    Covers sys.path and the __path__ of packages the launcher already imported (encodings, json, ctypes, ...),
    whose submodules would otherwise fail to import (e.g. encodings.idna, needed by socket name lookups).
    """

    used: set[int] = set()

    def reroute(entry: str) -> str:
        try:
            os.stat(entry)
            return entry
        except PermissionError:
            pass  # an ancestor directory is closed to the sandbox uid
        except OSError:
            return entry  # missing (e.g. python311.zip): nothing to reach
        for root, fd in plan.python_roots.items():
            base = root.rstrip("/")
            if entry == base or entry.startswith(base + "/"):
                used.add(fd)
                return f"/proc/self/fd/{fd}{entry[len(base) :]}"
        return entry

    sys.path[:] = [reroute(entry) for entry in sys.path]
    for module in list(sys.modules.values()):
        search = getattr(module, "__path__", None)
        if isinstance(search, list):
            search[:] = [reroute(entry) if isinstance(entry, str) else entry for entry in search]
    sys.path_importer_cache.clear()
    for fd in set(plan.python_roots.values()) - used:
        os.close(fd)  # not needed where the installation is reachable anyway


def _restrict_self(cfg: dict[str, Any], plan: confine.Plan) -> list[str]:
    """Apply every restriction to this process (the child); returns the names of the layers applied."""
    layers: list[str] = []
    os.setsid()  # its own session and process group: kill(0, ...) from the code cannot reach the launcher's group
    linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
    keep = {0, 1, 2, plan.setup_w, plan.life_r, plan.obs_w, *plan.python_roots.values()}
    if plan.ruleset_fd is not None:
        keep.add(plan.ruleset_fd)
    _close_fds_except(keep)
    _set_rlimits(cfg["limits"])
    layers.append("rlimits")
    if plan.is_root or plan.userns:
        layers.append(_drop_privileges(plan))
    # Changing credentials clears the parent-death signal; set it again, then make sure the launcher did not die
    # in between (the lifeline pipe hangs up once the launcher's write end is closed by its exit).
    linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
    lifeline = select.poll()
    lifeline.register(plan.life_r, select.POLLIN)
    if lifeline.poll(0):
        os._exit(_EXIT_SETUP)
    os.close(plan.life_r)
    _reroute_sys_path(plan)
    # A write over RLIMIT_FSIZE then fails with EFBIG (an OSError the code can see) instead of killing it.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    linux.prctl(linux.PR_SET_NO_NEW_PRIVS, 1)
    if plan.ruleset_fd is not None:
        numbers = linux.LANDLOCK_SYSCALLS[platform.machine()]
        linux.syscall(numbers[2], plan.ruleset_fd, 0, what="landlock_restrict_self")
        os.close(plan.ruleset_fd)
        layers.append("landlock")
    os.environ["HOME"] = plan.workdir
    os.environ["TMPDIR"] = plan.workdir
    os.chdir(plan.workdir)
    if plan.monitor is not None:
        plan.monitor.install(plan.obs_w)
    return layers


def _fail_setup(fd: int, message: str) -> NoReturn:
    try:
        os.write(fd, (json.dumps({"ok": False, "message": message}) + "\n").encode())
    finally:
        os._exit(_EXIT_SETUP)


def _print_code_traceback(exc: BaseException) -> None:
    # Only the code's own frames: the launcher's frame above them and the monitor's wrappers are noise to the reader.
    ours = {__file__, _MONITOR}
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        kept = [tb for tb in _tb_entries(current.__traceback__) if tb.tb_frame.f_code.co_filename not in ours]
        for entry, following in zip(kept, [*kept[1:], None], strict=True):
            entry.tb_next = following
        current.__traceback__ = kept[0] if kept else None
        pending += [current.__cause__, current.__context__]
    traceback.print_exception(type(exc), exc, exc.__traceback__)


def _tb_entries(tb: types.TracebackType | None) -> list[types.TracebackType]:
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    return entries


def _run_code(main_path: str, workdir: str, memory_exit_code: int) -> int:
    sys.argv = [main_path]
    sys.path.insert(0, workdir)  # the caller's extra files are importable, as the script's directory would be
    module = types.ModuleType("__main__")
    module.__file__ = main_path
    module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = module
    try:
        with open(main_path, "rb") as fh:
            code = compile(fh.read(), main_path, "exec")
        exec(code, module.__dict__)
    except SystemExit:
        raise  # handled by the interpreter exactly as for a normal script
    except MemoryError as exc:
        _print_code_traceback(exc)
        return memory_exit_code  # the parent reports Outcome.MEMORY
    except BaseException as exc:
        _print_code_traceback(exc)
        return 1
    return 0


def run(cfg: dict[str, Any], plan: confine.Plan) -> int:
    try:
        os.close(plan.setup_r)
        os.close(plan.life_w)
        os.close(int(cfg["report_fd"]))
        layers = _restrict_self(cfg, plan)
        os.write(plan.setup_w, (json.dumps({"ok": True, "layers": layers}) + "\n").encode())
        os.close(plan.setup_w)
    except BaseException as exc:  # noqa: BLE001 - whatever happened, the launcher must hear of it, not the code
        _fail_setup(plan.setup_w, f"sandbox setup failed: {type(exc).__name__}: {exc}")
    return _run_code(str(cfg["main"]), plan.workdir, int(cfg["memory_exit_code"]))
