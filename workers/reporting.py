"""The worker side of ingest: a small client that numbers events and ships them in batches.

Events are numbered once, when they are created, so a batch that is retried after a timeout carries the same
sequence numbers and the control plane keeps exactly one copy. Batches flush when they reach `max_events` or
when `flush_seconds` have passed, so single events need no manual batching by the caller. A background thread
sends them: making an event never waits on the network.

Each event is checked against the wire schema when it is created (a NaN metric raises at the call that made it,
not minutes later on the server). Sends are serialised: one batch is in flight at a time, in seq order. A batch
the server refuses for good (a 4xx other than 413/429) is dropped with an error, never re-sent forever; a 413
splits the batch in halves.

Nothing is lost while the control plane is away (a restart, an outage of minutes):
- a failed send keeps its events pending with their numbers, and the background flusher keeps retrying; `close()`
  waits up to `outage_seconds` for the control plane to answer before it gives up;
- with a `spool_dir`, every event is appended to a spool file on disk as it is made and acknowledged there once
  the control plane has stored it. A driver killed before its events were acknowledged leaves its spool behind,
  and the next reporter started on the node replays it (`replay_spools`), with the same numbers, so the control
  plane keeps exactly one copy (the spool and its replay are in `workers.spool`). The spool is bounded
  (`max_spool_bytes`); past the bound events are kept in memory only, and the overflow is counted and logged.
- the last event a job sends is `end`, with the job's own outcome (see `workers.events.EndEvent`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError

from workers.events import EVENT
from workers.findings import Finding, Severity
from workers.spool import DEFAULT_MAX_SPOOL_BYTES, Spool

log = logging.getLogger(__name__)


def configure_logging() -> None:
    """A job's or a serving process's logging: INFO, without httpx's line per ingest request."""
    logging.basicConfig(level=logging.INFO)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per ingest request would drown the log


class IngestError(RuntimeError):
    pass


class _Transient(RuntimeError):
    """Every retry failed (network, 5xx, 429): keep the events for a later flush."""


class _TooLarge(RuntimeError):
    """413: split the batch."""


DEFAULT_OUTAGE_SECONDS = 900.0


class Reporter:
    def __init__(
        self,
        *,
        ingest_url: str,
        token: str,
        max_events: int = 1000,
        flush_seconds: float = 0.25,
        retries: int = 8,
        start_seq: int = 0,
        client: httpx.Client | None = None,
        spool_dir: Path | None = None,
        max_spool_bytes: int = DEFAULT_MAX_SPOOL_BYTES,
        outage_seconds: float = DEFAULT_OUTAGE_SECONDS,
        max_pending: int = 200_000,
    ) -> None:
        self.ingest_url = ingest_url
        self._headers = {"Authorization": f"Bearer {token}"}
        self.max_events = max_events
        self.flush_seconds = flush_seconds
        self.retries = retries
        self._seq = start_seq
        self._pending: list[dict[str, Any]] = []
        self._last_flush = time.monotonic()
        self._lock = threading.Lock()  # guards _seq and _pending
        self._send_lock = threading.Lock()  # one batch in flight at a time, in seq order
        self._client = client or httpx.Client(timeout=30.0)
        self.outage_seconds = outage_seconds
        self._spool = (
            Spool(spool_dir, ingest_url=ingest_url, token=token, max_bytes=max_spool_bytes) if spool_dir else None
        )
        self.max_pending = max_pending
        self._closed = threading.Event()
        self._wake = threading.Event()
        # A background flusher ships a lone event within `flush_seconds` even if the job goes quiet after it.
        self._flusher = threading.Thread(target=self._flush_periodically, name="crucible-reporter", daemon=True)
        self._flusher.start()

    def _flush_periodically(self) -> None:
        while not self._closed.is_set():
            self._wake.wait(self.flush_seconds)
            self._wake.clear()
            if self._closed.is_set():
                break
            try:
                self.flush()
            except IngestError:
                log.exception("background flush failed; events stay unsent")

    # --- event constructors -------------------------------------------------------------------------------
    def _add(self, kind: str, **fields: Any) -> int:
        event = {"kind": kind, "time": time.time(), **fields}
        try:
            EVENT.validate_python({"seq": 1, **event})
        except ValidationError as exc:
            raise ValueError(f"invalid {kind} event: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from exc
        with self._lock:
            self._seq += 1
            seq = self._seq
            numbered = {"seq": seq, **event}
            self._pending.append(numbered)
            if self._spool is not None:
                self._spool.add(numbered)
            backlog = len(self._pending)
            due = backlog >= self.max_events or time.monotonic() - self._last_flush >= self.flush_seconds
        if due:
            # The flusher sends; the job never waits on the network (a control plane that hangs or is away costs
            # it nothing) until the backlog reaches `max_pending`, the memory bound.
            self._wake.set()
        if backlog >= self.max_pending:
            self._wait_for_backlog()
        return seq

    def _wait_for_backlog(self) -> None:
        log.warning("%d events wait for the control plane; the job pauses until it takes some", self.max_pending)
        while not self._closed.is_set():
            with self._lock:
                if len(self._pending) < self.max_pending:
                    return
            self._wake.set()
            time.sleep(0.5)

    def metric(self, step: int, values: Mapping[str, float]) -> int:
        return self._add("metric", step=step, values=dict(values))

    def log(self, *lines: str) -> int:
        return self._add("log", lines=list(lines))

    def progress(self, done: int, total: int, phase: str = "") -> int:
        """`phase` (workers.events.PHASES), when given, tells the stall watchdog which limit applies from now."""
        return self._add("progress", done=done, total=total, phase=phase)

    def trajectory(self, **fields: Any) -> int:
        return self._add("trajectory", **fields)

    def histogram(self, name: str, edges: list[float], counts: list[int]) -> int:
        return self._add("histogram", name=name, edges=edges, counts=counts)

    def artifact(self, name: str, uri: str, size_bytes: int = 0, meta: Mapping[str, Any] | None = None) -> int:
        return self._add("artifact", name=name, uri=uri, size_bytes=size_bytes, meta=dict(meta or {}))

    def checkpoint(self, step: int, uri: str, metrics: Mapping[str, float] | None = None) -> int:
        return self._add("checkpoint", step=step, uri=uri, metrics=dict(metrics or {}))

    def task_result(self, **fields: Any) -> int:
        return self._add("task_result", **fields)

    def session_turn(self, **fields: Any) -> int:
        """One served completion as a turn of its client's session (workers.events.SessionTurnEvent)."""
        return self._add("session_turn", **fields)

    def flag(
        self,
        *,
        trajectory_id: str,
        detector: str,
        detector_version: str,
        severity: Severity,
        evidence: Mapping[str, Any],
        step: int = 0,
    ) -> int:
        """A detector's flag on one trajectory (`workers.events.FlagEvent`); send it after the trajectory's own
        event so the control plane can link the two."""
        return self._add(
            "flag",
            trajectory_id=trajectory_id,
            detector=detector,
            detector_version=detector_version,
            severity=severity,
            evidence=dict(evidence),
            step=step,
        )

    def summary(self, data: Mapping[str, Any]) -> int:
        return self._add("summary", data=dict(data))

    # --- shipping -------------------------------------------------------------------------------------------
    def flush(self) -> None:
        """Send everything pending, in chunks of at most `max_events`. On a transient failure (network, 5xx, 429
        after every retry) the unsent events stay pending with their seq numbers and IngestError is raised."""
        with self._send_lock:
            with self._lock:
                batch, self._pending = self._pending, []
                self._last_flush = time.monotonic()
                if self._spool is not None and batch:
                    self._spool.sync()
            refused: list[str] = []
            for start in range(0, len(batch), self.max_events):
                chunk = batch[start : start + self.max_events]
                try:
                    refused += self._send_splitting(chunk)
                except _Transient as exc:
                    # Re-sending a chunk the server partly stored is harmless: its seqs make it idempotent.
                    with self._lock:
                        self._pending = batch[start:] + self._pending
                    raise IngestError(str(exc)) from None
                self._acknowledge(chunk, more=start + self.max_events < len(batch))
            if refused:
                raise IngestError("; ".join(refused))

    def _acknowledge(self, chunk: list[dict[str, Any]], *, more: bool) -> None:
        """The control plane has these (or refused them for good): mark them in the spool; restart the spool
        from empty when nothing is pending any more and no chunk of this batch is still to go (`more`), so it
        stays the size of the backlog, not of the run."""
        if self._spool is None:
            return
        with self._lock:
            if self._pending or more:
                self._spool.ack([event["seq"] for event in chunk])
            else:
                self._spool.reset()

    @property
    def spool_overflowed(self) -> int:
        return self._spool.overflowed if self._spool is not None else 0

    def _send_splitting(self, batch: list[dict[str, Any]]) -> list[str]:
        """Send, halving on 413. Returns why any part was refused for good (those events are dropped)."""
        try:
            self._send(batch)
        except _TooLarge:
            if len(batch) == 1:
                return [f"event {batch[0]['seq']} alone is over the server's size limit and was dropped"]
            half = len(batch) // 2
            return self._send_splitting(batch[:half]) + self._send_splitting(batch[half:])
        except IngestError as exc:
            return [str(exc)]
        return []

    def _send(self, batch: list[dict[str, Any]]) -> None:
        delay = 0.2
        for attempt in range(self.retries + 1):
            try:
                response = self._client.post(self.ingest_url, json={"events": batch}, headers=self._headers)
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code < 300:
                    return
                if response.status_code == 413:
                    raise _TooLarge()
                if response.status_code < 500 and response.status_code != 429:
                    # Refused for good (bad token, run gone, invalid event): re-sending cannot help.
                    log.error(
                        "ingest refused %d events (%d): %s", len(batch), response.status_code, response.text[:500]
                    )
                    raise IngestError(f"ingest refused the batch ({response.status_code}): {response.text[:500]}")
                error = f"HTTP {response.status_code}"
            log.warning("ingest attempt %d failed (%s); retrying in %.1fs", attempt + 1, error, delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
        raise _Transient(f"ingest failed after {self.retries + 1} attempts")

    def end(self, outcome: str, error: str = "") -> int:
        """The job's own outcome, as its last event (`close` sends it when used as a context manager)."""
        return self._add("end", outcome=outcome, error=error[-2000:])

    def close(self) -> None:
        """Deliver everything. While the control plane does not answer, keep trying for `outage_seconds` since
        the last failure began; then raise IngestError, leaving the events in the spool for a later replay."""
        self._closed.set()
        self._wake.set()
        self._flusher.join()  # it finishes its current send (bounded by the retries), then stops
        deadline = time.monotonic() + self.outage_seconds
        while True:
            try:
                self.flush()
                break
            except IngestError as exc:
                if not self._pending or time.monotonic() >= deadline:
                    self._client.close()
                    if self._spool is not None:
                        self._spool.release()
                    raise
                log.warning("control plane unreachable at close (%s); still trying", exc)
                time.sleep(1.0)
        self._client.close()
        if self._spool is not None:
            self._spool.remove()

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        failed = exc_type is not None and not (isinstance(exc, SystemExit) and exc.code in (0, None))
        try:
            self.end("failed" if failed else "succeeded", f"{exc_type.__name__}: {exc}" if failed and exc_type else "")
        except ValueError:
            pass
        self.close()


def report_flags(reporter: Reporter, findings: Iterable[Finding], *, step: int) -> int:
    """Send each trajectory finding as a `flag` event at `step`; returns how many were sent. Run-scope findings
    (no trajectory) are left out: a flag names a trajectory."""
    sent = 0
    for finding in findings:
        if finding.trajectory_id:
            reporter.flag(
                trajectory_id=finding.trajectory_id,
                detector=finding.detector,
                detector_version=finding.version,
                severity=finding.severity,
                evidence=finding.evidence,
                step=step,
            )
            sent += 1
    return sent
