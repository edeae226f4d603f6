"""Benchmarks on a shared machine: refuse to time anything while it is busy, unless told.

Every timing benchmark calls `add_load_guard(parser)` before parsing its arguments and `load_guard(args)` after:
when the 1-minute load average per core is above `--max-load` (default `CRUCIBLE_BENCH_MAX_LOAD`, else 1.0), it
prints the load, what to do, and exits with status 3 before measuring; `--noisy` measures anyway (the load average
goes into the printed figures, as every benchmark here records it). The sides of a comparison still run in
alternating rounds with the median and spread reported: this guard keeps a busy machine from producing a figure
that looks like a quiet one's."""

from __future__ import annotations

import argparse
import os
import sys

DEFAULT_MAX_LOAD = float(os.environ.get("CRUCIBLE_BENCH_MAX_LOAD", "1.0"))


def add_load_guard(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-load",
        type=float,
        default=DEFAULT_MAX_LOAD,
        help="refuse to measure when the 1-minute load average per core is above this (env CRUCIBLE_BENCH_MAX_LOAD)",
    )
    parser.add_argument("--noisy", action="store_true", help="measure even above --max-load (the load is recorded)")


def load_guard(args: argparse.Namespace) -> tuple[float, float, float]:
    """The load average now; exits with status 3 when it is above the threshold and --noisy was not given."""
    load = os.getloadavg()
    cores = os.cpu_count() or 1
    if load[0] / cores > args.max_load and not args.noisy:
        print(
            f"refusing to measure: load average {load[0]:.2f} on {cores} cores is {load[0] / cores:.2f} per core, "
            f"above --max-load {args.max_load}. Stop what else runs here (other benchmarks, test suites) and try "
            "again, or pass --noisy to measure anyway (the figures then record the load).",
            file=sys.stderr,
        )
        sys.exit(3)
    return load
