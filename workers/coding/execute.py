"""Run a shell command against a workspace in the sandbox, and bring back the files it changed.

    result = run_command(workspace, "python -m pytest -q tests/test_mod.py")
    result.exit_code, result.outcome, result.changed      # changed: path -> new bytes, None when deleted
    observation = result.as_observation(max_chars=4000)   # what the model sees

How. One `workers.sandbox.run_python` call (namespaces, a size-capped tmpfs, Landlock, a uid of its own, rlimits)
whose Python program is a small supervisor, `PROGRAM` in `workers.coding.execute_supervisor`. Its directory holds:

    main.py        the supervisor (PID 1 of the sandbox's PID namespace)
    command.json   the command, its limits, the extra environment, the manifest of the tree (path, size)
    tree.bin       the workspace's files (plus `extra_files`) back to back: one file to copy in, not thousands
    repo/          written from tree.bin by the supervisor: the command's working directory
    home/, tmp/    HOME and TMPDIR, outside repo/ so that caches never count as changes

The supervisor writes repo/ (hashing each file as it goes), runs `/bin/sh -c <command>` there (stdin empty; PATH
with the calling interpreter's environment first, so `python` and `python -m pytest` are the project's interpreter
and its pytest; PYTHONPATH = repo/ and repo/src/ when present; PYTHONDONTWRITEBYTECODE=1; no network;
PYTEST_DISABLE_PLUGIN_AUTOLOAD=1, because the pytest plugins installed beside Crucible (pytest-django, hypothesis
through schemathesis, ...) belong to the control plane, not to the task's repository, and cost seconds a run: a
command that needs one names it with `-p`), reads its stdout and stderr keeping the head and the tail of each, kills
it at the wall-time limit, then kills whatever it left running (as PID 1 it can: kill(-1) reaches every other
process of the namespace; a background process does not hold the call open once the shell has exited), hashes again
the files whose stat changed (any write changes a file's ctime, which no call can set back), and writes one JSON
document to its own stdout: the exit status, the output, and the changed files (base64), up to `max_changed_bytes`
in all. A file that does not fit is listed in `not_applied` and left out (an observation says so); `__pycache__/`
and `.pytest_cache/` directories, symbolic links and other non-regular files are never brought back.

Containment. A fork bomb meets RLIMIT_NPROC (per uid: the check's own), an infinite loop the wall and CPU limits,
a disk filler the tmpfs (the workspace's size plus `max_disk_bytes`) and the per-file size limit, a memory hog
RLIMIT_AS. The supervisor survives all of these (it is PID 1, which the command cannot signal, and it forks nothing
after the command started), so the result names what happened: `outcome` (the sandbox's Outcome: ok, failed,
timeout, memory, killed, error) and `observations` (the sandbox's own plus the supervisor's "limit" findings:
wall time, cpu time, memory, processes, disk, file size, output, changes; "cleanup" for processes left behind).
Nothing of this raises in the caller; only a machine without the sandbox does (`SandboxUnavailable`).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from workers.coding.archive import normalize_path
from workers.coding.execute_supervisor import PROGRAM
from workers.coding.workspace import Workspace
from workers.sandbox import Observation, Outcome, SandboxLimits, run_python

MiB = 1024 * 1024
GiB = 1024 * MiB

# Time the sandbox gets beyond the command's own wall limit: the interpreter's start, hashing the tree before and
# after, and reading the changed files back.
_OVERHEAD_SECONDS = 10.0
_REPO = "repo"


@dataclass(frozen=True)
class CommandLimits:
    """Limits of one command. Times in seconds, sizes in bytes."""

    wall_seconds: float = 30.0
    cpu_seconds: int = 30  # per process (RLIMIT_CPU)
    memory_bytes: int = 1 * GiB  # per process (RLIMIT_AS)
    max_processes: int = 64  # processes and threads of the check's uid at once (RLIMIT_NPROC)
    max_output_chars: int = 16_000  # kept of stdout and of stderr each (head and tail; the middle is cut)
    max_disk_bytes: int = 128 * MiB  # what the command may write on top of the workspace's own size
    max_file_bytes: int = 16 * MiB  # one file (RLIMIT_FSIZE)
    max_changed_bytes: int = 8 * MiB  # changed files brought back, in all
    max_new_files: int = 4096  # files and directories the command may create

    def __post_init__(self) -> None:
        if not (isinstance(self.wall_seconds, int | float) and self.wall_seconds > 0):
            raise ValueError(f"wall_seconds must be a positive number, got {self.wall_seconds!r}")
        for name in (
            "cpu_seconds",
            "memory_bytes",
            "max_processes",
            "max_output_chars",
            "max_disk_bytes",
            "max_file_bytes",
            "max_changed_bytes",
            "max_new_files",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclass
class CommandResult:
    """How a command ended, what it printed, and what it changed."""

    command: str
    exit_code: int | None  # None when it did not exit by itself (killed, timed out, sandbox error)
    stdout: str  # head and tail kept, the middle replaced by a "[... N characters cut ...]" marker
    stderr: str
    truncated: bool  # some output was cut
    outcome: Outcome
    seconds: float  # the whole call, as the caller waited for it
    changed: dict[str, bytes | None] = field(default_factory=dict)  # created/modified -> bytes, deleted -> None
    observations: tuple[Observation, ...] = ()
    detail: str = ""  # one line: "exited with status 1", "wall time limit 30 s exceeded", ...
    command_seconds: float = 0.0  # the command alone, inside the sandbox
    not_applied: list[str] = field(default_factory=list)  # changed files left out (over max_changed_bytes)
    applied: bool = False  # `changed` was written into the workspace

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK

    def observed(self, kind: str, what: str | None = None) -> list[Observation]:
        return [o for o in self.observations if o.kind == kind and (what is None or o.what == what)]

    def as_observation(self, max_chars: int = 4000) -> str:
        """The text a model sees: the exit status, then stdout and stderr (each cut in the middle when the whole
        would pass `max_chars`), then one line per limit the command ran into."""
        head = self._status_line()
        notes = [f"[sandbox] {o.detail}" for o in self.observations if o.kind in ("limit", "cleanup") and o.detail]
        tail = "\n".join(dict.fromkeys(notes))
        budget = max(max_chars - len(head) - len(tail) - 40, 200)
        streams = [(name, text) for name, text in (("stdout", self.stdout), ("stderr", self.stderr)) if text]
        parts = [head]
        if streams:
            total = sum(len(text) for _, text in streams)
            for name, text in streams:
                other = total - len(text)
                share = max(budget - other, budget // len(streams)) if total > budget else len(text)
                parts.append(f"{name}:\n{cut_middle(text, share)}")
        else:
            parts.append("(no output)")
        if tail:
            parts.append(tail)
        return "\n".join(parts)

    def _status_line(self) -> str:
        if self.outcome is Outcome.OK:
            return "exit code: 0"
        if self.outcome is Outcome.FAILED and self.exit_code is not None:
            return f"exit code: {self.exit_code}"
        return f"{self.outcome.value}: {self.detail}" if self.detail else self.outcome.value


def cut_middle(text: str, max_chars: int) -> str:
    """`text` with its middle replaced by "[... N characters cut ...]" so that it fits in about `max_chars`."""
    if len(text) <= max_chars:
        return text
    keep = max(max_chars - 34, 20)  # the marker and its newlines take about 34
    first = keep * 2 // 5  # more of the tail: errors and summaries come last
    last = keep - first
    cut = len(text) - first - last
    return f"{text[:first]}\n[... {cut} characters cut ...]\n{text[len(text) - last :]}"


def _path_entries() -> list[str]:
    """Directories put first on the command's PATH: the calling interpreter's bin (a virtual environment's, with
    `python` and its installed scripts)."""
    bin_dir = os.path.dirname(sys.executable)
    return [bin_dir] if os.path.exists(os.path.join(bin_dir, "python")) else []


def run_command(
    workspace: Workspace,
    command: str,
    *,
    limits: CommandLimits = CommandLimits(),  # noqa: B008 - frozen, so one shared default is safe
    extra_files: Mapping[str, str | bytes] | None = None,
    apply_changes: bool = True,
    env: Mapping[str, str] | None = None,
) -> CommandResult:
    """Run `command` with /bin/sh -c in a sandboxed copy of `workspace` (plus `extra_files`) and return how it went.

    With `apply_changes`, the files it changed (`result.changed`) are written into `workspace`; `changed` is against
    the sandbox's starting tree, extra files included. `env` adds variables (a PYTHONPATH given goes before the
    default one). Raises ValueError for a blank command or a bad extra file path, `SandboxUnavailable` when the
    machine has no sandbox; every failure of the command itself is in the result.
    """
    if not command.strip():
        raise ValueError("the command is blank; give a shell command such as 'python -m pytest -q'")
    tree: dict[str, bytes] = workspace.files()
    for path, content in (extra_files or {}).items():
        tree[normalize_path(path)] = content.encode("utf-8") if isinstance(content, str) else bytes(content)
    # One file into the sandbox, not thousands: the contents back to back, named and sized in the manifest; the
    # supervisor writes them out inside the sandbox's tmpfs (writing 5,000 files to the caller's disk first and
    # having the launcher copy them took seconds).
    manifest = [(path, len(content)) for path, content in tree.items()]
    blob = b"".join(tree.values())
    directories = {path.rpartition("/")[0] for path in tree}
    config = {
        "command": command,
        "wall_seconds": limits.wall_seconds,
        "cpu_seconds": limits.cpu_seconds,
        "max_output_bytes": limits.max_output_chars,
        "max_changed_bytes": limits.max_changed_bytes,
        "max_processes": limits.max_processes,
        "path": _path_entries(),
        "env": dict(env or {}),
        "manifest": manifest,
    }
    files: dict[str, str | bytes] = {"command.json": json.dumps(config), "tree.bin": blob}
    # What comes back on stdout: base64 of both streams' head and tail (UTF-8: up to 4 bytes a character) and of
    # the changed files, plus their names and room for the JSON around them.
    report_bytes = (16 * limits.max_output_chars + limits.max_changed_bytes) * 4 // 3 + 2 * MiB
    sandbox_limits = SandboxLimits(
        wall_seconds=limits.wall_seconds + _OVERHEAD_SECONDS,
        cpu_seconds=limits.cpu_seconds,
        memory_bytes=limits.memory_bytes,
        max_processes=limits.max_processes,
        max_output_bytes=report_bytes,
        max_file_bytes=max(limits.max_file_bytes, max((size for _, size in manifest), default=0)),
        # The tree twice (tree.bin is removed once written out) plus a page a file, then the command's own room.
        max_disk_bytes=2 * len(blob) + 4096 * (len(tree) + len(directories)) + limits.max_disk_bytes,
        max_workspace_files=len(tree) + len(directories) + 16 + limits.max_new_files,
    )
    result = run_python(PROGRAM, limits=sandbox_limits, files=files, python_environment=True)
    command_result = _result(command, result, limits)
    if apply_changes and command_result.changed:
        try:
            workspace.apply_changes(command_result.changed)
            command_result.applied = True
        except ValueError as exc:  # e.g. a file where the workspace has a directory: keep the workspace as it was
            command_result.observations = (
                *command_result.observations,
                Observation("limit", "changes", f"the changed files could not be applied: {exc}"),
            )
    return command_result


def _result(command: str, sandboxed: Any, limits: CommandLimits) -> CommandResult:
    report = _report(sandboxed.stdout)
    if report is None:
        # The supervisor never reported: the sandbox failed, or the supervisor itself was killed (it should not be).
        detail = sandboxed.detail
        return CommandResult(
            command=command,
            exit_code=None,
            stdout="",
            stderr=cut_middle(sandboxed.stderr, limits.max_output_chars),
            truncated=sandboxed.truncated,
            outcome=sandboxed.outcome if sandboxed.outcome is not Outcome.OK else Outcome.ERROR,
            seconds=sandboxed.wall_seconds,
            observations=tuple(sandboxed.observations),
            detail=detail if sandboxed.outcome is not Outcome.OK else "the sandbox supervisor sent no report",
        )
    changed: dict[str, bytes | None] = {}
    for path, encoded in report.get("changed", {}).items():
        try:
            changed[normalize_path(path)] = base64.b64decode(encoded, validate=True)
        except (ValueError, binascii.Error):
            continue
    for path in report.get("deleted", []):
        try:
            changed[normalize_path(path)] = None
        except ValueError:
            continue
    outcome, detail = _outcome(report, limits)
    found = [Observation(**item) for item in report.get("observations", []) if isinstance(item, dict)]
    stdout, stderr = (_stream(report, name) for name in ("stdout", "stderr"))
    observations = _merge([*(_unprefixed(o) for o in sandboxed.observations), *found])
    return CommandResult(
        command=command,
        exit_code=report.get("exit_code"),
        stdout=stdout,
        stderr=stderr,
        truncated=bool(report.get("stdout_cut") or report.get("stderr_cut")),
        outcome=outcome,
        seconds=sandboxed.wall_seconds,
        changed=dict(sorted(changed.items())),
        observations=observations,
        detail=detail,
        command_seconds=float(report.get("seconds", 0.0)),
        not_applied=[str(path) for path in report.get("not_applied", [])],
    )


def _report(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            try:
                report = json.loads(line)
            except ValueError:
                return None
            return report if isinstance(report, dict) else None
    return None


def _stream(report: Mapping[str, Any], name: str) -> str:
    head = base64.b64decode(report.get(f"{name}_head", "")).decode("utf-8", "replace")
    tail = base64.b64decode(report.get(f"{name}_tail", "")).decode("utf-8", "replace")
    cut = int(report.get(f"{name}_cut", 0))
    if not cut:
        return head + tail
    return f"{head}\n[... {cut} characters cut ...]\n{tail}"


def _outcome(report: Mapping[str, Any], limits: CommandLimits) -> tuple[Outcome, str]:
    exit_code = report.get("exit_code")
    sig = report.get("signal")
    stderr = base64.b64decode(report.get("stderr_head", "")) + base64.b64decode(report.get("stderr_tail", ""))
    stderr_tail = stderr[-4000:].decode("utf-8", "replace")
    if report.get("wall_killed"):
        return Outcome.TIMEOUT, f"wall time limit {limits.wall_seconds:g} s exceeded; the command was killed"
    if exit_code == 0:
        return Outcome.OK, "exited with status 0"
    if report.get("cpu_killed"):
        return Outcome.TIMEOUT, f"CPU time limit {limits.cpu_seconds} s exceeded"
    if "MemoryError" in stderr_tail or "Cannot allocate memory" in stderr_tail:
        return Outcome.MEMORY, f"memory limit {limits.memory_bytes // MiB} MiB exceeded"
    if sig is not None:
        return Outcome.KILLED, f"killed by signal {sig}"
    return Outcome.FAILED, f"exited with status {exit_code}"


def _unprefixed(observation: Observation) -> Observation:
    """The sandbox names files by their place in its directory ("repo/x.py"); the workspace knows them as "x.py"."""
    prefix = f"{_REPO}/"
    if not observation.target.startswith(prefix) and prefix not in observation.detail:
        return observation
    return dataclasses.replace(
        observation,
        target=observation.target.removeprefix(prefix),
        detail=observation.detail.replace(f" {prefix}", " ").removeprefix(prefix),
    )


def _merge(observations: list[Observation]) -> tuple[Observation, ...]:
    merged: dict[tuple[str, str, str], Observation] = {}
    for observation in observations:
        key = (observation.kind, observation.what, observation.target)
        merged.setdefault(key, observation)
    return tuple(merged.values())
