"""The escape suite (issue 16): hostile programs try to get out of the sandbox; none may, and every try is reported.

Each attempt runs as untrusted code in the real sandbox, with limits of a few seconds. For each one the test
checks from outside that nothing escaped (the file outside is not there, the listener accepted nothing, the
victim still runs, no secret in the output, the concurrent normal check passed) and that the result carries an
observation of the attempt. The attempts swallow their own errors and carry on, as a determined program would,
so the observation is the only trace of them in the result.

Cross-check attempts (another check's workspace, a fork bomb beside a normal check) need root: only root can give
each check a uid of its own, which is what they test. Without root they are skipped, and every result says the
weaker mode in an "isolation" observation (checked in test_sandbox.py).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.workers.sandbox.test_sandbox import needs_isolation
from workers.sandbox import uids
from workers.sandbox.runner import Observation, Outcome, SandboxLimits, SandboxResult, run_python

pytestmark = needs_isolation
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="per-check uids need root (the weaker mode is reported)")

LIMITS = SandboxLimits(
    wall_seconds=3.0,
    cpu_seconds=2,
    memory_bytes=192 * 1024 * 1024,
    max_processes=8,
    max_file_bytes=1024 * 1024,
    max_disk_bytes=4 * 1024 * 1024,
)
# Only for the checks that must pass while something else misbehaves: ample, so that a busy machine never fails them.
PATIENT = SandboxLimits(wall_seconds=20.0, cpu_seconds=20, max_processes=8)


def run(code: str, limits: SandboxLimits = LIMITS, **kwargs: Any) -> SandboxResult:
    return run_python(textwrap.dedent(code), limits=limits, **kwargs)


def observed(result: SandboxResult, kind: str, what: str, target: str | None = None) -> list[Observation]:
    return [o for o in result.observed(kind, what) if target is None or o.target == target]


@dataclass
class Scene:
    """What the attempts aim at, set up outside the sandbox by the test."""

    port: int
    victim: int
    outside: Path


@dataclass(frozen=True)
class Attempt:
    name: str
    code: str  # {port}, {victim} and {outside} are filled in
    escaped: Callable[[SandboxResult, Scene], bool]  # judged from outside the sandbox
    expected: tuple[str, str, str | None]  # (kind, what, target) of the observation that must report it
    outcome: Outcome = Outcome.OK
    limits: SandboxLimits = LIMITS


ATTEMPTS = [
    Attempt(
        "read /etc/shadow",
        """
        for path in ("/etc/shadow", "/etc/shadow"):
            try:
                print(open(path).read())
            except OSError as exc:
                print("no:", exc)
        """,
        lambda result, scene: "root:" in result.stdout,
        ("denied", "read", "/etc/shadow"),
    ),
    Attempt(
        "write to /tmp",
        """
        try:
            with open("{outside}/planted.txt", "w") as fh:
                fh.write("escaped")
        except OSError as exc:
            print("no:", exc)
        """,
        lambda result, scene: (scene.outside / "planted.txt").exists(),
        ("denied", "write", "{outside}/planted.txt"),
    ),
    Attempt(
        "TCP connection to a loopback listener",
        """
        import socket
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=1).sendall(b"escaped")
        except OSError as exc:
            print("no:", exc)
        """,
        lambda result, scene: False,  # the listener itself is checked in the test
        ("denied", "network", "127.0.0.1:{port}"),
    ),
    Attempt(
        "signal a process outside",
        """
        import os, posix
        for kill in (os.kill, posix.kill):
            try:
                kill({victim}, 9)
            except OSError as exc:
                print("no:", exc)
        """,
        lambda result, scene: False,  # the victim itself is checked in the test
        ("denied", "signal", "pid {victim}"),
    ),
    Attempt(
        "exhaust memory",
        """
        hoard = []
        while True:
            hoard.append(bytearray(16 * 1024 * 1024))
        """,
        lambda result, scene: False,  # RLIMIT_AS is per process: its MemoryError is the proof
        ("limit", "memory", None),
        Outcome.MEMORY,
    ),
    Attempt(
        "allocate one huge block",
        "block = bytearray(1 << 40)\n",
        lambda result, scene: False,
        ("limit", "memory", None),
        Outcome.MEMORY,
    ),
    Attempt(
        "write a huge file",
        """
        with open("huge.bin", "wb") as fh:
            try:
                for _ in range(64):
                    fh.write(b"x" * (1024 * 1024))
                    fh.flush()
            except OSError as exc:
                print("no:", exc)
        """,
        lambda result, scene: False,  # the file's size is checked by the sandbox itself (its observation)
        ("limit", "file size", "huge.bin"),
    ),
    Attempt(
        "fill the disk",
        """
        for i in range(1000):
            try:
                with open(f"fill-{i}.bin", "wb") as fh:
                    fh.write(b"x" * (900 * 1024))
            except OSError as exc:
                print("no:", exc)
                break
        """,
        lambda result, scene: False,
        ("limit", "disk", None),
    ),
    Attempt(
        "exhaust processes",
        """
        import os
        for _ in range(200):
            try:
                if os.fork() == 0:
                    import time
                    time.sleep(1)
                    os._exit(0)
            except OSError as exc:
                print("no:", exc)
                break
        """,
        lambda result, scene: False,  # containment of a real fork bomb: test_fork_bomb_beside_a_normal_check
        ("limit", "processes", None),
    ),
    Attempt(
        "spin forever",
        "while True:\n    pass\n",
        lambda result, scene: False,
        ("limit", "cpu time", None),
        Outcome.TIMEOUT,
        # An ample wall limit, so that the CPU limit is what ends it even on a busy machine.
        dataclasses.replace(LIMITS, cpu_seconds=1, wall_seconds=30.0),
    ),
    Attempt(
        "sleep forever",
        "import time\ntime.sleep(3600)\n",
        lambda result, scene: False,
        ("limit", "wall time", None),
        Outcome.TIMEOUT,
        dataclasses.replace(LIMITS, wall_seconds=1.0),
    ),
]


@pytest.fixture
def scene() -> Iterator[Scene]:
    outside = Path(tempfile.mkdtemp(prefix="crucible-escape-"))
    outside.chmod(0o777)  # writable by any uid: only the sandbox stands in the way
    victim = subprocess.Popen(["sleep", "60"])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        try:
            yield Scene(port=listener.getsockname()[1], victim=victim.pid, outside=outside)
            assert victim.poll() is None, "the process outside the sandbox was killed"
            listener.settimeout(0.2)
            with pytest.raises(TimeoutError):
                listener.accept()
        finally:
            victim.kill()
            victim.wait()
            for path in outside.iterdir():
                path.unlink()
            outside.rmdir()


def fill(text: str, scene: Scene) -> str:
    return (
        text.replace("{port}", str(scene.port))
        .replace("{victim}", str(scene.victim))
        .replace("{outside}", str(scene.outside))
    )


@pytest.mark.parametrize("attempt", ATTEMPTS, ids=[a.name for a in ATTEMPTS])
def test_attempt_is_contained_and_reported(attempt: Attempt, scene: Scene) -> None:
    result = run(fill(attempt.code, scene), attempt.limits)
    assert not attempt.escaped(result, scene), (result.stdout, result.stderr)
    assert result.outcome is attempt.outcome, (result.detail, result.stderr)
    kind, what, target = attempt.expected
    found = observed(result, kind, what, fill(target, scene) if target is not None else None)
    assert found, f"{attempt.name}: no {attempt.expected} among {[o.as_dict() for o in result.observations]}"
    assert all(o.detail for o in result.observations)


# --- across checks (root: a uid per check) -----------------------------------------------------------------------


def _uid_of_pid(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return next((int(line.split()[1]) for line in status.splitlines() if line.startswith("Uid:")), None)


def _pids_of_uid(uid: int) -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit() and _uid_of_pid(int(entry)) == uid]


def _wait_for(what: str, probe: Callable[[], Any], seconds: float = 20.0) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"gave up waiting for {what}")


@contextmanager
def check_holding_still(files: dict[str, str]) -> Iterator[tuple[Path, list[SandboxResult]]]:
    """Another check that runs until released, with `files` in its workspace: yields (its workspace as the caller
    sees it, the list its result lands in). Released by SIGUSR1, which it handles by exiting cleanly."""
    marker = next(iter(files))
    results: list[SandboxResult] = []
    program = """
        import signal, sys, time
        signal.signal(signal.SIGUSR1, lambda *_: sys.exit(0))
        while True:
            time.sleep(0.05)
        """
    thread = threading.Thread(target=lambda: results.append(run(program, PATIENT, files=files)))
    thread.start()
    uid: int | None = None
    try:

        def workspace() -> Path | None:
            for path in Path(tempfile.gettempdir()).glob("crucible-sandbox-*"):
                if (path / marker).exists():
                    return path
            return None

        path: Path = _wait_for("the other check's workspace", workspace)
        uid = path.stat().st_uid
        _wait_for("the other check's program", lambda: _pids_of_uid(uid))
        yield path, results
    finally:
        # Until its handler is installed the signal is ignored (it is PID 1 of its namespace): repeat it.
        while thread.is_alive():
            for pid in _pids_of_uid(uid) if uid is not None else []:
                os.kill(pid, signal.SIGUSR1)
            thread.join(0.1)


@needs_root
def test_another_checks_workspace_is_out_of_reach() -> None:
    secret = f"SECRET-{uuid.uuid4().hex}"
    with check_holding_still({"secret.txt": secret}) as (other, results):
        # Its workspace, as the caller sees it: its own uid's alone.
        st = other.stat()
        assert st.st_mode & 0o777 == 0o700 and st.st_uid in uids.sandbox_uids()
        result = run(
            f"""
            import os
            other = {str(other)!r}
            attempts = {{
                "read": lambda: print(open(other + "/secret.txt").read()),
                "list": lambda: print(os.listdir(other)),
                "write": lambda: open(other + "/planted.txt", "w").write("escaped"),
                "mkdir": lambda: os.mkdir(other + "/planted-dir"),
            }}
            for name, attempt in attempts.items():
                try:
                    attempt()
                    print(name, "DONE")
                except OSError as exc:
                    print(name, "no:", type(exc).__name__)
            """
        )
        assert not (other / "planted.txt").exists() and not (other / "planted-dir").exists()
    assert result.outcome is Outcome.OK, result.stderr
    assert secret not in result.stdout and "DONE" not in result.stdout
    assert observed(result, "denied", "read", f"{other}/secret.txt"), result.observations
    assert observed(result, "denied", "read", str(other))  # the listing
    assert observed(result, "denied", "write", f"{other}/planted.txt")
    assert observed(result, "denied", "write", f"{other}/planted-dir")
    # The other check was never disturbed, and ran under a uid of its own.
    (held,) = results
    assert held.outcome is Outcome.OK, held.detail
    own_uid = {layer for layer in result.isolation.split("+") if layer.startswith("uid")}
    other_uid = {layer for layer in held.isolation.split("+") if layer.startswith("uid")}
    assert own_uid and other_uid and own_uid != other_uid


@needs_root
def test_fork_bomb_beside_a_normal_check() -> None:
    bomb_limits = SandboxLimits(wall_seconds=3.0, cpu_seconds=3, max_processes=8)
    bombs: list[SandboxResult] = []
    bomb = threading.Thread(
        target=lambda: bombs.append(
            run(
                """
                import os
                while True:
                    try:
                        os.fork()
                    except OSError:
                        pass
                """,
                bomb_limits,
            )
        )
    )
    sandbox_range = uids.sandbox_uids()
    bomb.start()
    try:

        def uid_at_its_limit() -> int | None:
            counts: dict[int, int] = {}
            for entry in os.listdir("/proc"):
                uid = _uid_of_pid(int(entry)) if entry.isdigit() else None
                if uid is not None and uid in sandbox_range:
                    counts[uid] = counts.get(uid, 0) + 1
            return next((uid for uid, n in counts.items() if n >= bomb_limits.max_processes), None)

        bomb_uid = _wait_for("the fork bomb to reach its process limit", uid_at_its_limit)
        # The same process limit, at the same time: with a shared uid every fork below would fail.
        normal = run(
            """
            import os, subprocess
            children = []
            for _ in range(4):
                pid = os.fork()
                if pid == 0:
                    os._exit(7)
                children.append(pid)
            assert [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children] == [7] * 4
            assert subprocess.run(["/bin/true"]).returncode == 0
            print("normal check done")
            """,
            PATIENT,
        )
    finally:
        bomb.join()
    assert normal.outcome is Outcome.OK, (normal.detail, normal.stderr)
    assert normal.stdout == "normal check done\n"
    assert not normal.observed("limit", "processes")
    (bombed,) = bombs
    assert bombed.outcome is Outcome.TIMEOUT
    assert bombed.observed("limit", "processes"), bombed.observations
    assert any(o.source == "sandbox" for o in bombed.observed("limit", "processes"))
    assert f"uid{bomb_uid}" in bombed.isolation.split("+") and f"uid{bomb_uid}" not in normal.isolation.split("+")
    # Nothing of the bomb is left once its result is in.
    assert not _pids_of_uid(bomb_uid)
