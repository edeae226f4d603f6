"""What the sandboxed program tried that the sandbox refused, seen from inside the program's own process.

The launcher loads this module (standard library only) before it forks, and its child calls `install(fd)` once
every restriction is in place, right before the untrusted code runs. From then on the Python functions through
which code reaches outside its directory are wrapped: when one fails the way a refusal or a limit fails
(permission denied, no such process for a signal, no network, no more processes, disk full, file too large), one
JSON line goes to `fd`, a non-blocking pipe the launcher reads:

    {"kind": "denied", "what": "read", "target": "/etc/shadow", "detail": "open('/etc/shadow', 'r') failed: ..."}

The call itself behaves exactly as before (same result, same exception). Forked children inherit the wrappers
and the pipe, so their attempts are reported too. Each process reports a given (kind, what, target) once and at
most `_MAX_PER_PROCESS` of them; a full pipe drops lines rather than blocking the program.

What this is not: confinement. The kernel refuses these operations whatever happens here (namespaces, Landlock,
rlimits, the per-check uid). These reports come from the program's own process, so a hostile program can forge
or suppress them, and calls that bypass the wrapped functions (ctypes, `_socket`, C extensions) are refused all
the same but not itemised. The launcher therefore labels them with source "program", apart from what it sees
itself (limits, leftover processes, the workspace's size), which it labels "sandbox".

Wrapped: `open` (builtins, io, _io), and in `os`: open, listdir, scandir, mkdir, rmdir, remove, unlink, rename,
replace, symlink, link, chmod, chown, truncate, mkfifo, mknod, utime, kill, killpg, fork, forkpty, execv,
execve, posix_spawn, posix_spawnp; `posix.kill`, `posix.killpg`, `posix.fork`; `_thread.start_new_thread`
(threading); and, once they are imported, `subprocess.Popen`'s start of a child and `socket`'s connect,
connect_ex, bind and sendto on internet sockets and its name lookups. `posix.open`, `posix.listdir` and
`posix.mkdir` stay as they are: the import system uses them (pycache writes, path scans) and would report its own
harmless misses.
"""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import sys
from collections.abc import Callable
from typing import Any

_MAX_PER_PROCESS = 64
_MAX_TEXT = 300
_MAX_LINE = 3500  # below PIPE_BUF (4096), so that one write is one whole line even with many writers

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_NETWORK_ERRORS = (OSError,)  # every failure of an internet socket: the sandbox has no network at all

_fd = -1
_seen: set[tuple[str, str, str]] = set()
_raw_write = os.write


def _text(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return f"fd {value}"
    try:
        text = os.fsdecode(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 1] + "…"


def record(kind: str, what: str, target: str, detail: str) -> None:
    """Send one observation to the launcher (once per process for each kind/what/target)."""
    key = (kind, what, target)
    if _fd < 0 or key in _seen or len(_seen) >= _MAX_PER_PROCESS:
        return
    _seen.add(key)
    line = json.dumps({"kind": kind, "what": what, "target": target, "detail": detail[:_MAX_TEXT]})
    try:
        _raw_write(_fd, (line[:_MAX_LINE] + "\n").encode("utf-8", "replace"))
    except OSError:
        pass  # a full pipe (non-blocking) or a descriptor the program closed: the report is lost, not the call


def _limit_of(exc: BaseException) -> str | None:
    code = getattr(exc, "errno", None)
    if code in (errno.ENOSPC, errno.EDQUOT):
        return "disk"
    if code == errno.EFBIG:
        return "file size"
    if code in (errno.EMFILE, errno.ENFILE):
        return "open files"
    if code == errno.EAGAIN:
        return "processes"
    return None


def _report(exc: BaseException, what: str, target: str, call: str) -> None:
    detail = f"{call} failed: {type(exc).__name__}: {getattr(exc, 'strerror', None) or exc}"
    code = getattr(exc, "errno", None)
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        record("denied", what, target, detail)
        return
    limit = _limit_of(exc)
    if limit is not None and limit != "processes":
        record("limit", limit, target if limit == "file size" else "", detail)


def _call_text(name: str, target: str, extra: str = "") -> str:
    return f"{name}({target!r}{', ' + extra if extra else ''})"


def _wrap_path_call(name: str, func: Callable[..., Any], what: str, arg: int = 0) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except OSError as exc:
            target = _text(args[arg]) if len(args) > arg else ""
            _report(exc, what, target, _call_text(name, target))
            raise

    wrapper.__name__ = getattr(func, "__name__", name)
    wrapper.__doc__ = getattr(func, "__doc__", None)
    return wrapper


def _wrap_open(func: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        try:
            return func(file, mode, *args, **kwargs)
        except OSError as exc:
            writing = isinstance(mode, str) and any(c in mode for c in "wax+")
            target = _text(file)
            _report(exc, "write" if writing else "read", target, _call_text("open", target, repr(mode)))
            raise

    wrapper.__name__ = "open"
    wrapper.__doc__ = func.__doc__
    return wrapper


def _wrap_os_open(func: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(path: Any, flags: int, *args: Any, **kwargs: Any) -> Any:
        try:
            return func(path, flags, *args, **kwargs)
        except OSError as exc:
            target = _text(path)
            what = "write" if isinstance(flags, int) and flags & _WRITE_FLAGS else "read"
            _report(exc, what, target, _call_text("os.open", target, hex(flags) if isinstance(flags, int) else ""))
            raise

    wrapper.__name__ = "open"
    wrapper.__doc__ = func.__doc__
    return wrapper


def _wrap_signal(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(pid: Any, sig: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return func(pid, sig, *args, **kwargs)
        except OSError as exc:
            # ESRCH: the process is outside the sandbox's PID namespace, so it cannot even be seen.
            target = f"pid {pid}" if name.endswith("kill") else f"process group {pid}"
            record("denied", "signal", target, f"{name}({pid!r}, {sig!r}) failed: {type(exc).__name__}: {exc}")
            raise

    wrapper.__name__ = getattr(func, "__name__", name)
    wrapper.__doc__ = func.__doc__
    return wrapper


def _wrap_process(
    name: str, func: Callable[..., Any], target_of: Callable[[tuple[Any, ...]], str]
) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except OSError as exc:
            target = target_of(args)
            detail = f"{name} failed: {type(exc).__name__}: {exc.strerror or exc}"
            if exc.errno == errno.EAGAIN:
                record("limit", "processes", "", detail)
            elif exc.errno in (errno.EACCES, errno.EPERM):
                record("denied", "exec", target, detail)
            elif exc.errno == errno.ENOMEM:
                record("limit", "memory", "", detail)
            raise
        except RuntimeError as exc:  # _thread.start_new_thread: "can't start new thread"
            record("limit", "processes", "", f"{name} failed: RuntimeError: {exc}")
            raise

    wrapper.__name__ = getattr(func, "__name__", name)
    wrapper.__doc__ = func.__doc__
    return wrapper


def _first_arg(args: tuple[Any, ...]) -> str:
    return _text(args[0]) if args else ""


def _execute_child_target(args: tuple[Any, ...]) -> str:
    # Popen._execute_child(self, args, executable, ...): the executable, else the command's first word.
    try:
        if args[2] is not None:
            return _text(args[2])
        command = args[1]
        return _text(command if isinstance(command, str | bytes) else command[0])
    except (IndexError, TypeError, KeyError):
        return ""


def _no_target(args: tuple[Any, ...]) -> str:
    return ""


def _address_text(address: Any) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return _text(address)


def _patch_socket(module: Any) -> None:
    inet = {getattr(module, "AF_INET", 2), getattr(module, "AF_INET6", 10)}
    cls = module.socket

    def method(name: str) -> None:
        original = getattr(cls, name)

        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                result = original(self, *args, **kwargs)
            except _NETWORK_ERRORS as exc:
                if self.family in inet and args:
                    # The address is the last argument: connect(address), sendto(data[, flags], address).
                    target = _address_text(args[-1])
                    detail = f"socket.{name}({target!r}) failed: {type(exc).__name__}: {exc}"
                    record("denied", "network", target, detail)
                raise
            if name == "connect_ex" and result and self.family in inet and args:
                target = _address_text(args[0])
                record("denied", "network", target, f"socket.connect_ex({target!r}) returned {os.strerror(result)}")
            return result

        wrapper.__name__ = name
        setattr(cls, name, wrapper)

    for name in ("connect", "connect_ex", "bind", "sendto"):
        method(name)
    for lookup in ("getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr"):
        original = getattr(module, lookup, None)
        if original is None:
            continue

        def make(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(host: Any, *args: Any, **kwargs: Any) -> Any:
                try:
                    return func(host, *args, **kwargs)
                except OSError as exc:
                    target = _text(host)
                    record("denied", "network", f"name lookup {target}", f"socket.{name}({target!r}) failed: {exc}")
                    raise

            wrapper.__name__ = name
            return wrapper

        setattr(module, lookup, make(lookup, original))


def _patch_subprocess(module: Any) -> None:
    # Popen._execute_child raises both a failed fork and the child's failed exec (sent back through a pipe).
    module.Popen._execute_child = _wrap_process("subprocess", module.Popen._execute_child, _execute_child_target)


class _PatchOnImport:
    """A meta path finder that patches a module right after it is first imported (socket and subprocess are not
    loaded up front: importing them costs more than most programs run). Asked about every import, it answers at
    once for the names it does not patch."""

    def __init__(self, patches: dict[str, Callable[[Any], None]]) -> None:
        self.patches = patches

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        patch = self.patches.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PatchingLoader(spec.loader, patch)  # type: ignore[assignment]
        return spec


class _PatchingLoader:
    def __init__(self, loader: Any, patch: Callable[[Any], None]) -> None:
        self.loader = loader
        self.patch = patch

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        try:
            self.patch(module)
        except Exception:  # noqa: BLE001 - a report that cannot be set up must never break the program
            pass


def install(fd: int) -> None:
    """Wrap the functions listed in the module docstring; observations go to `fd` (non-blocking pipe)."""
    global _fd
    _fd = fd
    _seen.clear()
    import _io
    import _thread
    import posix

    wrapped_open = _wrap_open(io.open)
    builtins.open = wrapped_open
    io.open = wrapped_open
    _io.open = wrapped_open
    os.open = _wrap_os_open(os.open)
    for name in ("listdir", "scandir"):
        setattr(os, name, _wrap_path_call(f"os.{name}", getattr(os, name), "read"))
    for name, arg in (
        ("mkdir", 0),
        ("rmdir", 0),
        ("remove", 0),
        ("unlink", 0),
        ("rename", 1),
        ("replace", 1),
        ("symlink", 1),
        ("link", 1),
        ("chmod", 0),
        ("chown", 0),
        ("truncate", 0),
        ("mkfifo", 0),
        ("mknod", 0),
        ("utime", 0),
    ):
        if hasattr(os, name):
            setattr(os, name, _wrap_path_call(f"os.{name}", getattr(os, name), "write", arg))
    for module in (os, posix):
        setattr(module, "kill", _wrap_signal("os.kill", module.kill))  # noqa: B010 - posix's stub lacks them
        setattr(module, "killpg", _wrap_signal("os.killpg", module.killpg))  # noqa: B010
        setattr(module, "fork", _wrap_process("os.fork", module.fork, _no_target))  # noqa: B010
    os.forkpty = _wrap_process("os.forkpty", os.forkpty, _no_target)
    for name in ("execv", "execve", "posix_spawn", "posix_spawnp"):
        setattr(os, name, _wrap_process(f"os.{name}", getattr(os, name), _first_arg))
    _thread.start_new_thread = _wrap_process("start_new_thread", _thread.start_new_thread, _no_target)
    threading = sys.modules.get("threading")
    if threading is not None:
        threading._start_new_thread = _thread.start_new_thread  # type: ignore[attr-defined]
    # Modules that most programs never import are patched when (if) they are.
    later: dict[str, Callable[[Any], None]] = {}
    for name, patch in (("subprocess", _patch_subprocess), ("socket", _patch_socket)):
        if name in sys.modules:
            patch(sys.modules[name])
        else:
            later[name] = patch
    if later:
        sys.meta_path.insert(0, _PatchOnImport(later))
