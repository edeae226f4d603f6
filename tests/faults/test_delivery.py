"""No event is lost when the control plane is away or the job is killed: the reporter's spool and its replay, the
worker's own `end` event, and events that arrive after their run ended (stored once, counted as late)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import httpx
import pytest

from workers.reporting import IngestError, Reporter
from workers.spool import replay_spools

URL = "http://cp/api/v1/runs/7/ingest/"


class Server:
    """A control plane that stores each (seq) once and can be taken down."""

    def __init__(self) -> None:
        self.up = True
        self.stored: dict[int, dict] = {}  # type: ignore[type-arg]
        self.requests = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        if not self.up:
            raise httpx.ConnectError("connection refused")
        assert request.headers["Authorization"] == "Bearer cri_t"
        for event in json.loads(request.content)["events"]:
            self.stored.setdefault(event["seq"], event)
        return httpx.Response(200, json={})

    def client(self) -> httpx.Client:
        return httpx.Client(transport=httpx.MockTransport(self))


def _offline(client: httpx.Client, **kwargs) -> Reporter:  # type: ignore[no-untyped-def]
    """A reporter that gives up a send at the first failure (retries=0) and flushes only when told."""
    return Reporter(ingest_url=URL, token="cri_t", client=client, flush_seconds=60, retries=0, **kwargs)


def test_an_outage_loses_nothing_and_close_waits_for_the_control_plane(tmp_path):
    server = Server()
    server.up = False
    reporter = _offline(server.client(), spool_dir=tmp_path)
    for step in range(30):
        reporter.metric(step, {"loss": 1.0 / (step + 1)})
    with pytest.raises(IngestError):
        reporter.flush()
    assert len(reporter._pending) == 30  # kept, with their numbers
    spooled = list(tmp_path.glob("*.jsonl"))
    assert len(spooled) == 1 and len(spooled[0].read_text().splitlines()) == 31  # header + 30 events
    server.up = True
    reporter.close()
    assert sorted(server.stored) == list(range(1, 31))
    assert not list(tmp_path.iterdir())  # everything acknowledged: the spool is gone


def test_close_gives_up_after_the_outage_window_and_leaves_the_spool_for_a_replay(tmp_path):
    server = Server()
    server.up = False
    reporter = _offline(server.client(), spool_dir=tmp_path, outage_seconds=0.0)
    reporter.log("a")
    reporter.log("b")
    with pytest.raises(IngestError):
        reporter.close()
    assert len(list(tmp_path.glob("*.jsonl"))) == 1
    server.up = True
    counts = replay_spools(tmp_path, client=server.client())
    assert counts == {"files": 1, "events": 2, "left": 0}
    assert sorted(server.stored) == [1, 2] and not list(tmp_path.iterdir())


def test_a_killed_driver_leaves_its_unacknowledged_events_and_the_next_reporter_replays_them_once(tmp_path):
    """A real process made events, had some acknowledged, and was SIGKILLed before the rest went out."""
    script = textwrap.dedent(
        f"""
        import json, os, signal, sys, httpx
        sys.path.insert(0, {os.getcwd()!r})
        from workers.reporting import Reporter
        stored = []
        def handler(request):
            stored.extend(e["seq"] for e in json.loads(request.content)["events"])
            return httpx.Response(200, json={{}})
        client = httpx.Client(transport=httpx.MockTransport(handler))
        reporter = Reporter(ingest_url={URL!r}, token="cri_t", client=client, flush_seconds=60,
                            spool_dir=__import__("pathlib").Path({str(tmp_path)!r}))
        for i in range(10):
            reporter.log(f"line {{i}}")
        reporter.flush()          # 1..10 acknowledged
        for i in range(10, 25):
            reporter.log(f"line {{i}}")  # 11..25 made, never sent
        reporter._spool.sync()
        print(json.dumps(stored), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert json.loads(proc.stdout) == list(range(1, 11))
    server = Server()
    counts = replay_spools(tmp_path, client=server.client())
    assert counts["events"] == 15 and sorted(server.stored) == list(range(11, 26))
    assert [server.stored[11]["lines"]] == [["line 10"]]


def test_a_live_reporters_spool_is_never_replayed_under_it(tmp_path):
    server = Server()
    reporter = Reporter(ingest_url=URL, token="cri_t", client=server.client(), flush_seconds=60, spool_dir=tmp_path)
    reporter.log("pending")
    assert replay_spools(tmp_path, client=server.client()) == {"files": 1, "events": 0, "left": 1}
    assert server.stored == {}
    reporter.close()
    assert list(server.stored) == [1]


def test_a_spool_the_control_plane_refuses_for_good_is_removed(tmp_path):
    (tmp_path / "x.jsonl").write_text(
        json.dumps({"ingest_url": URL, "token": "cri_t"}) + "\n" + json.dumps({"seq": 1, "kind": "log", "lines": ["a"]})
    )
    client = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(404, json={"detail": "no run"})))
    assert replay_spools(tmp_path, client=client)["left"] == 0
    assert not list(tmp_path.iterdir())


def test_the_spool_is_bounded_and_counts_what_it_could_not_hold(tmp_path):
    server = Server()
    server.up = False
    reporter = _offline(server.client(), spool_dir=tmp_path, max_spool_bytes=600)
    for i in range(20):
        reporter.log(f"line {i}")
    assert 0 < reporter.spool_overflowed < 20
    server.up = True
    reporter.close()
    assert sorted(server.stored) == list(range(1, 21))  # memory still had them all


def test_the_context_manager_sends_the_jobs_own_outcome_last():
    server = Server()
    with Reporter(ingest_url=URL, token="cri_t", client=server.client(), flush_seconds=60) as reporter:
        reporter.log("work")
    assert server.stored[2]["kind"] == "end" and server.stored[2]["outcome"] == "succeeded"

    failed = Server()
    with pytest.raises(RuntimeError), Reporter(ingest_url=URL, token="cri_t", client=failed.client()) as reporter:
        raise RuntimeError("boom")
    end = failed.stored[max(failed.stored)]
    assert end["kind"] == "end" and end["outcome"] == "failed" and "RuntimeError: boom" in end["error"]


def test_a_spool_whose_control_plane_never_came_back_is_removed_after_its_age_limit(tmp_path):
    stale = tmp_path / "old.jsonl"
    stale.write_text(json.dumps({"ingest_url": URL, "token": "cri_t"}) + "\n" + json.dumps({"seq": 1, "kind": "log"}))
    old = stale.stat().st_mtime - 8 * 24 * 3600
    os.utime(stale, (old, old))
    server = Server()
    assert replay_spools(tmp_path, client=server.client())["events"] == 0
    assert not stale.exists() and server.requests == 0


def test_a_batch_sent_in_chunks_keeps_its_unsent_chunks_in_the_spool(tmp_path):
    """The first chunk is stored, then the control plane goes away: the rest of the batch must still be on disk
    (a kill now would otherwise lose it), and a replay sends exactly the rest."""
    server = Server()
    calls = {"n": 0}

    def flaky(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] > 1:
            raise httpx.ConnectError("gone")
        return server(request)

    reporter = _offline(
        httpx.Client(transport=httpx.MockTransport(flaky)), max_events=2, spool_dir=tmp_path, outage_seconds=0.0
    )
    for i in range(5):
        reporter.log(f"line {i}")
    with pytest.raises(IngestError):
        reporter.flush()
    assert sorted(server.stored) == [1, 2]
    with pytest.raises(IngestError):
        reporter.close()  # gives up at once (outage_seconds=0): the spool stays
    replayed = Server()
    assert replay_spools(tmp_path, client=replayed.client())["events"] == 3
    assert sorted(replayed.stored) == [3, 4, 5]
