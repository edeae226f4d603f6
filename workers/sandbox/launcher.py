"""The program that runs inside the sandbox's process: it confines itself, then runs the untrusted `main.py`.

Started by `workers.sandbox.runner` as `python -I -S launcher.py <config JSON>`, in a fresh session, with a minimal
environment and the sandbox's private directory as its working directory. It imports only the standard library
(isolated mode, no site) so that nothing from the project or the virtual environment runs before the
restrictions are in place.

Two processes result:

    launcher  (keeps the caller's uid; outside the Landlock domain, inside the new network namespace)
      |  unshare(NEWNET | NEWPID | NEWIPC [| NEWUSER when not root]); build the Landlock ruleset; fork
      `- child = PID 1 of the new PID namespace
            setsid; close stray fds; rlimits; drop to uid/gid 65534 (or drop capabilities when not root);
            no_new_privs; landlock_restrict_self; run main.py in a fresh __main__ module

The launcher enforces the wall-time limit on the child and SIGKILLs it when it runs over. Because the child is
PID 1 of its namespace, the kernel then kills every process it left behind (fork bombs, setsid escapes), and
the launcher only returns once all of them are gone. The launcher writes one JSON line describing how the child
ended to the file descriptor named in the config (`report_fd`); the child closes that descriptor before the
untrusted code runs, so the code cannot forge the report.

Protocol between child and launcher: the child writes one JSON line to a private setup pipe, `{"ok": true,
"layers": [...]}` once every restriction is in place or `{"ok": false, "message": ...}` when one could not be
applied, and closes it before running the code. A child that exits without saying "ok" failed during setup,
which is reported as a sandbox error, never blamed on the code.
"""

from __future__ import annotations

import builtins
import ctypes
import errno
import json
import os
import platform
import resource
import select
import signal
import sys
import time
import traceback
import types
from dataclasses import dataclass, field
from typing import Any, NoReturn

# --- Linux constants (include/uapi/linux/sched.h, prctl.h, landlock.h) ------------------------------------------

_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000

_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38

# The Landlock system calls come from the unified syscall table, so they share numbers on these architectures.
_LANDLOCK_SYSCALLS: dict[str, tuple[int, int, int]] = {
    "x86_64": (444, 445, 446),
    "aarch64": (444, 445, 446),
}
_LANDLOCK_CREATE_RULESET_VERSION = 1 << 0
_LANDLOCK_RULE_PATH_BENEATH = 1

_FS_EXECUTE = 1 << 0
_FS_WRITE_FILE = 1 << 1
_FS_READ_FILE = 1 << 2
_FS_READ_DIR = 1 << 3
_FS_REMOVE_DIR = 1 << 4
_FS_REMOVE_FILE = 1 << 5
_FS_MAKE_CHAR = 1 << 6
_FS_MAKE_DIR = 1 << 7
_FS_MAKE_REG = 1 << 8
_FS_MAKE_SOCK = 1 << 9
_FS_MAKE_FIFO = 1 << 10
_FS_MAKE_BLOCK = 1 << 11
_FS_MAKE_SYM = 1 << 12
_FS_REFER = 1 << 13  # ABI 2
_FS_TRUNCATE = 1 << 14  # ABI 3
_FS_IOCTL_DEV = 1 << 15  # ABI 5
_NET_BIND_TCP = 1 << 0  # ABI 4
_NET_CONNECT_TCP = 1 << 1  # ABI 4
_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
_SCOPE_SIGNAL = 1 << 1  # ABI 6

_FS_ABI1 = (1 << 13) - 1  # EXECUTE .. MAKE_SYM: every file-system right of the first ABI
# Rights that Landlock accepts on a rule whose parent_fd is a regular or device file rather than a directory.
_FILE_RIGHTS = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV
_READ_EXEC = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR

_LINUX_CAPABILITY_VERSION_3 = 0x20080522

# Exit status of a child that failed before the code ran (only meaningful together with a missing "ok").
_EXIT_SETUP = 70

_MAX_SETUP_MESSAGE = 64 * 1024


class _Unavailable(Exception):
    """An isolation layer the machine cannot provide (reported as "unavailable"; strict mode refuses to run)."""


class _RulesetAttr(ctypes.Structure):
    # struct landlock_ruleset_attr: the kernel reads only the first `size` bytes, so older ABIs get a prefix.
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    # struct landlock_path_beneath_attr is __attribute__((packed)): 12 bytes, no padding after parent_fd.
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _check(result: int, what: str) -> int:
    if result == -1:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


def _prctl(option: int, arg: int) -> None:
    args = [ctypes.c_ulong(value) for value in (arg, 0, 0, 0)]
    _check(int(_libc.prctl(ctypes.c_int(option), *args)), f"prctl({option})")


def _syscall(number: int, *args: int | ctypes.c_void_p | None, what: str) -> int:
    c_args = [a if isinstance(a, ctypes.c_void_p) else ctypes.c_long(0 if a is None else a) for a in args]
    return _check(int(_libc.syscall(ctypes.c_long(number), *c_args)), what)


@dataclass
class _Plan:
    """What the launcher prepared before forking; the child inherits all of it."""

    strict: bool
    is_root: bool
    uid: int
    gid: int
    workdir: str
    pidns: bool = False
    userns: bool = False
    layers: list[str] = field(default_factory=list)  # applied by the launcher (namespaces)
    missing: list[str] = field(default_factory=list)  # layers skipped in rlimits-only mode
    ruleset_fd: int | None = None
    landlock_abi: int = 0
    python_roots: dict[str, int] = field(default_factory=dict)  # Python installation dir -> O_PATH fd
    setup_r: int = -1
    setup_w: int = -1
    life_r: int = -1
    life_w: int = -1


def _degrade(plan: _Plan, layer: str, reason: str) -> None:
    if plan.strict:
        raise _Unavailable(f"{layer}: {reason}")
    plan.missing.append(layer)


# --- launcher side ------------------------------------------------------------------------------------------------


def _enter_namespaces(plan: _Plan, simulate: set[str]) -> None:
    flags = _CLONE_NEWNET | _CLONE_NEWPID | _CLONE_NEWIPC
    if not plan.is_root:
        # Unprivileged namespaces need a user namespace of their own; in it we map only our own uid and gid.
        flags |= _CLONE_NEWUSER
    try:
        if "namespaces" in simulate:
            raise OSError(errno.EPERM, "unshare: refused (simulated for a test)")
        _check(int(_libc.unshare(ctypes.c_int(flags))), "unshare")
    except OSError as exc:
        _degrade(plan, "namespaces", f"{exc.strerror or exc}")
        return
    if not plan.is_root:
        outer_uid, outer_gid = plan.uid, plan.gid
        try:
            # setgroups must be denied before an unprivileged process may write gid_map.
            for name, text in (
                ("setgroups", "deny"),
                ("uid_map", f"{outer_uid} {outer_uid} 1"),
                ("gid_map", f"{outer_gid} {outer_gid} 1"),
            ):
                with open(f"/proc/self/{name}", "w") as fh:
                    fh.write(text)
        except OSError as exc:
            _degrade(plan, "namespaces", f"writing the user namespace id maps failed: {exc}")
            return
        plan.userns = True
        plan.layers.append("userns")
    plan.pidns = True
    plan.layers += ["netns", "pidns", "ipcns"]


def _landlock_abi(simulate: set[str]) -> int:
    if "landlock" in simulate:
        raise _Unavailable("landlock: not supported (simulated for a test)")
    numbers = _LANDLOCK_SYSCALLS.get(platform.machine())
    if numbers is None:
        raise _Unavailable(f"landlock: no system call numbers known for {platform.machine()}")
    try:
        return _syscall(numbers[0], None, 0, _LANDLOCK_CREATE_RULESET_VERSION, what="landlock_create_ruleset")
    except OSError as exc:
        # ENOSYS: kernel built without Landlock; EOPNOTSUPP: Landlock not enabled at boot (lsm=...).
        raise _Unavailable(f"landlock: {exc.strerror or exc}") from None


def _handled_rights(abi: int) -> tuple[int, int, int, int]:
    """(handled fs rights, handled net rights, scopes, sizeof the attr to pass) for the running ABI."""
    fs = _FS_ABI1
    net = 0
    scoped = 0
    size = 8
    if abi >= 2:
        fs |= _FS_REFER
    if abi >= 3:
        fs |= _FS_TRUNCATE
    if abi >= 4:
        net = _NET_BIND_TCP | _NET_CONNECT_TCP
        size = 16
    if abi >= 5:
        fs |= _FS_IOCTL_DEV
    if abi >= 6:
        scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL
        size = 24
    return fs, net, scoped, size


def _read_exec_dirs() -> list[str]:
    """Directories the code may read and execute from: the Python installation and the system libraries."""
    candidates = [
        os.path.join(sys.base_prefix, "lib"),
        os.path.join(sys.base_exec_prefix, "lib"),
        sys.prefix,
        sys.exec_prefix,
        "/usr",
        "/lib",
        "/lib64",
        "/bin",
    ]
    result: list[str] = []
    for path in candidates:
        real = os.path.realpath(path)
        # Never widen a rule to "/" (an interpreter installed at the root would otherwise open everything).
        if real == "/" or real in result or not os.path.isdir(real):
            continue
        result.append(real)
    return result


def _build_ruleset(plan: _Plan, simulate: set[str]) -> None:
    try:
        abi = _landlock_abi(simulate)
    except _Unavailable as exc:
        _degrade(plan, "landlock", str(exc).removeprefix("landlock: "))
        return
    numbers = _LANDLOCK_SYSCALLS[platform.machine()]
    fs, net, scoped, size = _handled_rights(abi)
    attr = _RulesetAttr(handled_access_fs=fs, handled_access_net=net, scoped=scoped)
    ruleset_fd = _syscall(numbers[0], ctypes.c_void_p(ctypes.addressof(attr)), size, 0, what="landlock_create_ruleset")

    def allow(path: str, rights: int) -> None:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except FileNotFoundError:
            return  # e.g. no /lib64 on aarch64: nothing to allow
        try:
            if not os.path.isdir(path):
                rights &= _FILE_RIGHTS
            rule = _PathBeneathAttr(allowed_access=rights & fs, parent_fd=fd)
            _syscall(
                numbers[1],
                ruleset_fd,
                _LANDLOCK_RULE_PATH_BENEATH,
                ctypes.c_void_p(ctypes.addressof(rule)),
                0,
                what=f"landlock_add_rule({path})",
            )
        finally:
            os.close(fd)

    for path in _read_exec_dirs():
        allow(path, _READ_EXEC)
    # Only the dynamic loader's cache from /etc: /etc/passwd, resolv.conf and the rest stay unreadable.
    allow("/etc/ld.so.cache", _FS_READ_FILE)
    allow("/dev/urandom", _FS_READ_FILE)
    # open("/dev/null", "w") truncates, hence TRUNCATE.
    allow("/dev/null", _FS_READ_FILE | _FS_WRITE_FILE | _FS_TRUNCATE)
    allow(plan.workdir, fs)
    plan.ruleset_fd = ruleset_fd
    plan.landlock_abi = abi


def _open_python_roots(plan: _Plan) -> None:
    # The interpreter may live where the sandbox uid cannot traverse (e.g. under /root, mode 0700). Holding an
    # O_PATH descriptor to each installation root lets the child reach the stdlib through /proc/self/fd/N/...,
    # a magic link that skips the permission checks on the ancestors; Landlock still checks the real path.
    for root in dict.fromkeys((sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix)):
        try:
            plan.python_roots[root] = os.open(root, os.O_PATH | os.O_DIRECTORY)
        except OSError:
            continue


def _prepare(cfg: dict[str, Any]) -> _Plan:
    # Die with the caller: a SIGKILLed caller must not leave the launcher (and so the sandbox) running.
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != int(cfg["parent_pid"]):
        raise RuntimeError("the calling process exited before the sandbox started")
    plan = _Plan(
        strict=cfg["mode"] == "strict",
        is_root=os.geteuid() == 0,
        uid=int(cfg["uid"]) if os.geteuid() == 0 else os.getuid(),
        gid=int(cfg["gid"]) if os.geteuid() == 0 else os.getgid(),
        workdir=os.path.realpath(cfg["workdir"]),
    )
    simulate = set(cfg.get("simulate_unavailable", ()))
    _enter_namespaces(plan, simulate)
    _build_ruleset(plan, simulate)
    _open_python_roots(plan)
    plan.setup_r, plan.setup_w = os.pipe()
    plan.life_r, plan.life_w = os.pipe()
    return plan


def _supervise(cfg: dict[str, Any], plan: _Plan, pid: int, started: float) -> dict[str, Any]:
    for fd in (plan.setup_w, plan.life_r, plan.ruleset_fd, *plan.python_roots.values()):
        if fd is not None:
            os.close(fd)
    deadline = started + float(cfg["limits"]["wall_seconds"])
    poller = select.poll()
    poller.register(plan.setup_r, select.POLLIN)
    pidfd: int | None
    try:
        pidfd = os.pidfd_open(pid)
        poller.register(pidfd, select.POLLIN)
    except OSError:
        pidfd = None  # kernel before 5.3 (degraded mode only: Landlock needs 5.13): poll the child instead
    setup = b""
    setup_open = True
    wall_killed = False
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            # Killing PID 1 of the namespace makes the kernel kill every other process in it.
            os.kill(pid, signal.SIGKILL)
            wall_killed = True
            break
        events = poller.poll(max(1, int(min(remaining, 0.05 if pidfd is None else remaining) * 1000)))
        # WNOWAIT: look without reaping, so that wait4 below still collects the status and usage.
        exited = pidfd is None and os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        for fd, _ in events:
            if fd == pidfd:
                exited = True
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

    exit_code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    message = _parse_setup(setup)
    if not message.get("ok"):
        how = f"exit status {exit_code}" if exit_code is not None else f"signal {sig}"
        detail = message.get("message") or f"the sandbox child ended during setup ({how})"
        if wall_killed:
            detail = f"the sandbox setup did not finish within the wall time limit: {detail}"
        return {"kind": "error", "message": str(detail)}
    layers = [*plan.layers, *(str(layer) for layer in message.get("layers", []))]
    isolation = "+".join(layers)
    if plan.missing:
        isolation += f" (degraded: no {', no '.join(plan.missing)})"
    return {
        "kind": "done",
        "exit_code": exit_code,
        "signal": sig,
        "wall_killed": wall_killed,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "isolation": isolation,
        "landlock_abi": plan.landlock_abi,
    }


def _parse_setup(data: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(data.decode("utf-8", "replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _write_report(fd: int, report: dict[str, Any]) -> None:
    data = (json.dumps(report) + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]
    os.close(fd)


# --- child side (PID 1 of the new namespaces) ---------------------------------------------------------------------


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


def _drop_privileges(plan: _Plan) -> str:
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
    header = _CapHeader(version=_LINUX_CAPABILITY_VERSION_3, pid=0)
    data = (_CapData * 2)()
    _check(int(_libc.capset(ctypes.byref(header), data)), "capset")
    return "nocaps"


def _reroute_sys_path(plan: _Plan) -> None:
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


def _restrict_self(cfg: dict[str, Any], plan: _Plan) -> list[str]:
    """Apply every restriction to this process (the child); returns the names of the layers applied."""
    layers: list[str] = []
    os.setsid()  # its own session and process group: kill(0, ...) from the code cannot reach the launcher's group
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    keep = {0, 1, 2, plan.setup_w, plan.life_r, *plan.python_roots.values()}
    if plan.ruleset_fd is not None:
        keep.add(plan.ruleset_fd)
    _close_fds_except(keep)
    _set_rlimits(cfg["limits"])
    layers.append("rlimits")
    if plan.is_root or plan.userns:
        layers.append(_drop_privileges(plan))
    # Changing credentials clears the parent-death signal; set it again, then make sure the launcher did not die
    # in between (the lifeline pipe hangs up once the launcher's write end is closed by its exit).
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    lifeline = select.poll()
    lifeline.register(plan.life_r, select.POLLIN)
    if lifeline.poll(0):
        os._exit(_EXIT_SETUP)
    os.close(plan.life_r)
    _reroute_sys_path(plan)
    # A write over RLIMIT_FSIZE then fails with EFBIG (an OSError the code can see) instead of killing it.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    if plan.ruleset_fd is not None:
        numbers = _LANDLOCK_SYSCALLS[platform.machine()]
        _syscall(numbers[2], plan.ruleset_fd, 0, what="landlock_restrict_self")
        os.close(plan.ruleset_fd)
        layers.append("landlock")
    os.environ["HOME"] = plan.workdir
    os.environ["TMPDIR"] = plan.workdir
    os.chdir(plan.workdir)
    return layers


def _fail_setup(fd: int, message: str) -> NoReturn:
    try:
        os.write(fd, (json.dumps({"ok": False, "message": message}) + "\n").encode())
    finally:
        os._exit(_EXIT_SETUP)


def _print_code_traceback(exc: BaseException) -> None:
    # Start the traceback at the code's own frames: the launcher's frame above them is noise to the reader.
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)


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


def _child(cfg: dict[str, Any], plan: _Plan) -> int:
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


def main(argv: list[str]) -> int:
    try:
        cfg: dict[str, Any] = json.loads(argv[1])
        report_fd = int(cfg["report_fd"])
    except (IndexError, ValueError, KeyError, TypeError) as exc:
        print(f"crucible sandbox launcher: bad configuration: {exc}", file=sys.stderr)
        return 2
    try:
        plan = _prepare(cfg)
    except _Unavailable as exc:
        _write_report(report_fd, {"kind": "unavailable", "message": str(exc)})
        return 0
    except Exception as exc:
        _write_report(report_fd, {"kind": "error", "message": f"sandbox setup failed: {type(exc).__name__}: {exc}"})
        return 0
    started = time.monotonic()
    try:
        pid = os.fork()
    except OSError as exc:
        _write_report(report_fd, {"kind": "error", "message": f"fork failed: {exc}"})
        return 0
    if pid == 0:
        return _child(cfg, plan)
    try:
        report = _supervise(cfg, plan, pid, started)
    except Exception as exc:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        report = {"kind": "error", "message": f"sandbox supervision failed: {type(exc).__name__}: {exc}"}
    _write_report(report_fd, report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
