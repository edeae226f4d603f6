"""Recording and serving metrics, off the request path.

`Recorder` (one Ray actor per serving job) owns the job's single `Reporter`, so every event of the run (logs,
metrics, session turns, the end) shares one sequence space. Replicas and routers never call it while a request
is open: they drop what they have to say into a `Shipper` (a bounded in-memory queue, O(1) per request) whose
thread sends it in batches, fire-and-forget, and checks later whether a batch arrived. So a recorder that is slow,
full or dead costs a response nothing; what was lost is counted (`serve/record_failures`), by the shipper when a
batch never reached the recorder (counted again in the next batch that does), by the recorder when a turn did not
make a valid `session_turn` event.

Every `metrics_seconds` the recorder reports, at a step counting the reports:
serve/requests (completions in the interval), serve/requests_total, serve/latency_p50_ms, serve/latency_p95_ms,
serve/tokens_per_second (completion tokens over the interval's wall time), serve/prompt_tokens_per_second,
serve/recorded_turns (total), serve/record_failures (total), serve/http_4xx and serve/http_5xx (totals the routers
counted), serve/ingest_errors (reporter flushes that failed; their events stay spooled for a retry).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from workers.reporting import IngestError, Reporter, configure_logging
from workers.spool import replay_spools, spool_dir

log = logging.getLogger("crucible.serve.recorder")

DEFAULT_METRICS_SECONDS = 10.0


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


class Recorder:
    """The serving job's reporter, as a Ray actor. `submit` takes batches from shippers; the driver reports its
    own logs and metrics through `log` / `metric` / `summary`, and ends the run with `close`."""

    def __init__(
        self,
        *,
        ingest_url: str,
        token: str,
        metrics_seconds: float = DEFAULT_METRICS_SECONDS,
        spool: bool = True,
    ) -> None:
        configure_logging()
        directory = spool_dir() if spool else None
        if directory is not None:
            threading.Thread(target=replay_spools, args=(directory,), name="crucible-spool-replay", daemon=True).start()
        outage = float(os.environ.get("CRUCIBLE_INGEST_OUTAGE_SECONDS", "900"))
        self.reporter = Reporter(ingest_url=ingest_url, token=token, spool_dir=directory, outage_seconds=outage)
        self.metrics_seconds = metrics_seconds
        self._lock = threading.Lock()
        self._latencies: list[float] = []
        self._completion_tokens = 0
        self._prompt_tokens = 0
        self._requests = 0
        self._totals: collections.Counter[str] = collections.Counter()
        self._step = 0
        self._interval_started = time.monotonic()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._report_periodically, name="crucible-serve-metrics", daemon=True)
        self._thread.start()

    def ready(self) -> bool:
        return True

    # --- from shippers -------------------------------------------------------------------------------------------
    def submit(
        self,
        turns: Sequence[Mapping[str, Any]],
        observations: Sequence[tuple[float, int, int]],
        counters: Mapping[str, int],
    ) -> int:
        """Record `turns` (each the fields of a `SessionTurnEvent`: session_id, task_type, token_id, turn) and
        account `observations` (latency ms, prompt tokens, completion tokens per completion) and `counters`
        (record_failures, http_4xx, http_5xx). Returns how many turns were recorded."""
        recorded = 0
        failed = 0
        for fields in turns:
            try:
                self.reporter.session_turn(**fields)
                recorded += 1
            except (ValueError, TypeError) as exc:
                failed += 1
                if self._totals["record_failures"] + failed <= 5:
                    log.warning("a session turn could not be recorded: %s", exc)
        with self._lock:
            for latency, prompt_tokens, completion_tokens in observations:
                self._latencies.append(float(latency))
                self._prompt_tokens += int(prompt_tokens)
                self._completion_tokens += int(completion_tokens)
            self._requests += len(observations)
            self._totals["requests_total"] += len(observations)
            self._totals["recorded_turns"] += recorded
            self._totals["record_failures"] += failed
            for name, value in counters.items():
                self._totals[name] += int(value)
        return recorded

    # --- from the driver -----------------------------------------------------------------------------------------
    def log(self, *lines: str) -> None:
        self.reporter.log(*lines)

    def metric(self, step: int, values: Mapping[str, float]) -> None:
        self.reporter.metric(step, values)

    def summary(self, data: Mapping[str, Any]) -> None:
        self.reporter.summary(data)

    def totals(self) -> dict[str, int]:
        with self._lock:
            return dict(self._totals)

    def flush_metrics(self) -> dict[str, float] | None:
        """Report the interval's metrics now (also what the periodic thread does); returns them, None when
        nothing happened since the last report."""

        now = time.monotonic()
        with self._lock:
            elapsed = max(now - self._interval_started, 1e-9)
            latencies, self._latencies = self._latencies, []
            completion, prompt, requests = self._completion_tokens, self._prompt_tokens, self._requests
            self._completion_tokens = self._prompt_tokens = self._requests = 0
            self._interval_started = now
            totals = dict(self._totals)
        try:
            self.reporter.flush()
        except IngestError as exc:
            with self._lock:
                self._totals["ingest_errors"] += 1
                totals["ingest_errors"] = self._totals["ingest_errors"]
            log.warning("ingest flush failed (%s); the events stay spooled", exc)
        if not requests and not any(totals.values()):
            return None
        values = {
            "serve/requests": float(requests),
            "serve/requests_total": float(totals.get("requests_total", 0)),
            "serve/tokens_per_second": completion / elapsed,
            "serve/prompt_tokens_per_second": prompt / elapsed,
            "serve/recorded_turns": float(totals.get("recorded_turns", 0)),
            "serve/record_failures": float(totals.get("record_failures", 0)),
            "serve/http_4xx": float(totals.get("http_4xx", 0)),
            "serve/http_5xx": float(totals.get("http_5xx", 0)),
            "serve/ingest_errors": float(totals.get("ingest_errors", 0)),
        }
        if latencies:
            values["serve/latency_p50_ms"] = percentile(latencies, 50)
            values["serve/latency_p95_ms"] = percentile(latencies, 95)
        self._step += 1
        self.reporter.metric(self._step, values)
        return values

    def _report_periodically(self) -> None:
        while not self._closed.wait(self.metrics_seconds):
            try:
                self.flush_metrics()
            except Exception:  # a metrics tick must never take the recorder down
                log.exception("serving metrics could not be reported")

    def close(self, outcome: str = "succeeded", error: str = "") -> dict[str, int]:
        """The last metrics, the end event, and every event delivered (or left in the spool); returns the totals."""
        self._closed.set()
        self._thread.join(timeout=5)
        try:
            self.flush_metrics()
        except Exception:
            log.exception("the last serving metrics could not be reported")
        self.reporter.end(outcome, error)
        self.reporter.close()
        return self.totals()


class Shipper:
    """A replica's or router's outbox to the `Recorder`: O(1) on the request path, batches sent by a thread.

    `recorder` is resolved lazily by `connect` (a callable returning the actor handle), so a replica starts even
    when the recorder is not up yet. At most `max_queue` turns wait; beyond that the oldest are dropped and
    counted as record failures."""

    def __init__(
        self,
        connect: Callable[[], Any],
        *,
        interval: float = 0.2,
        max_queue: int = 10_000,
        max_batch: int = 256,
        max_in_flight: int = 32,
    ) -> None:
        self._connect = connect
        self._recorder: Any = None
        self.interval = interval
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self._turns: collections.deque[dict[str, Any]] = collections.deque(maxlen=max_queue)
        self._observations: collections.deque[tuple[float, int, int]] = collections.deque(maxlen=max_queue)
        self._counters: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._in_flight: list[tuple[Any, int]] = []  # (ObjectRef of a submit, turns in it)
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="crucible-serve-shipper", daemon=True)
        self._thread.start()

    def turn(self, fields: dict[str, Any]) -> None:
        with self._lock:
            if len(self._turns) == self._turns.maxlen:
                self._counters["record_failures"] += 1  # the oldest is pushed out
            self._turns.append(fields)

    def observe(self, latency_ms: float, prompt_tokens: int, completion_tokens: int) -> None:
        self._observations.append((latency_ms, prompt_tokens, completion_tokens))

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counters[name] += n

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.ship()

    def ship(self) -> None:
        self._check_in_flight()
        while True:
            with self._lock:
                turns = [self._turns.popleft() for _ in range(min(self.max_batch, len(self._turns)))]
                observations = [self._observations.popleft() for _ in range(min(4096, len(self._observations)))]
                counters = dict(self._counters)
                self._counters.clear()
            if not turns and not observations and not counters:
                return
            if len(self._in_flight) >= self.max_in_flight:
                # The recorder is behind (its control plane away): keep the turns here, where the queue is bounded,
                # instead of piling calls (and their arguments) up in the object store.
                self._requeue(turns, observations, counters)
                return
            try:
                if self._recorder is None:
                    self._recorder = self._connect()
                ref = self._recorder.submit.remote(turns, observations, counters)
                self._in_flight.append((ref, len(turns)))
            except Exception as exc:  # the recorder is gone or not up yet: count, keep serving
                self._recorder = None
                self._lost(len(turns), counters, exc)
                return
            if len(turns) < self.max_batch:
                return

    def _requeue(
        self, turns: list[dict[str, Any]], observations: list[tuple[float, int, int]], counters: Mapping[str, int]
    ) -> None:
        with self._lock:
            room = (self._turns.maxlen or 0) - len(self._turns)
            kept = turns[-room:] if room > 0 else []
            self._counters["record_failures"] += len(turns) - len(kept)
            self._turns.extendleft(reversed(kept))
            self._observations.extendleft(reversed(observations))
            for name, value in counters.items():
                self._counters[name] += value

    def _check_in_flight(self) -> None:
        import ray

        if not self._in_flight:
            return
        refs = [ref for ref, _ in self._in_flight]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        finished = set(done)
        still: list[tuple[Any, int]] = []
        for ref, count in self._in_flight:
            if ref not in finished:
                still.append((ref, count))
                continue
            try:
                ray.get(ref)
            except Exception as exc:
                self._recorder = None
                self._lost(count, {}, exc)
        self._in_flight = still

    def _lost(self, turns: int, counters: Mapping[str, int], exc: Exception) -> None:
        self.failures += turns
        with self._lock:
            self._counters["record_failures"] += turns
            for name, value in counters.items():
                if name != "record_failures":
                    self._counters[name] += value
            self._counters["record_failures"] += counters.get("record_failures", 0)
        if turns:
            log.warning("%d session turns could not reach the recorder: %s", turns, exc)

    def close(self, timeout: float = 5.0) -> None:
        """Ship what is queued and wait (up to `timeout`) for the recorder to take it."""
        import ray

        self._stop.set()
        self._thread.join(timeout=timeout)
        self.ship()
        refs = [ref for ref, _ in self._in_flight]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=timeout)
        self._check_in_flight()
