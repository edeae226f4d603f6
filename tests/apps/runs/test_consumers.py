"""The run websocket, in process through Channels' communicator with the real Redis channel layer."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import close_old_connections

from apps.runs import services
from controlplane.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)


def _login_cookie(client, user) -> str:  # type: ignore[no-untyped-def]
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


async def _connect(run_id: int, cookie: str | None):  # type: ignore[no-untyped-def]
    headers = [(b"origin", b"http://127.0.0.1:8000"), (b"host", b"127.0.0.1:8000")]
    if cookie:
        headers.append((b"cookie", cookie.encode()))
    communicator = WebsocketCommunicator(application, f"/ws/runs/{run_id}/", headers=headers)
    connected, code = await communicator.connect(timeout=5)
    return communicator, connected, code


def test_an_anonymous_socket_is_closed(run):
    import asyncio

    async def go():  # type: ignore[no-untyped-def]
        communicator, connected, code = await _connect(run.pk, None)
        await communicator.disconnect()
        return connected, code

    assert asyncio.run(go()) == (False, 4401)


def test_a_viewer_gets_missed_events_on_resume_then_live_ones(run, users, client):
    import asyncio

    from workers.events import EventBatch

    cookie = _login_cookie(client, users["viewer"])
    first = EventBatch.model_validate(
        {
            "events": [
                {"seq": 1, "kind": "log", "lines": ["before connect"]},
                {"seq": 2, "kind": "progress", "done": 1, "total": 4},
            ]
        }
    )
    services.ingest_batch(run_id=run.pk, events=first.events)

    async def go():  # type: ignore[no-untyped-def]
        communicator, connected, _ = await _connect(run.pk, cookie)
        assert connected
        await communicator.send_to(text_data=json.dumps({"type": "resume", "after": 0}))
        replay = await communicator.receive_from(timeout=5)
        live = EventBatch.model_validate(
            {
                "events": [
                    {"seq": 3, "kind": "metric", "step": 2, "values": {"reward_mean": 0.75}},
                    {"seq": 4, "kind": "log", "lines": ["after connect"]},
                ]
            }
        )
        await sync_to_async(services.ingest_batch)(run_id=run.pk, events=live.events)
        frames = [await communicator.receive_from(timeout=5), await communicator.receive_from(timeout=5)]
        await communicator.disconnect()
        await sync_to_async(close_old_connections)()
        return replay, frames

    replay, frames = asyncio.run(go())
    assert "before connect" in replay and "1 / 4" in replay
    html = next(f for f in frames if not f.startswith("{"))
    chart = json.loads(next(f for f in frames if f.startswith("{")))
    assert "after connect" in html and "before connect" not in html
    assert chart["series"] == {"reward_mean": [[2, 0.75]]}


def test_a_reconnecting_page_gets_a_late_batch_with_lower_seqs_it_never_saw(run, users, client):
    """Resume is by commit order (batch), not by seq: seq 1 committed after seq 5 is still replayed."""
    import asyncio

    from workers.events import EventBatch

    def ingest(events):  # type: ignore[no-untyped-def]
        services.ingest_batch(run_id=run.pk, events=EventBatch.model_validate({"events": events}).events)

    cookie = _login_cookie(client, users["viewer"])
    ingest([{"seq": 5, "kind": "log", "lines": ["five"]}])  # batch 1: the page saw it before dropping
    ingest([{"seq": 1, "kind": "log", "lines": ["one, late"]}])  # batch 2: committed while the page was away

    async def go():  # type: ignore[no-untyped-def]
        communicator, connected, _ = await _connect(run.pk, cookie)
        assert connected
        await communicator.send_to(text_data=json.dumps({"type": "resume", "after": 1}))
        replay = await communicator.receive_from(timeout=5)
        await communicator.disconnect()
        await sync_to_async(close_old_connections)()
        return replay

    replay = asyncio.run(go())
    assert "one, late" in replay and "five" not in replay
    assert 'data-cursor="2"' in replay


def test_a_queued_runs_stream_says_its_place_and_reason_on_resume(run, users, client):
    """The resume computes the queue position (a query) on the database thread: on the event loop it raised
    SynchronousOnlyOperation, and the page kept "pending" with no reason until a reload."""
    import asyncio

    from apps.runs.models import RunStatus

    run.status = RunStatus.QUEUED
    run.queued_reason = "needs 2 CPUs; the cluster has 1 free"
    run.save(update_fields=["status", "queued_reason"])
    cookie = _login_cookie(client, users["viewer"])

    async def go():  # type: ignore[no-untyped-def]
        communicator, connected, _ = await _connect(run.pk, cookie)
        assert connected
        await communicator.send_to(text_data=json.dumps({"type": "resume", "after": 0}))
        frame = await communicator.receive_from(timeout=5)
        await communicator.disconnect()
        await sync_to_async(close_old_connections)()
        return frame

    frame = asyncio.run(go())
    assert "Queued, position 1" in frame and "needs 2 CPUs; the cluster has 1 free" in frame
    assert 'class="badge queued"' in frame
