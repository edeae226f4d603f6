"""Simulated users (`python -m workers.jobs.simulate`, kind `simulate`): coding sessions played against a serving
run through the `openai` client, with the feedback an editor plug-in would post (workers.simulator).

The job authenticates with its own run token (CRUCIBLE_INGEST_TOKEN): it is the serving key it sends (the serving
run accepts the ingest token of an active simulate run that targets it) and the credential of its feedback posts.
A 401/403 from either side fails the run with the reason; every other serving or feedback error is counted against
its session (`sim/errors`) and the simulation goes on.
"""

from __future__ import annotations

import os
from typing import Any

from workers.jobs.common import load_spec, reporter_for
from workers.reporting import configure_logging
from workers.simulator.runner import SimulationStopped, simulate
from workers.specs import SimulateSpec


def run(spec: SimulateSpec) -> dict[str, Any]:
    with reporter_for(spec) as reporter:
        token = os.environ.get("CRUCIBLE_INGEST_TOKEN", "")
        try:
            summary = simulate(spec, token=token, reporter=reporter)
        except SimulationStopped as exc:
            reporter.summary(exc.summary)
            raise SystemExit(f"simulation stopped: {exc}") from None
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
        reporter.summary(summary)
    return summary


def main() -> None:
    configure_logging()
    run(load_spec(SimulateSpec))


if __name__ == "__main__":
    main()
