"""The serving job (`python -m workers.jobs.serve`): an OpenAI-compatible endpoint on Ray Serve for a run's target.

Long-lived: it starts Serve and the run's applications (`workers.serving.controller.ServingController`), then polls
`<control_url>target/` every `poll_seconds`, deploying new arms, hot-swapping changed checkpoints and removing
arms, until the job is stopped. Ray's job stop sends SIGTERM: the loop ends, the Serve applications are deleted,
the run's last metrics and its end event ("succeeded": a stopped server did its job) are flushed. An error that
ends the loop ends the run as failed, with the applications deleted all the same.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import traceback
from types import FrameType

from workers.jobs.common import load_spec
from workers.reporting import configure_logging
from workers.serving.controller import ServingController
from workers.specs import ServeSpec

log = logging.getLogger("crucible.serve")


def run(spec: ServeSpec, stop: threading.Event | None = None) -> dict[str, int]:
    """Serve until `stop` is set (the job sets it on SIGTERM / SIGINT); returns the recorder's totals."""
    token = os.environ.get("CRUCIBLE_INGEST_TOKEN", "")
    if not token:
        raise SystemExit("CRUCIBLE_INGEST_TOKEN is not set: the run's ingest token is handed over by Crucible")
    stop = stop or threading.Event()
    controller = ServingController(spec, token)
    try:
        controller.start()
        if threading.current_thread() is threading.main_thread():
            _stop_on_signals(stop)  # after ray.init, which installs a SIGTERM handler that exits at once
        controller.run(stop.is_set)
    except BaseException as exc:
        error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        log.exception("serving failed")
        if controller.recorder is not None:
            controller.stop("failed", error)
        raise
    log.info("stopping: deleting the serve applications and flushing the run's events")
    return controller.stop("succeeded")


def _stop_on_signals(stop: threading.Event) -> None:
    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def main() -> None:
    configure_logging()
    spec = load_spec(ServeSpec)
    stop = threading.Event()
    _stop_on_signals(stop)
    totals = run(spec, stop)
    log.info(
        "served %d completions, recorded %d turns", totals.get("requests_total", 0), totals.get("recorded_turns", 0)
    )


if __name__ == "__main__":
    main()
