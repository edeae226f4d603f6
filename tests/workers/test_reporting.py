from __future__ import annotations

import json
import time

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
    deadline = time.monotonic() + 10
    while sum(sizes) < 10 and time.monotonic() < deadline:  # the flusher sends full batches, not close()
        time.sleep(0.01)
    assert sum(sizes) >= 10 and all(size <= 5 for size in sizes)
    reporter.close()
    assert sum(sizes) == 12 and all(size <= 5 for size in sizes)


def test_making_an_event_never_waits_on_a_control_plane_that_hangs():
    """The server holds every request until the job has made all its events: were making an event to wait on the
    network, this would never finish (pytest-timeout would fail it), not merely be slow."""
    import threading

    release = threading.Event()
    received: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        release.wait()  # a stopped server: the connection is accepted, the answer never comes
        received.extend(e["seq"] for e in json.loads(request.content)["events"])
        return httpx.Response(200, json={})

    reporter = _reporter(handler, max_events=2)
    for step in range(50):
        reporter.metric(step, {"x": 1.0})
    assert received == []  # all 50 made while the first send still hangs
    release.set()
    reporter.close()
    assert sorted(received) == list(range(1, 51))


def test_a_refused_batch_raises_and_is_not_sent_again():
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(len(json.loads(request.content)["events"]))
        return httpx.Response(403, json={"detail": "not this run's token"})

    reporter = _reporter(handler)
    reporter.log("x")
    with pytest.raises(IngestError, match="403"):
        reporter.flush()
    assert reporter._pending == []
    reporter.flush()  # nothing left to send
    assert calls == [1]
    reporter.close()


def test_a_transient_failure_keeps_the_events_with_their_numbers_for_a_later_flush():
    answers = iter([503, 503, 200])
    bodies: list[list[int]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append([e["seq"] for e in json.loads(request.content)["events"]])
        return httpx.Response(next(answers), json={})

    reporter = _reporter(handler, retries=1)
    reporter.log("x")
    reporter.log("y")
    with pytest.raises(IngestError, match="after 2 attempts"):
        reporter.flush()
    assert [e["seq"] for e in reporter._pending] == [1, 2]
    reporter.close()
    assert bodies == [[1, 2], [1, 2], [1, 2]]


def test_a_batch_over_the_size_limit_is_split_until_the_server_takes_it():
    accepted: list[list[int]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seqs = [e["seq"] for e in json.loads(request.content)["events"]]
        if len(seqs) > 2:
            return httpx.Response(413, json={"detail": "too large"})
        accepted.append(seqs)
        return httpx.Response(200, json={})

    reporter = _reporter(handler)
    for step in range(5):
        reporter.metric(step, {"x": 1.0})
    reporter.close()
    assert sorted(s for chunk in accepted for s in chunk) == [1, 2, 3, 4, 5]
    assert all(len(chunk) <= 2 for chunk in accepted)


def test_an_invalid_event_raises_where_it_is_made_and_takes_no_number():
    reporter = _reporter(lambda request: httpx.Response(200, json={}))
    with pytest.raises(ValueError, match="metric"):
        reporter.metric(1, {"loss": float("nan")})
    with pytest.raises(ValueError, match="progress"):
        reporter.progress(-1, 10)
    assert reporter.log("fine") == 1
    reporter.close()


def test_close_delivers_every_event_once_and_in_order_while_the_flusher_is_busy():
    import threading

    seen: list[int] = []
    gate = threading.Event()

    def handler(request: httpx.Request) -> httpx.Response:
        gate.wait(0.2)  # a slow server: the background flush is still in flight when close() runs
        seen.extend(e["seq"] for e in json.loads(request.content)["events"])
        return httpx.Response(200, json={})

    client = httpx.Client(transport=httpx.MockTransport(handler))
    reporter = Reporter(ingest_url="http://cp/x/", token="t", client=client, flush_seconds=0.01)
    for i in range(50):
        reporter.log(str(i))
    reporter.close()
    assert seen == list(range(1, 51))


def test_findings_are_sent_as_flag_events_after_their_trajectory():
    from workers.detectors import Finding
    from workers.reporting import report_flags

    events: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        events.extend(json.loads(request.content)["events"])
        return httpx.Response(200, json={})

    reporter = _reporter(handler)
    reporter.trajectory(trajectory_id="s2-t1", step=2, reward=0.5)
    evidence = {"turn": 3, "span": [0, 12], "excerpt": "error: boom", "value": 1, "threshold": 1}
    findings = [
        Finding("malformed_tool_calls", "1", "high", evidence, "s2-t1"),
        Finding("reward_eval_divergence", "1", "medium", {}, None),  # run scope: no trajectory, not a flag event
    ]
    assert report_flags(reporter, findings, step=2) == 1
    reporter.close()
    assert [e["kind"] for e in events] == ["trajectory", "flag"]
    flag = {k: v for k, v in events[1].items() if k != "time"}
    assert flag == {
        "seq": 2,
        "kind": "flag",
        "trajectory_id": "s2-t1",
        "detector": "malformed_tool_calls",
        "detector_version": "1",
        "severity": "high",
        "evidence": evidence,
        "step": 2,
    }


def test_a_flag_with_an_unknown_severity_raises_where_it_is_made():
    reporter = _reporter(lambda request: httpx.Response(200, json={}))
    with pytest.raises(ValueError, match="invalid flag event.*severity"):
        reporter.flag(trajectory_id="t", detector="d", detector_version="1", severity="critical", evidence={})
    reporter.close()
