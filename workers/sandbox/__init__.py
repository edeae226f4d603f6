"""A sandbox for untrusted, model-written Python code (coding environments, eval jobs).

    from workers.sandbox import SandboxLimits, run_python

    result = run_python(program, limits=SandboxLimits(wall_seconds=5, cpu_seconds=5))
    result.passed, result.outcome, result.detail, result.stdout
    result.observations      # what it ran into: limits, refused calls, leftovers, weaker modes

`runner` holds the public API and documents what the sandbox guarantees and the CRUCIBLE_SANDBOX_ISOLATION and
CRUCIBLE_SANDBOX_UIDS settings; `launcher` is the stdlib-only program that confines the child process before the
code runs; `monitor` reports, from inside the program's process, the calls the sandbox refused.
"""

from workers.sandbox.runner import (
    ISOLATION_ENV,
    Observation,
    Outcome,
    SandboxLimits,
    SandboxResult,
    isolation_mode,
    run_python,
)
from workers.sandbox.uids import UIDS_ENV, SandboxUnavailable, sandbox_uids

__all__ = [
    "ISOLATION_ENV",
    "UIDS_ENV",
    "Observation",
    "Outcome",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailable",
    "isolation_mode",
    "run_python",
    "sandbox_uids",
]
