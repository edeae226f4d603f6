"""workers.coding.execute: commands against a workspace in the real sandbox; hostile commands are contained."""

from __future__ import annotations

import pytest

from workers.coding.execute import CommandLimits, cut_middle, run_command
from workers.coding.workspace import Snapshot, Workspace
from workers.sandbox import Outcome

REPO = {
    "pkg/__init__.py": "def f(x):\n    return x + 1\n",
    "tests/test_f.py": "from pkg import f\n\n\ndef test_f():\n    assert f(1) == 2\n",
}
QUICK = CommandLimits(wall_seconds=3, cpu_seconds=2, max_processes=32, max_disk_bytes=4 * 1024 * 1024)


@pytest.fixture
def workspace() -> Workspace:
    return Workspace(Snapshot.from_files(REPO))


def test_the_projects_pytest_runs_the_workspaces_tests(workspace: Workspace) -> None:
    result = run_command(workspace, "python -m pytest -q -p no:cacheprovider")
    assert result.outcome is Outcome.OK, result.as_observation()
    assert "1 passed" in result.stdout
    assert result.changed == {}  # no __pycache__, no .pytest_cache


def test_changed_files_come_back_and_are_applied(workspace: Workspace) -> None:
    result = run_command(
        workspace,
        "printf 'x = 2\\n' > new.py && rm tests/test_f.py && sed -i 's/+ 1/+ 2/' pkg/__init__.py && "
        "mkdir -p deep/er && printf '\\377' > deep/er/blob.bin && echo done; exit 3",
    )
    assert result.exit_code == 3 and result.outcome is Outcome.FAILED
    assert result.stdout == "done\n"
    assert result.changed == {
        "deep/er/blob.bin": b"\xff",
        "new.py": b"x = 2\n",
        "pkg/__init__.py": b"def f(x):\n    return x + 2\n",
        "tests/test_f.py": None,
    }
    assert result.applied
    assert workspace.changed_paths() == ["deep/er/blob.bin", "new.py", "pkg/__init__.py", "tests/test_f.py"]
    assert workspace.read_text("pkg/__init__.py").endswith("x + 2\n")


def test_a_dry_run_leaves_the_workspace_alone_and_extra_files_are_visible(workspace: Workspace) -> None:
    result = run_command(
        workspace,
        "cat extra.txt; echo $HOME; echo changed > pkg/__init__.py",
        extra_files={"extra.txt": "hi"},
        apply_changes=False,
    )
    assert result.stdout.startswith("hi")
    assert "repo" not in result.stdout.splitlines()[-1]  # HOME is outside the repository: caches never come back
    assert result.changed == {"pkg/__init__.py": b"changed\n"}
    assert workspace.changed_paths() == []


def test_long_output_is_cut_in_the_middle_with_a_marker(workspace: Workspace) -> None:
    limits = CommandLimits(max_output_chars=1000)
    result = run_command(workspace, "python -c \"print('start'); print('x' * 50000); print('end')\"", limits=limits)
    assert result.truncated
    assert result.stdout.startswith("start") and result.stdout.rstrip().endswith("end")
    assert "characters cut ...]" in result.stdout and len(result.stdout) < 1200
    text = result.as_observation(max_chars=300)
    assert text.startswith("exit code: 0") and "characters cut ...]" in text and len(text) < 400
    assert [o.what for o in result.observed("limit")] == ["output"]


def test_cut_middle_keeps_head_and_tail() -> None:
    text = "a" * 100 + "b" * 100
    cut = cut_middle(text, 60)
    head, _, tail = cut.split("\n")
    kept = len(head) + len(tail)
    assert cut.startswith("a") and cut.endswith("b") and f"[... {200 - kept} characters cut ...]" in cut
    assert len(cut) <= 62
    assert cut_middle("short", 60) == "short"


def test_an_infinite_loop_is_stopped_and_reported(workspace: Workspace) -> None:
    result = run_command(workspace, "while true; do :; done", limits=QUICK)
    assert result.outcome is Outcome.TIMEOUT
    assert result.observed("limit", "cpu time") or result.observed("limit", "wall time")
    assert result.as_observation().startswith("timeout:")


def test_a_sleeper_hits_the_wall_time_limit(workspace: Workspace) -> None:
    result = run_command(workspace, "echo before; sleep 30", limits=QUICK)
    assert result.outcome is Outcome.TIMEOUT and result.exit_code is None
    assert result.stdout == "before\n"
    assert result.observed("limit", "wall time")
    assert result.seconds < QUICK.wall_seconds + 5


def test_a_fork_bomb_is_contained_and_reported(workspace: Workspace) -> None:
    result = run_command(workspace, "bomb() { bomb | bomb & }; bomb; sleep 1; echo survived", limits=QUICK)
    assert result.observed("limit", "processes"), result.observations
    assert "survived" in result.stdout


def test_a_background_process_does_not_hold_the_call_open(workspace: Workspace) -> None:
    result = run_command(workspace, "sleep 60 & echo started", limits=CommandLimits(wall_seconds=20))
    assert result.outcome is Outcome.OK and result.seconds < 15  # not held until the wall-time kill
    assert result.observed("cleanup", "processes")


def test_a_disk_filler_is_contained_and_its_files_not_brought_back(workspace: Workspace) -> None:
    limits = CommandLimits(
        wall_seconds=5, max_disk_bytes=4 * 1024 * 1024, max_file_bytes=1024 * 1024, max_changed_bytes=256 * 1024
    )
    result = run_command(workspace, "for i in 1 2 3 4 5 6; do yes > fill$i; done; echo small > s.txt", limits=limits)
    whats = {o.what for o in result.observed("limit")}
    assert {"disk", "file size", "changes"} <= whats, result.observations
    assert result.not_applied and all(path.startswith("fill") for path in result.not_applied)
    assert all(len(content or b"") <= 256 * 1024 for content in result.changed.values())
    assert not any(workspace.exists(path) for path in result.not_applied)


def test_a_memory_hog_gets_a_memory_error(workspace: Workspace) -> None:
    limits = CommandLimits(memory_bytes=256 * 1024 * 1024)
    result = run_command(workspace, "python -c 'x = bytearray(2 << 30)'", limits=limits)
    assert result.outcome is Outcome.MEMORY
    assert result.observed("limit", "memory")


def test_the_command_cannot_kill_the_supervisor_or_reach_the_network(workspace: Workspace) -> None:
    result = run_command(
        workspace,
        "kill -9 1; python -c \"import socket; socket.create_connection(('1.1.1.1', 80), timeout=1)\"; echo alive",
        limits=QUICK,
    )
    assert "alive" in result.stdout
    assert "PermissionError" in result.stderr or "OSError" in result.stderr  # Landlock, or no route: no network


def test_a_blank_command_is_refused(workspace: Workspace) -> None:
    with pytest.raises(ValueError, match="blank"):
        run_command(workspace, "  ")


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="max_processes"):
        CommandLimits(max_processes=0)


def test_a_workspace_past_the_sandboxs_default_file_count_runs_whole() -> None:
    files = {f"pkg{i % 50}/mod{i}.py": f"x = {i}\n" for i in range(5000)}
    workspace = Workspace(Snapshot.from_files(files))
    result = run_command(workspace, "find . -type f | wc -l; cat pkg7/mod4957.py")
    assert result.outcome is Outcome.OK, result.as_observation()
    assert result.stdout.split() == ["5000", "x", "=", "4957"]
    assert result.changed == {}
