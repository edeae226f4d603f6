"""How Crucible signs a webhook, and how a receiver checks it. Pure standard library: copy this file as it is.

Every delivery is an HTTP POST whose body is compact JSON (UTF-8)::

    {"id": "<event id, a UUID>", "event": "gate.decision.approved", "created_at": "<ISO 8601>", "data": {...}}

with these headers:

- ``X-Crucible-Event``: the event name (``ping`` for a test from ``POST /api/v1/webhooks/<id>/ping/``).
- ``X-Crucible-Delivery``: the event id. Retries of one delivery repeat it, so a receiver that stores the ids it
  has handled processes each event once.
- ``X-Crucible-Timestamp``: when this attempt was sent, in Unix seconds.
- ``X-Crucible-Signature``: ``v1=<hex>``, the HMAC-SHA256 of ``f"{timestamp}.{body}"`` keyed with the endpoint's
  secret (the whole ``whsec_...`` string, as UTF-8), where ``body`` is the raw request body exactly as received.

A receiver recomputes the HMAC over the raw bytes (not over re-serialised JSON, which may differ by a space),
compares in constant time, and refuses timestamps older than a few minutes. The timestamp is inside the signed
string, so a captured request cannot be replayed later with a fresh timestamp. The header may hold several
comma-separated ``v1=`` values (room for rotating secrets); one match is enough.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping

SIGNATURE_SCHEME = "v1"
EVENT_HEADER = "X-Crucible-Event"
DELIVERY_HEADER = "X-Crucible-Delivery"
TIMESTAMP_HEADER = "X-Crucible-Timestamp"
SIGNATURE_HEADER = "X-Crucible-Signature"


def _as_bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode("utf-8")


def sign(secret: str, timestamp: int, body: bytes | str) -> str:
    """The `X-Crucible-Signature` value for `body` sent at `timestamp` (Unix seconds): ``v1=<hex digest>``."""
    message = f"{int(timestamp)}.".encode() + _as_bytes(body)
    digest = hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()
    return f"{SIGNATURE_SCHEME}={digest}"


def verify(
    secret: str,
    headers: Mapping[str, str],
    body: bytes | str,
    tolerance_seconds: int = 300,
    now: float | None = None,
) -> bool:
    """True when `headers` carry a valid signature of `body` made with `secret` within `tolerance_seconds` of now.

    `headers` may be any mapping (a plain dict, Django's `request.headers`, a WSGI environ-like dict with the same
    names); names are matched without regard to case. A missing or malformed header, a timestamp further than
    the tolerance in the past or the future, or a signature that does not match all give False."""
    lowered = {str(name).lower(): value for name, value in headers.items()}
    raw_timestamp = lowered.get(TIMESTAMP_HEADER.lower())
    raw_signatures = lowered.get(SIGNATURE_HEADER.lower())
    if not raw_timestamp or not raw_signatures:
        return False
    try:
        timestamp = int(raw_timestamp)
    except ValueError:
        return False
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_seconds:
        return False
    expected = sign(secret, timestamp, body)
    offered = [part.strip() for part in raw_signatures.split(",")]
    # compare_digest on every candidate: how long this takes says nothing about which byte differed.
    matches = [hmac.compare_digest(expected.encode(), candidate.encode()) for candidate in offered]
    return any(matches)
