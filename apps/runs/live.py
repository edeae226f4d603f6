"""Live streaming of run events to browsers: publish to the run's Channels group, render frames for the page."""

from __future__ import annotations

import json
import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.template.loader import render_to_string

log = logging.getLogger(__name__)

MAX_POINTS_PER_FRAME = 2000


def group_name(run_id: int) -> str:
    return f"run-{run_id}"


async def publish_events_async(run_id: int, events: list[dict[str, Any]], state: dict[str, Any]) -> None:
    """Send to every open page of the run. A publish failure must never fail the ingest that already committed."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        await layer.group_send(group_name(run_id), {"type": "run.events", "events": events, "state": state})
    except Exception:
        log.exception("could not publish %d events of run %s", len(events), run_id)


def publish_events(run_id: int, events: list[dict[str, Any]], state: dict[str, Any]) -> None:
    """The same, from synchronous code (called on commit)."""
    async_to_sync(publish_events_async)(run_id, events, state)


def frames_for(events: list[dict[str, Any]], state: dict[str, Any]) -> list[str]:
    """Turn a batch of events into websocket frames: one HTML frame of out-of-band swaps for htmx
    (status, progress, log lines) and one JSON frame for the charts (metric points, histogram)."""
    logs: list[str] = []
    series: dict[str, list[list[float]]] = {}
    histogram: dict[str, Any] | None = None
    seqs = [e["seq"] for e in events]
    for event in events:
        kind = event["kind"]
        if kind == "log":
            logs += event["lines"]
        elif kind == "metric":
            for name, value in event["values"].items():
                series.setdefault(name, []).append([event["step"], value])
        elif kind == "histogram":
            histogram = {"name": event["name"], "edges": event["edges"], "counts": event["counts"]}
    frames: list[str] = [render_to_string("runs/_live_frame.html", {"state": state, "logs": logs[-500:]})]
    if series or histogram:
        for name, points in series.items():
            if len(points) > MAX_POINTS_PER_FRAME:
                stride = len(points) // MAX_POINTS_PER_FRAME + 1
                series[name] = points[::stride] + [points[-1]]
        frames.append(
            json.dumps(
                {
                    "type": "chart",
                    "max_seq": max(seqs) if seqs else 0,
                    "batch": state.get("batch"),
                    "series": series,
                    "histogram": histogram,
                }
            )
        )
    return frames
