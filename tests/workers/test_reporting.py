from __future__ import annotations

import json

import httpx
import pytest

from workers.reporting import IngestError, Reporter


def _reporter(handler, **kwargs):  # type: ignore[no-untyped-def]
    client = httpx.Client(transport=httpx.MockTransport(handler))
    return Reporter(
        ingest_url="http://cp/api/v1/runs/1/ingest/", token="cri_x", client=client, flush_seconds=60, **kwargs
    )


def test_events_are_numbered_once_and_a_retried_batch_carries_the_same_numbers():
    bodies: list[list[int]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append([e["seq"] for e in json.loads(request.content)["events"]])
        assert request.headers["Authorization"] == "Bearer cri_x"
        return httpx.Response(503 if len(bodies) == 1 else 200, json={})

    reporter = _reporter(handler, retries=2)
    reporter.metric(1, {"loss": 0.5})
    reporter.log("a", "b")
    reporter.progress(1, 10)
    reporter.close()
    assert bodies == [[1, 2, 3], [1, 2, 3]]


def test_a_full_batch_flushes_without_being_asked():
    sizes: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sizes.append(len(json.loads(request.content)["events"]))
        return httpx.Response(200, json={})

    reporter = _reporter(handler, max_events=5)
    for step in range(12):
        reporter.metric(step, {"x": float(step)})
    assert sizes == [5, 5]
    reporter.close()
    assert sizes == [5, 5, 2]


def test_a_refused_batch_raises_and_keeps_its_events_for_a_later_flush():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(403, json={"detail": "not this run's token"})

    reporter = _reporter(handler)
    reporter.log("x")
    with pytest.raises(IngestError, match="403"):
        reporter.flush()
    assert [e["seq"] for e in reporter._pending] == [1]
