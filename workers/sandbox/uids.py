"""The uids the sandbox runs checks under (`CRUCIBLE_SANDBOX_UIDS`): one uid per check at a time, leased with a lock
file, and swept of every process left under it before the next check takes it (docs: `workers.sandbox.runner`)."""

from __future__ import annotations

import fcntl
import grp
import logging
import os
import pwd
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("crucible.sandbox")

UIDS_ENV = "CRUCIBLE_SANDBOX_UIDS"
# Inside the 16-bit range that even user-namespaced containers map, below systemd's reserved ranges (60001 on),
# at the top of the range where distributions allocate login accounts (which rarely reach it).
DEFAULT_UIDS = "59000-59999"
UID_LOCK_DIRS = ("/run/crucible-sandbox-uids", os.path.join(tempfile.gettempdir(), "crucible-sandbox-uids"))
# How long a check waits for a free uid when every one in the range is leased.
LEASE_WAIT_SECONDS = 30.0


class SandboxUnavailable(RuntimeError):
    """The machine cannot provide the isolation the current mode requires (see CRUCIBLE_SANDBOX_ISOLATION)."""


def sandbox_uids() -> range:
    """The uids (each with the gid of the same number) leased to checks when the caller is root.

    From CRUCIBLE_SANDBOX_UIDS, "FIRST-LAST" inclusive (default 59000-59999); nothing else on the machine may run
    under them.
    """
    text = os.environ.get(UIDS_ENV, "").strip() or DEFAULT_UIDS
    low, sep, high = text.partition("-")
    try:
        first, last = int(low), int(high if sep else low)
    except ValueError:
        raise SandboxUnavailable(f"{UIDS_ENV}={text!r} is not a uid range such as {DEFAULT_UIDS}") from None
    if not 1 <= first <= last < 2**32 - 1:
        raise SandboxUnavailable(f"{UIDS_ENV}={text!r}: the range must lie within 1 and {2**32 - 2}")
    return range(first, last + 1)


@dataclass
class Lease:
    """A uid held for one check: the flock on its lock file, released by closing `fd` (or by our death).

    The lock file also says whether the uid's last check ended with every process of the uid killed ("clean");
    it says "dirty" from the moment a lease is taken, so a worker that dies mid-check leaves it dirty, and the
    next check under the uid starts by killing what is left.
    """

    uid: int
    fd: int
    clean: bool

    def mark(self, clean: bool) -> None:
        os.pwrite(self.fd, b"clean\n" if clean else b"dirty\n", 0)

    def release(self) -> None:
        os.close(self.fd)


def lease_dir() -> str:
    for path in UID_LOCK_DIRS:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError:
            continue  # e.g. no /run
        try:
            st = os.lstat(path)
        except OSError:
            continue
        # Ours alone: anyone who could write here could take (or hold) every lease.
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077:
            return path
        log.warning("not using %s for sandbox uid leases: not a directory private to uid %s", path, os.geteuid())
    raise SandboxUnavailable(f"no private directory for the sandbox's uid leases (tried {', '.join(UID_LOCK_DIRS)})")


def has_account(uid: int) -> bool:
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
        except KeyError:
            continue
        return True
    return False


def lease_uid(wait_seconds: float | None = None) -> Lease | None:
    """The lowest free uid of the range, held until `release()`; None when none freed up within `wait_seconds`
    (default `LEASE_WAIT_SECONDS`)."""
    uids = sandbox_uids()
    lock_dir = lease_dir()
    deadline = time.monotonic() + (LEASE_WAIT_SECONDS if wait_seconds is None else wait_seconds)
    while True:
        for uid in uids:
            fd = os.open(
                os.path.join(lock_dir, f"{uid}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600
            )
            try:
                # Locks belong to the open file: two threads of one process exclude each other as two processes do.
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            if has_account(uid):
                os.close(fd)
                continue
            lease = Lease(uid, fd, clean=os.pread(fd, 16, 0) == b"clean\n")
            lease.mark(False)
            return lease
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def uid_processes(uid: int) -> int:
    """How many processes run with `uid` as their real uid (a /proc scan)."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_bytes()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith(b"Uid:"):
                count += line.split()[1] == str(uid).encode()
                break
    return count


def sweep_uid(uid: int) -> int:
    """Kill every process of `uid`: a shell that runs as that uid and calls kill(-1). Returns how many there were."""
    left = uid_processes(uid)
    try:
        subprocess.run(
            ["/bin/sh", "-c", "kill -9 -1"],
            user=uid,
            group=uid,
            extra_groups=[],
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("could not kill the processes of sandbox uid %s: %s", uid, exc)
    return left
