from __future__ import annotations

import json
import time
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.contrib.auth import get_user_model

from apps.accounts.models import Capability
from apps.runs.live import frames_for, group_name
from apps.runs.models import Run
from apps.runs.selectors import run_events_after, run_for_viewer, run_state

REPLAY_PAGE = 2000
PERMISSION_RECHECK_SECONDS = 5.0


def _user_is_active(user_id: int) -> bool:
    return get_user_model().objects.filter(pk=user_id, is_active=True).exists()


class RunConsumer(AsyncWebsocketConsumer):
    """Streams one run's events. Authenticates in connect, re-checks the user on every forwarded event."""

    async def connect(self) -> None:
        user = self.scope.get("user")
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        if user is None or not user.is_authenticated or not user.can(Capability.READ):
            await self.close(code=4401)
            return
        run = await database_sync_to_async(run_for_viewer)(run_id=self.run_id, user=user)
        if run is None:
            await self.close(code=4404)
            return
        self.replayed: set[int] = set()
        self.checked_at = time.monotonic()
        await self.channel_layer.group_add(group_name(self.run_id), self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "replayed"):
            await self.channel_layer.group_discard(group_name(self.run_id), self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """The page sends {"type": "resume", "after": <last batch it has>} on every (re)connect; it gets back every
        event stored since, page by page, then a frame whose `cursor` says where it now stands."""
        try:
            message = json.loads(text_data or "{}")
            after = int(message.get("after", 0)) if message.get("type") == "resume" else None
        except (ValueError, TypeError, AttributeError):
            return
        if after is None:
            return
        self.replayed = set()
        position: tuple[int, int | None] | None = (after, None)
        while position is not None:
            run, events, position, state = await database_sync_to_async(_page_and_state)(
                self.run_id, position[0], position[1]
            )
            self.replayed.update(e["seq"] for e in events)
            if position is None:
                # Every batch up to the run's count was committed when this page was read: the page may resume there.
                state["cursor"] = run.ingest_batches
            for frame in frames_for(events, state):
                await self.send(text_data=frame)

    async def run_events(self, message: dict[str, Any]) -> None:
        user = self.scope["user"]
        # Re-check the viewer's account at most every PERMISSION_RECHECK_SECONDS: a disabled user loses the stream
        # within seconds, without a query per event per viewer (20 viewers x 50 events/s would queue up).
        now = time.monotonic()
        if now - self.checked_at > PERMISSION_RECHECK_SECONDS:
            if not await database_sync_to_async(_user_is_active)(user.pk):
                await self.close(code=4403)
                return
            self.checked_at = now
        events = [e for e in message["events"] if e["seq"] not in self.replayed]
        for frame in frames_for(events, message["state"]):
            await self.send(text_data=frame)


def _page_and_state(
    run_id: int, after_batch: int, after_seq: int | None
) -> tuple[Run, list[dict[str, Any]], tuple[int, int] | None, dict[str, Any]]:
    """One replay page and the run's state, both read on the database thread: the state counts the runs queued
    ahead of a queued one (a query), which async code may not run itself."""
    run, events, position = run_events_after(
        run_id=run_id, after_batch=after_batch, after_seq=after_seq, limit=REPLAY_PAGE
    )
    return run, events, position, run_state(run)
