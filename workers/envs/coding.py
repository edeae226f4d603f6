"""The coding environment: the policy writes a Python function; its tests run in the sandbox.

A task row (HumanEval's shape, `workers.benchmarks.humaneval`) holds
- `prompt`: what the policy reads (an instruction wrapping the code prompt),
- `code_prompt`: the function's signature and docstring, with the imports and helpers it needs,
- `test`: code defining `check(candidate)`, which asserts on the candidate's behaviour,
- `entry_point`: the function's name.

One reply ends the episode (Composer's outcome reward: did the tests pass). The code is the last fenced block
that defines `entry_point` (else the first fenced block, else the whole reply). A block that defines the
function runs after `code_prompt`, so the prompt's imports and helpers stay in scope and the model's definition
replaces the stub; a block that does not is taken as the body that continues `code_prompt` (a completion, as
HumanEval's own harness runs it). Then `test` and `check(entry_point)` run, all in `workers.sandbox`: no network,
a private directory, CPU, memory, process and wall-time limits.

`tests_passed` is 1.0 when the program exits cleanly, else 0.0. A timeout, a memory blow-up or a crash is
recorded as such in the trajectory's `sandbox` field and never counts as a pass; a sandbox that could not start
at all is an infrastructure error (the trajectory's `error`), not the model's fault.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from workers.envs.base import Environment, StepResult, Task, TaskFieldError
from workers.envs.toolcalls import json_kind
from workers.sandbox.runner import Outcome, SandboxLimits, run_python

if TYPE_CHECKING:
    from workers.sandbox.runner import SandboxLimits

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_STDERR_KEPT = 2000


def extract_code(reply: str, entry_point: str) -> tuple[str, bool]:
    """The code in a reply and whether it defines `entry_point` itself (see the module docstring)."""
    blocks = _FENCE.findall(reply)
    defines = re.compile(rf"^\s*(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", re.MULTILINE)
    for block in reversed(blocks):
        if defines.search(block):
            return block, True
    if blocks:
        code = blocks[0]
    else:
        # A reply cut off by max_new_tokens leaves its fence open: take what follows the opening fence.
        opened = re.search(r"```[ \t]*(?:python3?|py)?[ \t]*\n", reply, re.IGNORECASE)
        code = reply[opened.end() :] if opened else reply
    return code, bool(defines.search(code))


# The sentinel guards against the oldest HumanEval hack: `sys.exit(0)` (or `os._exit(0)`) in the submitted code ends
# the process cleanly before a single assert runs. The harness reads a nonce from stdin before the model's code
# runs and prints it only after `check` returns; a clean exit without it is a failure. (Code in the same process
# could still dig the nonce out of the interpreter; this stops the accidental and the lazy hack, not a determined
# one. The sandbox bounds what a determined one can do.)
_HEADER = "def _crucible_done(_nonce=__import__('sys').stdin.readline().strip()):\n    print(_nonce, flush=True)\n\n\n"


def build_program(code_prompt: str, test: str, entry_point: str, reply: str) -> str:
    """The program the sandbox runs for one reply: the sentinel, the prompt, the model's code, the tests, the
    check call and the sentinel's print (send the nonce on stdin)."""
    code, defines = extract_code(reply, entry_point)
    # A full definition follows the stub (and replaces it); a completion continues the stub's body.
    body = f"{code_prompt}\n\n{code}" if defines else f"{code_prompt}{code}"
    return f"{_HEADER}{body}\n\n\n{test}\n\ncheck({entry_point})\n_crucible_done()\n"


class CodingEnv(Environment):
    name: ClassVar[str] = "coding"
    description: ClassVar[str] = (
        "Write a Python function; its unit tests run in the sandbox (HumanEval format: prompt, code_prompt, test, "
        "entry_point). Reward field: tests_passed."
    )
    required_task_fields: ClassVar[frozenset[str]] = frozenset({"id", "prompt", "code_prompt", "test", "entry_point"})
    produces: ClassVar[frozenset[str]] = frozenset({"turns", "tests_passed"})
    score_field: ClassVar[str] = "tests_passed"
    default_metric: ClassVar[str] = "pass@1"

    @classmethod
    def eval_reward(cls) -> dict[str, Any]:
        """A coding attempt is as good as the tests it passes; there is no answer text to match."""
        return {"terms": [{"type": "tests_passed"}]}

    def __init__(
        self,
        *,
        max_turns: int = 1,
        system_prompt: str | None = None,
        timeout_seconds: float = 10.0,
        memory_mb: int = 512,
        max_processes: int = 16,
    ) -> None:
        super().__init__(max_turns=max_turns, system_prompt=system_prompt)
        for name, value, low in (("timeout_seconds", timeout_seconds, 0.1), ("memory_mb", memory_mb, 32)):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < low:
                raise ValueError(f"{name} must be a number >= {low}, got {value!r}")
        if isinstance(max_processes, bool) or not isinstance(max_processes, int) or max_processes < 1:
            raise ValueError(f"max_processes must be an integer >= 1, got {max_processes!r}")

        self.limits: SandboxLimits = SandboxLimits(
            wall_seconds=float(timeout_seconds),
            cpu_seconds=max(1, int(timeout_seconds + 0.999)),
            memory_bytes=int(memory_mb) * 1024 * 1024,
            max_processes=max_processes,
        )
        self._sandbox: dict[str, Any] | None = None
        self._tests_passed: float | None = None

    @classmethod
    def validate_task_row(cls, row: object, *, index: int | None = None) -> Task:
        task = super().validate_task_row(row, index=index)
        where = f"task row {index}" if index is not None else "task row"
        for name in ("code_prompt", "test", "entry_point"):
            value = task.metadata.get(name)
            if not isinstance(value, str) or not value.strip():
                raise TaskFieldError(
                    f"{where}: field '{name}' must be non-blank text, got {json_kind(value)}",
                    field=name,
                    environment=cls.name,
                )
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", task.metadata["entry_point"]):
            raise TaskFieldError(
                f"{where}: field 'entry_point' must be a Python identifier, got {task.metadata['entry_point']!r}",
                field="entry_point",
                environment=cls.name,
            )
        return task

    def _clear(self) -> None:
        super()._clear()
        self._sandbox = None
        self._tests_passed = None

    def step(self, action_text: str) -> StepResult:
        self._begin_step(action_text)
        self._turns.append({"role": "assistant", "content": action_text})

        meta = self.task.metadata
        program = build_program(meta["code_prompt"], meta["test"], meta["entry_point"], action_text)
        nonce = secrets.token_hex(16)
        result = run_python(program, limits=self.limits, stdin=nonce + "\n")
        outcome, detail = result.outcome, result.detail
        completed = result.passed and nonce in result.stdout
        if result.passed and not completed:
            outcome, detail = (
                Outcome.FAILED,
                (
                    f"printed more than {self.limits.max_output_bytes} bytes, so the completion marker was cut off"
                    if result.truncated
                    else "exited cleanly before its tests finished (sys.exit or os._exit?)"
                ),
            )
        self._sandbox = {
            "outcome": str(outcome),
            "detail": detail,
            "exit_code": result.exit_code,
            "signal": result.signal,
            "wall_seconds": round(result.wall_seconds, 3),
            "stderr": result.stderr[-_STDERR_KEPT:],
            "isolation": result.isolation,
            "observations": [observation.as_dict() for observation in result.observations],
        }
        error = None
        if result.outcome is Outcome.ERROR:
            # The sandbox never ran the code: an infrastructure failure, not a failing answer.
            error = f"sandbox error: {result.detail}"
        self._tests_passed = 1.0 if completed else 0.0
        self._finish(answer=None, error=error)
        return StepResult(None, True, self._info(tests_passed=self._tests_passed, sandbox=str(result.outcome)))

    def gold_answers(self) -> list[str]:
        return []

    def trajectory_fields(self) -> dict[str, Any]:
        return {"tests_passed": self._tests_passed, "sandbox": self._sandbox}

    def episode_metrics(self, record: Mapping[str, Any]) -> dict[str, float]:
        sandbox = record.get("sandbox") or {}
        outcome = sandbox.get("outcome", "")
        return {
            "tests_passed": float(record.get("tests_passed") or 0.0),
            "sandbox_timeout": 1.0 if outcome == "timeout" else 0.0,
            "sandbox_memory": 1.0 if outcome == "memory" else 0.0,
            "sandbox_error": 1.0 if outcome == "error" else 0.0,
        }
