"""A sandbox for untrusted, model-written Python code (coding environments, eval jobs).

    from workers.sandbox import SandboxLimits, run_python

    result = run_python(program, limits=SandboxLimits(wall_seconds=5, cpu_seconds=5))
    result.passed, result.outcome, result.detail, result.stdout

`runner` holds the public API and documents what the sandbox guarantees and the CRUCIBLE_SANDBOX_ISOLATION
setting; `launcher` is the stdlib-only program that confines the child process before the code runs.
"""

from workers.sandbox.runner import (
    ISOLATION_ENV,
    Outcome,
    SandboxLimits,
    SandboxResult,
    SandboxUnavailable,
    isolation_mode,
    run_python,
)

__all__ = [
    "ISOLATION_ENV",
    "Outcome",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailable",
    "isolation_mode",
    "run_python",
]
