"""Posting feedback about a session, as an editor plug-in does: `POST <feedback_url>sessions/<id>/feedback/`.

One signal per request (`workers.session_records.FeedbackIn`), each with its own `event_id`, so a retry is safe:
the control plane answers 201 for a new event and 200 for one it already holds. A post is retried, with backoff,
for up to `wait_seconds` on network errors, 5xx and 429, and on 404: the serving run records turns through its
batched ingest, so a session can be a moment behind the reply that ended it. 401 and 403 mean the run's token is
not allowed to post feedback at all (`FeedbackRefused`: the simulator stops); any other answer is a
`FeedbackFailed` for this event only.
"""

from __future__ import annotations

import time
from typing import Literal
from urllib.parse import quote

import httpx

from workers.session_records import FeedbackIn


class FeedbackRefused(RuntimeError):
    """The control plane refused the simulator's token (401/403): no feedback can be posted."""


class FeedbackFailed(RuntimeError):
    """One event could not be posted (a 400 or 409, or still failing after `wait_seconds`; a 4xx that carries
    Retry-After is retried until then)."""


_RETRIED = frozenset({404, 408, 425, 429})


class FeedbackPoster:
    def __init__(
        self,
        feedback_url: str,
        token: str,
        *,
        wait_seconds: float = 60.0,
        timeout_seconds: float = 30.0,
        client: httpx.Client | None = None,
    ) -> None:
        self.root = feedback_url if feedback_url.endswith("/") else feedback_url + "/"
        self.wait_seconds = wait_seconds
        self._headers = {"Authorization": f"Bearer {token}"}
        self._client = client or httpx.Client(timeout=timeout_seconds)

    def url(self, session_id: str) -> str:
        return f"{self.root}sessions/{quote(session_id, safe='')}/feedback/"

    def post(self, session_id: str, event: FeedbackIn) -> Literal["created", "duplicate"]:
        """Post one event; "created" (201) or "duplicate" (200: the control plane already held it)."""
        url = self.url(session_id)
        body = event.model_dump(mode="json", exclude_none=True)
        deadline = time.monotonic() + self.wait_seconds
        delay = 0.25
        while True:
            try:
                response = self._client.post(url, json=body, headers=self._headers)
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                status = response.status_code
                if status in (200, 201):
                    return "created" if status == 201 else "duplicate"
                if status in (401, 403):
                    raise FeedbackRefused(
                        f"the control plane refused the simulator's token when posting feedback ({status} at {url}: "
                        f"{_detail(response)}); the simulate run's ingest token must be allowed to post feedback "
                        "for the serving run it targets"
                    )
                problem = f"{status}: {_detail(response)}"
                # A 4xx with Retry-After is worth repeating: a turn the simulator was just served is recorded a
                # moment later, and feedback naming it before then is a 400 on turn_index that says so.
                if status < 500 and status not in _RETRIED and "retry-after" not in response.headers:
                    raise FeedbackFailed(f"feedback {event.signal.value} for session {session_id} refused: {problem}")
            if time.monotonic() + delay > deadline:
                raise FeedbackFailed(
                    f"feedback {event.signal.value} for session {session_id} not posted within "
                    f"{self.wait_seconds:g} s: {problem}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def close(self) -> None:
        self._client.close()


def _detail(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:300] or response.reason_phrase
    if isinstance(data, dict):
        for key in ("detail", "error", "message"):
            if key in data:
                return str(data[key])[:300]
    return str(data)[:300]
