"""Registered when the app registry is ready (apps.common autodiscovers every app's `hooks` module): review
stores the `flag` events workers report, so review alone writes flags."""

from apps.review.ingest import store_flag_events
from apps.runs.services import register_event_store

register_event_store("flag", store_flag_events)
