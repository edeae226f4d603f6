"""The sandbox launcher's confinement, prepared before it forks: the plan, the namespaces, the workspace tmpfs, the
Landlock ruleset, and the interpreter's directories opened up to the check's uid.

Part of the launcher (launcher.py describes the whole design and runs these steps in order, in `_prepare`);
standard library only, loaded by file path. The child inherits what is prepared here and applies the rest to
itself (launcher_child.py).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import sys
import types
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.sandbox import launcher_linux as linux
else:  # loaded by launcher.py, by file path and before this module, under this private name
    linux = sys.modules["crucible_sandbox_launcher_linux"]


class Unavailable(Exception):
    """An isolation layer the machine cannot provide (reported as "unavailable"; strict mode refuses to run)."""


@dataclass
class Plan:
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


def degrade(plan: Plan, layer: str, reason: str) -> None:
    if plan.strict:
        raise Unavailable(f"{layer}: {reason}")
    plan.missing.append(layer)


def observe(plan: Plan, kind: str, what: str, detail: str, target: str = "") -> None:
    plan.observations.append({"kind": kind, "what": what, "target": target, "detail": detail, "source": "sandbox"})


def enter_namespaces(plan: Plan, simulate: set[str]) -> None:
    flags = linux.CLONE_NEWNET | linux.CLONE_NEWPID | linux.CLONE_NEWIPC | linux.CLONE_NEWNS
    if not plan.is_root:
        # Unprivileged namespaces need a user namespace of their own; in it we map only our own uid and gid.
        flags |= linux.CLONE_NEWUSER
    try:
        if "namespaces" in simulate:
            raise OSError(errno.EPERM, "unshare: refused (simulated for a test)")
        linux.check(int(linux.libc.unshare(ctypes.c_int(flags))), "unshare")
    except OSError as exc:
        degrade(plan, "namespaces", f"{exc.strerror or exc}")
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
            degrade(plan, "namespaces", f"writing the user namespace id maps failed: {exc}")
            return
        plan.userns = True
        plan.layers.append("userns")
    plan.pidns = True
    plan.layers += ["netns", "pidns", "ipcns"]
    try:
        # Our mounts must not propagate back to the caller's namespace (systemd makes "/" shared).
        linux.check(
            int(linux.libc.mount(None, b"/", None, linux.MS_REC | linux.MS_PRIVATE, None)), "mount --make-rprivate /"
        )
    except OSError as exc:
        degrade(plan, "workspace tmpfs", f"{exc.strerror or exc}")
        return
    plan.mntns = True
    plan.layers.append("mntns")


def _copy_into(source_fd: int, target: str, plan: Plan) -> None:
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


def mount_workspace(plan: Plan, limits: dict[str, Any], simulate: set[str]) -> None:
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
            linux.check(
                int(
                    linux.libc.mount(
                        b"tmpfs", plan.workdir.encode(), b"tmpfs", linux.MS_NOSUID | linux.MS_NODEV, options.encode()
                    )
                ),
                "mount tmpfs",
            )
        except OSError as exc:
            degrade(plan, "workspace tmpfs", f"{exc.strerror or exc}")
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
        raise Unavailable("landlock: not supported (simulated for a test)")
    numbers = linux.LANDLOCK_SYSCALLS.get(platform.machine())
    if numbers is None:
        raise Unavailable(f"landlock: no system call numbers known for {platform.machine()}")
    try:
        return linux.syscall(numbers[0], None, 0, linux.LANDLOCK_CREATE_RULESET_VERSION, what="landlock_create_ruleset")
    except OSError as exc:
        # ENOSYS: kernel built without Landlock; EOPNOTSUPP: Landlock not enabled at boot (lsm=...).
        raise Unavailable(f"landlock: {exc.strerror or exc}") from None


def _handled_rights(abi: int) -> tuple[int, int, int, int]:
    """(handled fs rights, handled net rights, scopes, sizeof the attr to pass) for the running ABI."""
    fs = linux.FS_ABI1
    net = 0
    scoped = 0
    size = 8
    if abi >= 2:
        fs |= linux.FS_REFER
    if abi >= 3:
        fs |= linux.FS_TRUNCATE
    if abi >= 4:
        net = linux.NET_BIND_TCP | linux.NET_CONNECT_TCP
        size = 16
    if abi >= 5:
        fs |= linux.FS_IOCTL_DEV
    if abi >= 6:
        scoped = linux.SCOPE_ABSTRACT_UNIX_SOCKET | linux.SCOPE_SIGNAL
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


def build_ruleset(plan: Plan, simulate: set[str], python_dirs: list[str]) -> None:
    try:
        abi = _landlock_abi(simulate)
    except Unavailable as exc:
        degrade(plan, "landlock", str(exc).removeprefix("landlock: "))
        return
    numbers = linux.LANDLOCK_SYSCALLS[platform.machine()]
    fs, net, scoped, size = _handled_rights(abi)
    attr = linux.RulesetAttr(handled_access_fs=fs, handled_access_net=net, scoped=scoped)
    ruleset_fd = linux.syscall(
        numbers[0], ctypes.c_void_p(ctypes.addressof(attr)), size, 0, what="landlock_create_ruleset"
    )

    def allow(path: str, rights: int) -> None:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except FileNotFoundError:
            return  # e.g. no /lib64 on aarch64: nothing to allow
        try:
            if not os.path.isdir(path):
                rights &= linux.FILE_RIGHTS
            rule = linux.PathBeneathAttr(allowed_access=rights & fs, parent_fd=fd)
            linux.syscall(
                numbers[1],
                ruleset_fd,
                linux.LANDLOCK_RULE_PATH_BENEATH,
                ctypes.c_void_p(ctypes.addressof(rule)),
                0,
                what=f"landlock_add_rule({path})",
            )
        finally:
            os.close(fd)

    for path in _read_exec_dirs(python_dirs):
        allow(path, linux.READ_EXEC)
    # Only the dynamic loader's cache from /etc: /etc/passwd, resolv.conf and the rest stay unreadable.
    allow("/etc/ld.so.cache", linux.FS_READ_FILE)
    allow("/dev/urandom", linux.FS_READ_FILE)
    # open("/dev/null", "w") truncates, hence TRUNCATE.
    allow("/dev/null", linux.FS_READ_FILE | linux.FS_WRITE_FILE | linux.FS_TRUNCATE)
    allow(plan.workdir, fs)
    plan.ruleset_fd = ruleset_fd
    plan.landlock_abi = abi


def open_python_roots(plan: Plan) -> None:
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


def expose_dirs(plan: Plan, dirs: list[str]) -> None:
    """As root: make `dirs` (the caller's interpreter and its environment) reachable by the check's uid.

    Where an ancestor of one is closed to that uid (a pyenv under /root, mode 0700), a small read-only-by-mode tmpfs
    is mounted over the topmost such ancestor in this mount namespace, holding just the path down to each
    directory, where the real directory is bind-mounted. Everything else under that ancestor disappears from the
    sandbox's view (Landlock would refuse it anyway). Best effort: when it cannot be done (no mount namespace, the
    workspace itself lies under the ancestor, a mount fails) an "isolation" observation says the interpreter may
    not start as a subprocess, and the run goes on.
    """
    # One function on purpose: one pass over the directories' ancestors, mounting as it goes; the launcher's steps
    # stay in one place to audit.
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
            observe(
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
            linux.check(
                int(
                    linux.libc.mount(
                        b"tmpfs",
                        ancestor.encode(),
                        b"tmpfs",
                        linux.MS_NOSUID | linux.MS_NODEV,
                        b"size=1m,nr_inodes=4096,mode=0755",
                    )
                ),
                f"mount tmpfs over {ancestor}",
            )
            for directory, fd in fds.items():
                os.makedirs(directory, 0o755, exist_ok=True)
                linux.check(
                    int(
                        linux.libc.mount(
                            f"/proc/self/fd/{fd}".encode(), directory.encode(), None, linux.MS_BIND | linux.MS_REC, None
                        )
                    ),
                    f"bind mount {directory}",
                )
        except OSError as exc:
            observe(plan, "isolation", "python", f"could not open up {ancestor} to the sandbox uid: {exc}", ancestor)
        finally:
            for fd in fds.values():
                os.close(fd)
