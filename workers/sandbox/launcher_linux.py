"""The sandbox launcher's Linux layer: kernel constants, the ctypes structures and the system-call helpers.

Part of the launcher (launcher.py describes the whole design), loaded by it by file path before anything runs:
standard library only, like every part of the launcher.
"""

from __future__ import annotations

import ctypes
import os

# --- Linux constants (include/uapi/linux/sched.h, prctl.h, landlock.h) ------------------------------------------

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_NOSUID = 1 << 1
MS_NODEV = 1 << 2
MS_BIND = 1 << 12
MS_REC = 1 << 14
MS_PRIVATE = 1 << 18

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38

# The Landlock system calls come from the unified syscall table, so they share numbers on these architectures.
LANDLOCK_SYSCALLS: dict[str, tuple[int, int, int]] = {
    "x86_64": (444, 445, 446),
    "aarch64": (444, 445, 446),
}
LANDLOCK_CREATE_RULESET_VERSION = 1 << 0
LANDLOCK_RULE_PATH_BENEATH = 1

FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5
NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6

FS_ABI1 = (1 << 13) - 1  # EXECUTE .. MAKE_SYM: every file-system right of the first ABI
# Rights that Landlock accepts on a rule whose parent_fd is a regular or device file rather than a directory.
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
READ_EXEC = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR

LINUX_CAPABILITY_VERSION_3 = 0x20080522


class RulesetAttr(ctypes.Structure):
    # struct landlock_ruleset_attr: the kernel reads only the first `size` bytes, so older ABIs get a prefix.
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class PathBeneathAttr(ctypes.Structure):
    # struct landlock_path_beneath_attr is __attribute__((packed)): 12 bytes, no padding after parent_fd.
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def check(result: int, what: str) -> int:
    if result == -1:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


def prctl(option: int, arg: int) -> None:
    args = [ctypes.c_ulong(value) for value in (arg, 0, 0, 0)]
    check(int(libc.prctl(ctypes.c_int(option), *args)), f"prctl({option})")


def syscall(number: int, *args: int | ctypes.c_void_p | None, what: str) -> int:
    c_args = [a if isinstance(a, ctypes.c_void_p) else ctypes.c_long(0 if a is None else a) for a in args]
    return check(int(libc.syscall(ctypes.c_long(number), *c_args)), what)
