"""The worker side of ingest: a small client that numbers events and ships them in batches.

Events are numbered once, when they are created, so a batch that is retried after a timeout carries the same
sequence numbers and the control plane keeps exactly one copy. Batches flush when they reach `max_events` or
when `flush_seconds` have passed, so single events need no manual batching by the caller.

Each event is checked against the wire schema when it is created (a NaN metric raises at the call that made it,
not minutes later on the server). Sends are serialised: one batch is in flight at a time, in seq order. A batch
the server refuses for good (a 4xx other than 413/429) is dropped with an error, never re-sent forever; a 413
splits the batch in halves.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import httpx
from pydantic import ValidationError

from workers.detectors.base import Severity
from workers.events import EVENT

log = logging.getLogger(__name__)


class IngestError(RuntimeError):
    pass


class _Transient(RuntimeError):
    """Every retry failed (network, 5xx, 429): keep the events for a later flush."""


class _TooLarge(RuntimeError):
    """413: split the batch."""


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
        self._closed = threading.Event()
        # A background flusher ships a lone event within `flush_seconds` even if the job goes quiet after it.
        self._flusher = threading.Thread(target=self._flush_periodically, name="crucible-reporter", daemon=True)
        self._flusher.start()

    def _flush_periodically(self) -> None:
        while not self._closed.wait(self.flush_seconds):
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
            self._pending.append({"seq": seq, **event})
            due = len(self._pending) >= self.max_events or time.monotonic() - self._last_flush >= self.flush_seconds
        if due:
            self.flush()
        return seq

    def metric(self, step: int, values: Mapping[str, float]) -> int:
        return self._add("metric", step=step, values=dict(values))

    def log(self, *lines: str) -> int:
        return self._add("log", lines=list(lines))

    def progress(self, done: int, total: int) -> int:
        return self._add("progress", done=done, total=total)

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
            refused: list[str] = []
            for start in range(0, len(batch), self.max_events):
                try:
                    refused += self._send_splitting(batch[start : start + self.max_events])
                except _Transient as exc:
                    # Re-sending a chunk the server partly stored is harmless: its seqs make it idempotent.
                    with self._lock:
                        self._pending = batch[start:] + self._pending
                    raise IngestError(str(exc)) from None
            if refused:
                raise IngestError("; ".join(refused))

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

    def close(self) -> None:
        self._closed.set()
        self._flusher.join()  # it finishes its current send (bounded by the retries), then stops
        self.flush()
        self._client.close()

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
