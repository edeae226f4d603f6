"""The sandbox for untrusted code: every escape attempt is contained *and* reported as such.

Each test runs real code in the real sandbox (no mocks of the isolation), with limits of a few seconds. Tests
that need namespaces and Landlock are skipped, with the reason, on a kernel that has neither; the probe for that
is independent of the code under test, so a sandbox that wrongly claims to be unavailable still fails here.
"""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from workers.sandbox import runner, uids
from workers.sandbox.runner import Outcome, SandboxLimits, SandboxResult, run_python
from workers.sandbox.uids import SandboxUnavailable

FAST = SandboxLimits(wall_seconds=3.0, cpu_seconds=3, max_processes=16)
# Time the machinery may add to a limit (interpreter start-up, namespace teardown) on a busy test machine.
SLACK_SECONDS = 4.0


def _kernel_isolation_problem() -> str | None:
    """Why this kernel cannot host the strict sandbox, probed without the code under test; None when it can."""
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "aarch64"):
        return f"needs Linux on x86_64/aarch64, not {sys.platform}/{platform.machine()}"
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(ctypes.c_long(444), None, ctypes.c_long(0), ctypes.c_long(1)) < 1:
        return f"Landlock unavailable (errno {ctypes.get_errno()})"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the forked probe
        flags = 0x40000000 | 0x20000000 | (0 if os.geteuid() == 0 else 0x10000000)
        os._exit(0 if libc.unshare(ctypes.c_int(flags)) == 0 else 1)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return "network/PID namespaces refused"
    return None


_PROBLEM = _kernel_isolation_problem()
needs_isolation = pytest.mark.skipif(_PROBLEM is not None, reason=f"sandbox isolation unavailable: {_PROBLEM}")


def run(code: str, limits: SandboxLimits = FAST, **kwargs: Any) -> SandboxResult:
    return run_python(textwrap.dedent(code), limits=limits, **kwargs)


def _sandbox_processes() -> set[int]:
    """Processes that belong to a sandbox: a uid of the sandbox's range, or the launcher's command line (a /proc
    scan, no psutil)."""
    sandbox_range = {str(uid) for uid in uids.sandbox_uids()}
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue  # exited meanwhile
        ids = next((line.split()[1:] for line in status.splitlines() if line.startswith("Uid:")), [])
        if sandbox_range & set(ids) or b"sandbox/launcher.py" in cmdline:
            found.add(int(entry))
    return found


@pytest.fixture
def no_leftovers() -> Iterator[None]:
    before = _sandbox_processes()
    yield
    deadline = time.monotonic() + 2.0
    while (left := _sandbox_processes() - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"sandbox processes left behind: {sorted(left)}"


@pytest.fixture
def outside_dir() -> Iterator[Path]:
    """A directory outside the sandbox that the sandbox uid could use were it not for Landlock (mode 0777)."""
    path = Path(tempfile.mkdtemp(prefix="crucible-test-outside-"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path)


# --- outcomes --------------------------------------------------------------------------------------------------


@needs_isolation
def test_passing_program_is_ok_with_its_stdout() -> None:
    result = run(
        """
        def add(a, b):
            return a + b
        assert add(2, 3) == 5
        print("all tests passed")
        """
    )
    assert result.outcome is Outcome.OK and result.passed
    assert result.exit_code == 0 and result.signal is None
    assert result.stdout == "all tests passed\n"
    assert result.stderr == "" and not result.truncated
    layers = result.isolation.split("+")
    assert {"netns", "pidns", "mntns", "tmpfs", "landlock", "rlimits"} <= set(layers), result.isolation
    if os.geteuid() == 0:
        assert any(layer.startswith("uid") and int(layer[3:]) in uids.sandbox_uids() for layer in layers)
        assert result.observations == ()
    else:
        assert "nocaps" in layers
        assert [(o.kind, o.what) for o in result.observations] == [("isolation", "uid")]


@needs_isolation
def test_failing_assert_is_failed_with_the_traceback() -> None:
    result = run(
        """
        def add(a, b):
            return a - b
        assert add(2, 3) == 5, "add is wrong"
        """
    )
    assert result.outcome is Outcome.FAILED and not result.passed
    assert result.exit_code == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert "main.py" in result.stderr and "AssertionError: add is wrong" in result.stderr
    assert "AssertionError" in result.detail


@needs_isolation
def test_stdin_files_and_exit_status() -> None:
    result = run(
        """
        import sys
        import helper
        from pkg import mod
        print(helper.greet(input()), mod.VALUE)
        sys.exit(3)
        """,
        files={
            "helper.py": "def greet(name):\n    return 'hi ' + name\n",
            "pkg/__init__.py": "",
            "pkg/mod.py": "VALUE = 7",
        },
        stdin="ada\n",
    )
    assert result.outcome is Outcome.FAILED and result.exit_code == 3
    assert result.stdout == "hi ada 7\n"


def test_bad_file_names_are_refused() -> None:
    for name in ("../escape.py", "/etc/cron.d/x", "main.py", ""):
        with pytest.raises(ValueError):
            run_python("pass", files={name: "x"})


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError):
        SandboxLimits(wall_seconds=0)
    with pytest.raises(ValueError):
        SandboxLimits(cpu_seconds=0)
    with pytest.raises(ValueError):
        SandboxLimits(max_output_bytes=-1)


@needs_isolation
def test_directory_is_private_and_removed_afterwards() -> None:
    result = run(
        """
        import os, tempfile
        with open("notes.txt", "w") as fh:
            fh.write("written inside")
        os.mkdir("sub")
        os.rename("notes.txt", "sub/notes.txt")
        with tempfile.NamedTemporaryFile(dir=None) as tmp:  # TMPDIR points at the private directory
            tmp.write(b"x")
        print(os.getcwd())
        print(open("sub/notes.txt").read())
        """
    )
    assert result.outcome is Outcome.OK, result.stderr
    workdir, content = result.stdout.splitlines()
    assert content == "written inside"
    assert Path(workdir).name.startswith("crucible-sandbox-")
    assert not Path(workdir).exists()


# --- file system -----------------------------------------------------------------------------------------------


@needs_isolation
def test_reading_outside_its_directory_fails(outside_dir: Path) -> None:
    secret = outside_dir / "secret.txt"
    secret.write_text("TOP-SECRET-3141")
    secret.chmod(0o644)  # readable by any uid: only Landlock stands in the way
    result = run(
        f"""
        for path in [{str(secret)!r}, "/etc/passwd", "/proc/self/environ", {str(Path.cwd() / "pyproject.toml")!r}]:
            try:
                with open(path) as fh:
                    print("READ", path, fh.read())
            except PermissionError:
                print("PermissionError", path)
        """
    )
    assert result.outcome is Outcome.OK, result.stderr
    assert "TOP-SECRET-3141" not in result.stdout and "root:" not in result.stdout
    assert "READ" not in result.stdout
    assert result.stdout.count("PermissionError") == 4


@needs_isolation
def test_listing_outside_its_directory_fails(outside_dir: Path) -> None:
    (outside_dir / "visible-name").write_text("")
    result = run(
        f"""
        import os
        for path in [{str(outside_dir)!r}, "/tmp", "/proc", "/"]:
            try:
                print("LISTED", path, os.listdir(path))
            except PermissionError:
                print("PermissionError", path)
        """
    )
    assert result.outcome is Outcome.OK, result.stderr
    assert "visible-name" not in result.stdout and "LISTED" not in result.stdout


@needs_isolation
def test_writing_outside_its_directory_fails(outside_dir: Path) -> None:
    target = outside_dir / "planted.txt"
    in_tmp = Path(tempfile.gettempdir()) / f"crucible-planted-{uuid.uuid4().hex}"
    result = run(
        f"""
        import os
        for action in (lambda: open({str(target)!r}, "w").write("x"),
                       lambda: os.mkdir({str(outside_dir / "d")!r}),
                       lambda: open({str(in_tmp)!r}, "w").write("x")):
            try:
                action()
                print("WROTE")
            except PermissionError:
                print("PermissionError")
        with open("inside.txt", "w") as fh:
            fh.write("ok")
        print("inside", open("inside.txt").read())
        """
    )
    assert result.outcome is Outcome.OK, result.stderr
    assert result.stdout.splitlines() == ["PermissionError"] * 3 + ["inside ok"]
    assert not target.exists() and not (outside_dir / "d").exists()
    assert not in_tmp.exists()


@needs_isolation
def test_file_size_limit() -> None:
    limits = SandboxLimits(wall_seconds=3.0, cpu_seconds=3, max_file_bytes=1024 * 1024)
    result = run('open("big.bin", "wb").write(b"x" * (2 * 1024 * 1024))', limits)
    assert result.outcome is Outcome.FAILED
    assert "File too large" in result.stderr


# --- network ---------------------------------------------------------------------------------------------------


@needs_isolation
def test_no_network() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        result = run(
            f"""
            import socket
            attempts = {{
                "loopback": lambda: socket.create_connection(("127.0.0.1", {port}), timeout=1),
                "external": lambda: socket.create_connection(("1.1.1.1", 53), timeout=1),
                "dns": lambda: socket.getaddrinfo("example.com", 443),
                "udp": lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("1.1.1.1", 53)),
            }}
            for name, attempt in attempts.items():
                try:
                    attempt()
                    print(name, "CONNECTED")
                except OSError as exc:
                    print(name, "refused", type(exc).__name__)
            """
        )
        listener.settimeout(0.3)
        with pytest.raises(TimeoutError):
            listener.accept()
    assert result.outcome is Outcome.OK, result.stderr
    assert "CONNECTED" not in result.stdout
    assert result.stdout.count("refused") == 4


# --- processes -------------------------------------------------------------------------------------------------


@needs_isolation
def test_fork_bomb_is_contained(no_leftovers: None) -> None:
    limits = SandboxLimits(wall_seconds=2.0, cpu_seconds=2, max_processes=16)
    result = run(
        """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """,
        limits,
    )
    assert result.outcome is not Outcome.OK
    assert result.outcome in (Outcome.TIMEOUT, Outcome.FAILED)
    assert result.wall_seconds < limits.wall_seconds + SLACK_SECONDS


@needs_isolation
def test_setsid_escape_dies_with_the_program(no_leftovers: None) -> None:
    result = run(
        """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(60)  # would outlive the program were it not for the PID namespace
            os._exit(0)
        print("main exits")
        """
    )
    assert result.outcome is Outcome.OK, result.stderr
    assert result.wall_seconds < 2.0


@needs_isolation
def test_killing_its_parent_and_everyone_else_fails(no_leftovers: None) -> None:
    # A victim under another check's uid: the PID namespace, Landlock's signal scope and the uid protect it.
    other = uids.sandbox_uids()[-1]
    as_sandbox_uid: dict[str, Any] = {"user": other, "group": other, "extra_groups": []} if os.geteuid() == 0 else {}
    victim = subprocess.Popen(["sleep", "30"], **as_sandbox_uid)
    posted: list[int] = []

    def post_launcher_pid() -> None:
        # Find our launcher and hand its pid to the code, as if the code had found it itself.
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and not posted:
            for entry in os.listdir("/proc"):
                try:
                    status = Path(f"/proc/{entry}/status").read_text()
                    cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                    cwd = os.readlink(f"/proc/{entry}/cwd")
                except (OSError, ValueError):
                    continue
                ppid = next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:"))
                if ppid == str(os.getpid()) and b"sandbox/launcher.py" in cmdline:
                    tmp = Path(cwd) / "launcher.pid.tmp"
                    tmp.write_text(entry)
                    tmp.chmod(0o644)
                    tmp.rename(Path(cwd) / "launcher.pid")
                    posted.append(int(entry))
                    break
            time.sleep(0.01)

    poster = threading.Thread(target=post_launcher_pid)
    poster.start()
    try:
        result = run(
            f"""
            import os, time
            if os.getuid() == 0:
                raise SystemExit("refusing to try kill(-1) while still root")
            for _ in range(400):
                if os.path.exists("launcher.pid"):
                    break
                time.sleep(0.01)
            targets = {{
                "parent": os.getppid(),
                "launcher": int(open("launcher.pid").read()),
                "victim": {victim.pid},
                "pytest": {os.getpid()},
                "everyone": -1,
            }}
            try:
                print("launcher from /proc", [p for p in os.listdir("/proc") if p.isdigit()])
            except PermissionError:
                print("/proc PermissionError")
            for name, pid in targets.items():
                try:
                    os.kill(pid, 9)
                    print(name, "signalled")
                except OSError as exc:
                    print(name, type(exc).__name__)
            print("still here")
            """,
            # It waits up to 4 s for the poster thread's /proc scan: on a busy machine FAST's 3 s wall ran out first.
            limits=SandboxLimits(wall_seconds=20.0, cpu_seconds=3, max_processes=16),
        )
        poster.join()
        assert posted, "the launcher was not found"
        assert victim.poll() is None, "a process outside the sandbox was killed"
    finally:
        poster.join()
        victim.kill()
        victim.wait()
    # The launcher survived: it reported how the program ended (a dead launcher gives ERROR, not OK).
    assert result.outcome is Outcome.OK, (result.detail, result.stderr)
    lines = result.stdout.splitlines()
    assert "/proc PermissionError" in lines
    for name in ("launcher", "victim", "pytest", "everyone"):
        assert f"{name} ProcessLookupError" in lines, result.stdout
    # getppid() is 0 in a new PID namespace, and kill(0, ...) only reaches the program's own new process group.
    assert lines[-1] == "still here"


# --- resources -------------------------------------------------------------------------------------------------


@needs_isolation
def test_unbounded_allocation_is_memory() -> None:
    limits = SandboxLimits(wall_seconds=5.0, cpu_seconds=5, memory_bytes=256 * 1024 * 1024)
    result = run(
        """
        grow = bytearray()
        while True:
            grow += b"x" * (8 * 1024 * 1024)
        """,
        limits,
    )
    assert result.outcome is Outcome.MEMORY, (result.detail, result.stderr)
    assert "MemoryError" in result.stderr


@needs_isolation
def test_busy_loop_hits_the_cpu_limit(no_leftovers: None) -> None:
    # A generous wall limit, so that the CPU limit (1 s of CPU) is what ends it even on a loaded machine.
    limits = SandboxLimits(wall_seconds=15.0, cpu_seconds=1)
    started = time.monotonic()
    result = run("while True:\n    pass\n", limits)
    assert result.outcome is Outcome.TIMEOUT
    assert "CPU time limit" in result.detail
    assert time.monotonic() - started < limits.wall_seconds


@needs_isolation
def test_sleep_hits_the_wall_limit(no_leftovers: None) -> None:
    limits = SandboxLimits(wall_seconds=1.5, cpu_seconds=5)
    result = run("import time\ntime.sleep(100)\n", limits)
    assert result.outcome is Outcome.TIMEOUT
    assert "wall time limit 1.5 s exceeded" == result.detail
    assert limits.wall_seconds <= result.wall_seconds < limits.wall_seconds + SLACK_SECONDS


@needs_isolation
def test_huge_output_is_truncated() -> None:
    limits = SandboxLimits(wall_seconds=5.0, cpu_seconds=5, max_output_bytes=1000)
    result = run(
        """
        import sys
        sys.stdout.write("o" * 5_000_000)
        sys.stderr.write("e" * 5_000_000)
        """,
        limits,
    )
    assert result.outcome is Outcome.OK
    assert result.truncated
    assert result.stdout == "o" * 1000 and result.stderr == "e" * 1000


@needs_isolation
def test_endless_output_never_blocks_the_kill(no_leftovers: None) -> None:
    limits = SandboxLimits(wall_seconds=1.5, cpu_seconds=10, max_output_bytes=4096)
    result = run("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", limits)
    assert result.outcome is Outcome.TIMEOUT
    assert result.truncated and len(result.stdout) == 4096
    assert result.wall_seconds < limits.wall_seconds + SLACK_SECONDS


@needs_isolation
def test_parent_environment_is_not_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRUCIBLE_FAKE_API_KEY", "sk-fake-secret-2718")
    result = run("import os\nprint(sorted(os.environ.items()))\n")
    assert result.outcome is Outcome.OK
    assert "sk-fake-secret-2718" not in result.stdout and "CRUCIBLE_FAKE_API_KEY" not in result.stdout
    names = {name for name, _ in eval(result.stdout)}  # noqa: S307 - our own printed list
    assert names <= {"PATH", "LANG", "CRUCIBLE_SANDBOX", "HOME", "TMPDIR"}


@needs_isolation
def test_segfault_is_killed() -> None:
    result = run("import ctypes\nctypes.string_at(0)\n")
    assert result.outcome is Outcome.KILLED
    assert result.signal == 11 and "SIGSEGV" in result.detail


# --- the sandbox's own failures ------------------------------------------------------------------------------


def test_launcher_that_cannot_start_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "_LAUNCHER", Path("/nonexistent/launcher.py"))
    result = run_python("print('hello')")
    assert result.outcome is Outcome.ERROR and not result.passed
    assert result.detail.startswith("sandbox error")
    assert "hello" not in result.stdout


def test_missing_interpreter_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "/nonexistent/python3")
    result = run_python("print('hello')")
    assert result.outcome is Outcome.ERROR
    assert "could not start the sandbox launcher" in result.detail


def _patch_config(monkeypatch: pytest.MonkeyPatch, **changes: Any) -> None:
    build = runner._build_config

    def patched(*args: Any, **kwargs: Any) -> dict[str, Any]:
        config = build(*args, **kwargs)
        for key, value in changes.items():
            if key in config["limits"]:
                config["limits"][key] = value
            else:
                config[key] = value
        return config

    monkeypatch.setattr(runner, "_build_config", patched)


@needs_isolation
def test_setup_failure_inside_the_child_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # The child cannot apply a limit that is not a number, after the fork and before the code runs.
    _patch_config(monkeypatch, max_open_files="many")
    result = run_python("print('hello')")
    assert result.outcome is Outcome.ERROR
    assert "sandbox setup failed" in result.detail and "many" in result.detail
    assert "hello" not in result.stdout


@needs_isolation
def test_setup_failure_in_the_launcher_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # The launcher cannot mount the workspace over a directory that does not exist, before the fork.
    _patch_config(monkeypatch, workdir="/nonexistent/crucible-sandbox-workdir")
    result = run_python("print('hello')")
    assert result.outcome is Outcome.ERROR
    assert "sandbox setup failed" in result.detail
    assert "hello" not in result.stdout


@needs_isolation
def test_strict_mode_refuses_without_landlock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(runner.ISOLATION_ENV, raising=False)
    _patch_config(monkeypatch, simulate_unavailable=["landlock"])
    with pytest.raises(SandboxUnavailable, match=runner.ISOLATION_ENV) as info:
        run_python("print('hello')")
    assert "landlock" in str(info.value)


@needs_isolation
def test_strict_mode_refuses_without_namespaces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(runner.ISOLATION_ENV, "strict")
    _patch_config(monkeypatch, simulate_unavailable=["namespaces"])
    with pytest.raises(SandboxUnavailable, match="namespaces"):
        run_python("print('hello')")


@needs_isolation
def test_rlimits_only_mode_runs_degraded_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(runner.ISOLATION_ENV, "rlimits-only")
    _patch_config(monkeypatch, simulate_unavailable=["namespaces", "landlock"])
    result = run_python("print('hello')")
    assert result.outcome is Outcome.OK and result.stdout == "hello\n"
    assert "degraded" in result.isolation and "landlock" not in result.isolation.split(" ")[0]
    assert result.isolation.startswith("rlimits")


def test_unknown_isolation_mode_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(runner.ISOLATION_ENV, "none-please")
    with pytest.raises(SandboxUnavailable, match=runner.ISOLATION_ENV):
        run_python("print('hello')")


# --- per-check uids ----------------------------------------------------------------------------------------------


def test_uid_range_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(uids.UIDS_ENV, raising=False)
    assert uids.sandbox_uids() == range(59000, 60000)
    monkeypatch.setenv(uids.UIDS_ENV, "70000-70009")
    assert uids.sandbox_uids() == range(70000, 70010)
    for bad in ("0-10", "abc", "20-10", "1-4294967295"):
        monkeypatch.setenv(uids.UIDS_ENV, bad)
        with pytest.raises(SandboxUnavailable, match=uids.UIDS_ENV):
            uids.sandbox_uids()


def test_concurrent_leases_get_distinct_uids_and_free_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(uids.UIDS_ENV, "59990-59992")
    monkeypatch.setattr(uids, "has_account", lambda uid: uid == 59990)  # as if 59990 were a login's
    leases: list[Any] = []
    barrier = threading.Barrier(2)

    def take() -> None:
        barrier.wait()
        leases.append(uids.lease_uid(wait_seconds=0))

    threads = [threading.Thread(target=take) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert sorted(lease.uid for lease in leases) == [59991, 59992]
        assert uids.lease_uid(wait_seconds=0) is None  # all taken (59990 has an account)
    finally:
        for lease in leases:
            lease.release()
    again = uids.lease_uid(wait_seconds=0)
    assert again is not None and again.uid == 59991
    again.release()


@pytest.mark.skipif(os.geteuid() != 0, reason="uids are leased only when the caller is root")
def test_no_free_uid_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(uids.UIDS_ENV, "59993-59993")
    monkeypatch.setattr(uids, "LEASE_WAIT_SECONDS", 0.2)
    held = uids.lease_uid(wait_seconds=0)
    assert held is not None
    try:
        result = run_python("print('hello')")
    finally:
        held.release()
    assert result.outcome is Outcome.ERROR and "no free uid in 59993-59993" in result.detail


@needs_isolation
@pytest.mark.skipif(os.geteuid() != 0, reason="uids are leased only when the caller is root")
def test_leftovers_under_the_uid_are_killed_before_and_after(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(uids.UIDS_ENV, "59994-59994")
    # A process left under the uid by a worker that died mid-check (its lease never marked clean) must not share
    # the next check.
    crashed = uids.lease_uid(wait_seconds=0)
    assert crashed is not None
    crashed.release()
    stray = subprocess.Popen(["sleep", "30"], user=59994, group=59994, extra_groups=[])
    try:
        result = run("print('hello')")
        assert stray.wait(timeout=10) == -9
    finally:
        stray.kill()
        stray.wait()
    assert result.outcome is Outcome.OK and "uid59994" in result.isolation.split("+")
    clean = uids.lease_uid(wait_seconds=0)
    assert clean is not None and clean.clean  # the check ended with its sweep
    clean.release()
    # The runner's own fallback, for a launcher that died before its last step.
    stray = subprocess.Popen(["sleep", "30"], user=59994, group=59994, extra_groups=[])
    try:
        assert uids.sweep_uid(59994) == 1
        assert stray.wait(timeout=10) == -9
    finally:
        stray.kill()
        stray.wait()


# --- observations ------------------------------------------------------------------------------------------------


@needs_isolation
def test_forged_observations_are_labelled_as_the_programs() -> None:
    # The monitor's pipe is open in the program: it can write to it, and what it writes is never the sandbox's.
    result = run(
        """
        import json, os
        line = json.dumps({"kind": "limit", "what": "memory", "target": "", "detail": "forged", "source": "sandbox"})
        for fd in range(3, 64):
            try:
                os.write(fd, (line + "\\n").encode())
            except OSError:
                pass
        """
    )
    assert result.outcome is Outcome.OK, result.stderr
    forged = [o for o in result.observations if o.detail == "forged"]
    assert forged and all(o.source == "program" for o in forged)


@needs_isolation
def test_flooding_the_observation_pipe_does_not_hold_the_launcher(no_leftovers: None) -> None:
    limits = SandboxLimits(wall_seconds=1.5, cpu_seconds=10)
    result = run(
        """
        import os
        junk = b"x" * 4000 + b"\\n"
        while True:
            for fd in range(3, 64):
                try:
                    os.write(fd, junk)
                except OSError:
                    pass
        """,
        limits,
    )
    # The launcher's own wall-time kill, not the runner's backstop for a launcher that stopped answering.
    assert result.outcome is Outcome.TIMEOUT and result.detail == "wall time limit 1.5 s exceeded"


@needs_isolation
def test_refusals_are_observed_without_changing_what_the_program_sees() -> None:
    result = run(
        """
        import os
        try:
            open("/etc/shadow")
        except PermissionError as exc:
            print(type(exc).__name__, exc.errno, exc.filename)
        os.kill(4242, 0)
        """
    )
    assert result.outcome is Outcome.FAILED
    assert result.stdout == "PermissionError 13 /etc/shadow\n"
    # The traceback shows the program's frames only, not the monitor's wrapper around os.kill.
    assert "ProcessLookupError" in result.stderr and "monitor.py" not in result.stderr
    assert "sandbox/launcher" not in result.stderr  # launcher.py and its parts (launcher_child.py ...)
    assert [(o.kind, o.what, o.target, o.source) for o in result.observations if o.kind == "denied"] == [
        ("denied", "read", "/etc/shadow", "program"),
        ("denied", "signal", "pid 4242", "program"),
    ]
    assert result.observations[0].as_dict()["detail"].startswith("open('/etc/shadow', 'r') failed: PermissionError")


@needs_isolation
def test_callers_files_over_the_disk_limit_are_an_error() -> None:
    limits = SandboxLimits(wall_seconds=3.0, cpu_seconds=3, max_disk_bytes=64 * 1024)
    result = run("print('hello')", limits, files={"big.txt": "x" * (256 * 1024)})
    assert result.outcome is Outcome.ERROR and "disk limit" in result.detail


@needs_isolation
def test_strict_mode_refuses_without_the_workspace_tmpfs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(runner.ISOLATION_ENV, raising=False)
    _patch_config(monkeypatch, simulate_unavailable=["tmpfs"])
    with pytest.raises(SandboxUnavailable, match="workspace tmpfs"):
        run_python("print('hello')")


@needs_isolation
def test_degraded_mode_polices_disk_and_leftovers_and_says_so(
    monkeypatch: pytest.MonkeyPatch, no_leftovers: None
) -> None:
    monkeypatch.setenv(runner.ISOLATION_ENV, "rlimits-only")
    _patch_config(monkeypatch, simulate_unavailable=["namespaces", "landlock"])
    limits = SandboxLimits(wall_seconds=10.0, cpu_seconds=10, max_disk_bytes=2 * 1024 * 1024)
    result = run(
        """
        import time
        for i in range(100):
            with open(f"fill-{i}.bin", "wb") as fh:
                fh.write(b"x" * (512 * 1024))
            time.sleep(0.01)
        """,
        limits,
    )
    assert result.outcome is Outcome.KILLED and "disk" in result.detail
    assert result.observed("limit", "disk")
    (degraded,) = result.observed("isolation", "degraded")
    assert "namespaces" in degraded.detail and "landlock" in degraded.detail and "tmpfs" in degraded.detail
    if os.geteuid() != 0:
        return
    # Without a PID namespace a daemon outlives the program; the uid's sweep kills it, and says so.
    result = run(
        """
        import os, time
        if os.fork() == 0:
            os.setsid()
            time.sleep(60)
        print("main exits")
        """
    )
    assert result.outcome is Outcome.OK and result.stdout == "main exits\n"
    (cleanup,) = result.observed("cleanup", "processes")
    assert cleanup.source == "sandbox" and cleanup.detail.startswith("1 process")


@needs_isolation
def test_refused_exec_and_late_imports_are_observed() -> None:
    # subprocess and socket are patched only when the program imports them.
    result = run(
        """
        import subprocess
        try:
            subprocess.run(["/etc/passwd"])
        except PermissionError:
            print("exec refused")
        print(subprocess.run(["/bin/echo", "allowed"], capture_output=True, text=True).stdout.strip())
        import socket
        print(socket.socket(socket.AF_INET, socket.SOCK_STREAM).connect_ex(("127.0.0.1", 9)) != 0)
        """
    )
    assert result.outcome is Outcome.OK, result.stderr
    assert result.stdout == "exec refused\nallowed\nTrue\n"
    assert [(o.kind, o.what, o.target) for o in result.observations] == [
        ("denied", "exec", "/etc/passwd"),
        ("denied", "network", "127.0.0.1:9"),
    ]
