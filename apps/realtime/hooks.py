"""Registered when the app registry is ready (apps.common autodiscovers every app's `hooks` module): the store of
the `session_turn` events serving runs report (apps.runs.services.ingest)."""

from __future__ import annotations

from apps.realtime.services.sessions import session_turns_store
from apps.runs.services import register_event_store

register_event_store("session_turn", session_turns_store)
