"""The program that runs inside the sandbox's process: it confines itself, then runs the untrusted `main.py`.

Started by `workers.sandbox.runner` as `python -I -S launcher.py <config JSON>`, in a fresh session, with a minimal
environment and the sandbox's private directory as its working directory. It imports only the standard library
(isolated mode, no site) so that nothing from the project or the virtual environment runs before the
restrictions are in place.

Two processes result:

    launcher  (keeps the caller's uid; outside the Landlock domain, inside the new network and mount namespaces)
      |  as root, unless the uid's last check ended cleanly: kill whatever still runs under the check's uid
      |  (a helper that takes that uid and calls kill(-1))
      |  unshare(NEWNET | NEWPID | NEWIPC | NEWNS [| NEWUSER when not root]); mount a size-capped tmpfs over
      |  the check's directory and copy the caller's files into it; build the Landlock ruleset; as root, when the
      |  caller asked for its interpreter (python_dirs) and a directory above it is closed to the check's uid,
      |  mount a small tmpfs over that directory holding bind mounts of the interpreter's directories alone; fork
      `- child = PID 1 of the new PID namespace
            setsid; close stray fds; rlimits; drop to the check's own uid/gid (or drop capabilities when not
            root); no_new_privs; landlock_restrict_self; install the monitor (monitor.py); run main.py in a
            fresh __main__ module

The launcher enforces the wall-time limit on the child and SIGKILLs it when it runs over. Because the child is
PID 1 of its namespace, the kernel then kills every process it left behind (fork bombs, setsid escapes), and
the launcher only returns once all of them are gone. As root it then takes the check's uid itself and kills
every process left under it (kill(-1) as that uid, which no fork can race), so nothing of the check outlives it
even where the PID namespace was unavailable. The launcher writes one JSON line describing how the child ended,
with what it observed, to the file descriptor named in the config (`report_fd`); the child closes that
descriptor before the untrusted code runs, so the code cannot forge the report.

Observations: the launcher itself sees the limits (processes alive at a wall-time kill, files at the size limit,
the workspace's tmpfs full, peak memory near the limit) and processes that outlived the program (source
"sandbox"); the monitor in the child reports refused calls through a non-blocking pipe (source "program",
forgeable by the program: see monitor.py).

Protocol between child and launcher: the child writes one JSON line to a private setup pipe, `{"ok": true,
"layers": [...]}` once every restriction is in place or `{"ok": false, "message": ...}` when one could not be
applied, and closes it before running the code. A child that exits without saying "ok" failed during setup,
which is reported as a sandbox error, never blamed on the code.
"""

from __future__ import annotations

import builtins
import contextlib
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

_CLONE_NEWNS = 0x00020000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000

_MS_NOSUID = 1 << 1
_MS_NODEV = 1 << 2
_MS_BIND = 1 << 12
_MS_REC = 1 << 14
_MS_PRIVATE = 1 << 18

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
_MAX_OBSERVATION_BYTES = 256 * 1024  # what the launcher reads of the monitor's pipe; the rest is drained unread
_MAX_PROGRAM_OBSERVATIONS = 50  # distinct (kind, what, target) kept from the monitor
# How often the workspace's size is measured when no tmpfs caps it (rlimits-only mode).
_DISK_POLL_SECONDS = 0.2
# Peak resident memory above this share of the address-space limit is reported as a memory observation.
_MEMORY_NEAR = 0.75
_MONITOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "monitor.py")


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
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


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
    mntns: bool = False
    tmpfs: bool = False  # the workspace is a size-capped tmpfs (else its size is polled)
    layers: list[str] = field(default_factory=list)  # applied by the launcher (namespaces)
    missing: list[str] = field(default_factory=list)  # layers skipped in rlimits-only mode
    ruleset_fd: int | None = None
    landlock_abi: int = 0
    python_roots: dict[str, int] = field(default_factory=dict)  # Python installation dir -> O_PATH fd
    setup_r: int = -1
    setup_w: int = -1
    life_r: int = -1
    life_w: int = -1
    obs_r: int = -1
    obs_w: int = -1
    monitor: types.ModuleType | None = None
    observations: list[dict[str, Any]] = field(default_factory=list)  # seen by the launcher ("sandbox")


def _degrade(plan: _Plan, layer: str, reason: str) -> None:
    if plan.strict:
        raise _Unavailable(f"{layer}: {reason}")
    plan.missing.append(layer)


# --- launcher side ------------------------------------------------------------------------------------------------


def _sweep_uid_before(plan: _Plan) -> None:
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


def _sweep_uid_after(plan: _Plan) -> None:
    """As root, last thing: become the check's uid and kill every process left under it (never this one)."""
    os.setgroups([])
    os.setresgid(plan.gid, plan.gid, plan.gid)
    os.setresuid(plan.uid, plan.uid, plan.uid)
    # kill(-1) fails with ESRCH only when there is no other process at all, and succeeds even when none of the
    # processes it tried was ours to signal: its result says nothing about what was left.
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)


def _enter_namespaces(plan: _Plan, simulate: set[str]) -> None:
    flags = _CLONE_NEWNET | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWNS
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
    try:
        # Our mounts must not propagate back to the caller's namespace (systemd makes "/" shared).
        _check(int(_libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None)), "mount --make-rprivate /")
    except OSError as exc:
        _degrade(plan, "workspace tmpfs", f"{exc.strerror or exc}")
        return
    plan.mntns = True
    plan.layers.append("mntns")


def _copy_into(source_fd: int, target: str, plan: _Plan) -> None:
    """Copy the caller's files (regular files and directories) from the hidden directory into the tmpfs."""
    for dirpath, dirnames, filenames, dir_fd in os.fwalk(".", dir_fd=source_fd):
        base = os.path.normpath(os.path.join(target, dirpath))
        for name in dirnames:
            os.mkdir(os.path.join(base, name), 0o700)
            if plan.is_root:
                os.chown(os.path.join(base, name), plan.uid, plan.gid)
        for name in filenames:
            src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            try:
                mode = os.fstat(src).st_mode & 0o777
                dst = os.open(os.path.join(base, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
                try:
                    while chunk := os.read(src, 1 << 20):
                        while chunk:
                            chunk = chunk[os.write(dst, chunk) :]
                    if plan.is_root:
                        os.fchown(dst, plan.uid, plan.gid)
                finally:
                    os.close(dst)
            finally:
                os.close(src)


def _mount_workspace(plan: _Plan, limits: dict[str, Any], simulate: set[str]) -> None:
    """Cap the workspace: a tmpfs of max_disk_bytes (and a bounded inode count) over the check's directory.

    The tmpfs lives only in this mount namespace: the caller still sees its own directory (with the files it
    wrote), the program sees the tmpfs, and the tmpfs vanishes with the namespace's last process.
    """
    if not plan.mntns:
        if "workspace tmpfs" not in plan.missing:
            plan.missing.append("workspace tmpfs")
        return
    source_fd = os.open(plan.workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        options = (
            f"size={int(limits['max_disk_bytes'])},nr_inodes={int(limits['max_workspace_files'])},"
            f"mode=0700,uid={plan.uid},gid={plan.gid}"
        )
        try:
            if "tmpfs" in simulate:
                raise OSError(errno.EPERM, "mount: refused (simulated for a test)")
            _check(
                int(_libc.mount(b"tmpfs", plan.workdir.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, options.encode())),
                "mount tmpfs",
            )
        except OSError as exc:
            _degrade(plan, "workspace tmpfs", f"{exc.strerror or exc}")
            return
        try:
            _copy_into(source_fd, plan.workdir, plan)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise RuntimeError(f"the caller's files do not fit the workspace's disk limit: {exc}") from None
            raise
    finally:
        os.close(source_fd)
    plan.tmpfs = True
    plan.layers.append("tmpfs")


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


def _read_exec_dirs(extra: list[str] | None = None) -> list[str]:
    """Directories the code may read and execute from: the Python installation and the system libraries, plus the
    caller's `python_dirs` (its virtual environment) when it asked for them."""
    candidates = [
        *(extra or []),
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


def _build_ruleset(plan: _Plan, simulate: set[str], python_dirs: list[str]) -> None:
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

    for path in _read_exec_dirs(python_dirs):
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


def _traversable(path: str, uid: int, gid: int) -> bool:
    """Whether `uid` (with `gid` and no other group) may search the directory `path`."""
    st = os.stat(path)
    if st.st_uid == uid:
        return bool(st.st_mode & 0o100)
    if st.st_gid == gid:
        return bool(st.st_mode & 0o010)
    return bool(st.st_mode & 0o001)


def _expose_dirs(plan: _Plan, dirs: list[str]) -> None:
    """As root: make `dirs` (the caller's interpreter and its environment) reachable by the check's uid.

    Where an ancestor of one is closed to that uid (a pyenv under /root, mode 0700), a small read-only-by-mode tmpfs
    is mounted over the topmost such ancestor in this mount namespace, holding just the path down to each
    directory, where the real directory is bind-mounted. Everything else under that ancestor disappears from the
    sandbox's view (Landlock would refuse it anyway). Best effort: when it cannot be done (no mount namespace, the
    workspace itself lies under the ancestor, a mount fails) an "isolation" observation says the interpreter may
    not start as a subprocess, and the run goes on.
    """
    if not plan.is_root:
        return  # the program runs under the caller's own uid, which reaches whatever the caller reaches
    blocked: dict[str, list[str]] = {}  # topmost closed ancestor -> directories under it
    for directory in sorted(set(dirs), key=len):
        if any(directory == d or directory.startswith(d.rstrip("/") + "/") for ds in blocked.values() for d in ds):
            continue  # inside one already exposed
        parts = directory.strip("/").split("/")
        for depth in range(1, len(parts)):
            ancestor = "/" + "/".join(parts[:depth])
            try:
                if not _traversable(ancestor, plan.uid, plan.gid):
                    blocked.setdefault(ancestor, []).append(directory)
                    break
            except OSError:
                break
    for ancestor, under in blocked.items():
        workdir = plan.workdir.rstrip("/") + "/"
        if not plan.mntns or workdir.startswith(ancestor + "/"):
            _observe(
                plan,
                "isolation",
                "python",
                f"{ancestor} is closed to the sandbox uid and could not be opened up (no mount namespace, or the "
                "workspace lies under it): the interpreter may not start as a subprocess",
                ancestor,
            )
            continue
        fds = {directory: os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for directory in under}
        try:
            _check(
                int(
                    _libc.mount(
                        b"tmpfs",
                        ancestor.encode(),
                        b"tmpfs",
                        _MS_NOSUID | _MS_NODEV,
                        b"size=1m,nr_inodes=4096,mode=0755",
                    )
                ),
                f"mount tmpfs over {ancestor}",
            )
            for directory, fd in fds.items():
                os.makedirs(directory, 0o755, exist_ok=True)
                _check(
                    int(
                        _libc.mount(f"/proc/self/fd/{fd}".encode(), directory.encode(), None, _MS_BIND | _MS_REC, None)
                    ),
                    f"bind mount {directory}",
                )
        except OSError as exc:
            _observe(plan, "isolation", "python", f"could not open up {ancestor} to the sandbox uid: {exc}", ancestor)
        finally:
            for fd in fds.values():
                os.close(fd)


def _load_monitor() -> types.ModuleType:
    # Loaded now, as the caller's uid: the child could not reach this file once confined. The source loader
    # keeps (and reuses) its compiled form in __pycache__, as any import would.
    import importlib.machinery

    name = "crucible_sandbox_monitor"
    code = importlib.machinery.SourceFileLoader(name, _MONITOR).get_code(name)
    if code is None:
        raise RuntimeError(f"could not load {_MONITOR}")
    module = types.ModuleType(name)
    module.__file__ = _MONITOR
    exec(code, module.__dict__)
    return module


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
    if plan.is_root:
        if plan.uid == 0 or plan.gid == 0:
            raise RuntimeError("refusing to run the program as root")
        if cfg.get("sweep_before", True):
            _sweep_uid_before(plan)
    simulate = set(cfg.get("simulate_unavailable", ()))
    _enter_namespaces(plan, simulate)
    _mount_workspace(plan, cfg["limits"], simulate)
    python_dirs = [str(path) for path in cfg.get("python_dirs") or []]
    _build_ruleset(plan, simulate, python_dirs)
    _open_python_roots(plan)
    plan.monitor = _load_monitor()
    if python_dirs:
        _expose_dirs(plan, python_dirs)
    plan.setup_r, plan.setup_w = os.pipe()
    plan.life_r, plan.life_w = os.pipe()
    plan.obs_r, plan.obs_w = os.pipe()
    # Neither side may ever block on the monitor's pipe: the program drops a line, the launcher reads what is there.
    os.set_blocking(plan.obs_w, False)
    os.set_blocking(plan.obs_r, False)
    return plan


def _observe(plan: _Plan, kind: str, what: str, detail: str, target: str = "") -> None:
    plan.observations.append({"kind": kind, "what": what, "target": target, "detail": detail, "source": "sandbox"})


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


def _inspect_workspace(plan: _Plan, limits: dict[str, Any]) -> None:
    """After the run: files at the per-file size limit, a full workspace."""
    max_file = int(limits["max_file_bytes"])
    max_disk = int(limits["max_disk_bytes"])
    used, files = _workspace_usage(plan.workdir)
    for name, size in sorted(files, key=lambda item: -item[1])[:5]:
        if size >= max_file:
            _observe(plan, "limit", "file size", f"{name} reached the per-file limit of {_mib(max_file)}", name)
    if plan.tmpfs:
        try:
            st = os.statvfs(plan.workdir)
        except OSError:
            return
        free = st.f_bavail * st.f_frsize
        if free < max(64 * 1024, max_disk // 100):
            _observe(plan, "limit", "disk", f"the workspace filled its {_mib(max_disk)} tmpfs ({_mib(free)} left)")
        elif st.f_favail == 0:
            _observe(plan, "limit", "disk", f"the workspace used all {int(limits['max_workspace_files'])} inodes")
    elif used > max_disk:
        _observe(plan, "limit", "disk", f"the workspace took {_mib(used)}, over its {_mib(max_disk)} limit")


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


def _supervise(cfg: dict[str, Any], plan: _Plan, pid: int, started: float) -> dict[str, Any]:
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
                    _observe(
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
        _observe(
            plan, "limit", "memory", f"peak resident memory {_mib(peak)}, near the {_mib(limits['memory_bytes'])} limit"
        )
    if disk_killed:
        _observe(plan, "limit", "disk", f"the workspace grew past its {_mib(limits['max_disk_bytes'])} disk limit")
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


def _finish(plan: _Plan) -> bool:
    """As root, the last step: kill every process left under the check's uid. True once that was done."""
    if not plan.is_root:
        return False
    if not plan.pidns:
        # With a PID namespace nothing can be left (wait4 on its init returned); without one, count first.
        left = _uid_processes(plan.uid)
        if left:
            _observe(plan, "cleanup", "processes", f"{left} process(es) outlived the program and were killed")
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
