"""Writes for webhooks: endpoints, emitting events, delivering them with retries, redelivery, ping.

Delivery is at least once. An event becomes one `WebhookDelivery` per subscribed endpoint, in the emitter's
transaction; the Celery task is queued only when that transaction commits. A receiver may still see an event twice
(a worker that dies after the receiver answered but before the outcome was written sends it again), which is why
every attempt carries the same `X-Crucible-Delivery` id.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from apps.accounts.models import User
from apps.webhooks import egress, signing, tasks  # tasks import this module too: names are read at call time
from apps.webhooks.models import (
    ALL_EVENTS,
    DeliveryStatus,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
)

logger = logging.getLogger(__name__)

# Events other apps emit; `ping` is sent to one endpoint by `webhook_ping`, never broadcast.
EMITTABLE_EVENTS = frozenset(WebhookEvent.values) - {WebhookEvent.PING.value}
RETRY_BASE_SECONDS = 10
RETRY_FACTOR = 3
RETRY_CAP_SECONDS = 3600
RESPONSE_EXCERPT_BYTES = 1024
LOCATION_SHOWN_CHARS = 500
# Celery computes a retry's ETA on one host and runs it on another: a second of clock difference must not make the
# retry look early (it would then wait for the beat sweep).
DUE_SLACK = timedelta(seconds=1)
USER_AGENT = "Crucible-Webhooks/1"


@dataclass(frozen=True)
class DeliveryResult:
    """What one `webhook_deliver` call did. `status` is None when the row was gone or another worker held it."""

    delivery_id: int
    status: str | None
    attempted: bool
    retry_in: int | None = None


@dataclass(frozen=True)
class _Outgoing:
    url: str
    body: bytes
    headers: dict[str, str]


@dataclass(frozen=True)
class _Answer:
    status_code: int | None
    excerpt: str
    error: str
    duration_ms: int
    refused: bool = False  # nothing was sent: the URL's address is one webhooks may not reach (egress)
    location: str = ""  # a redirect's Location header, shown in the log, never followed


def retry_delay(attempts: int) -> int:
    """Seconds to wait after the `attempts`-th failed attempt: 10, 30, 90, 270, 810, ... at most an hour."""
    return int(min(RETRY_BASE_SECONDS * RETRY_FACTOR ** max(attempts - 1, 0), RETRY_CAP_SECONDS))


def _lease() -> timedelta:
    """How long a claimed delivery is not due while its request is in flight: httpx's timeout bounds each phase
    (connect, write, each read), so a few of them plus a margin. A worker that dies mid-send frees it after this."""
    return timedelta(seconds=4 * settings.WEBHOOK_TIMEOUT + 30)


# --- endpoints -----------------------------------------------------------------------------------------------
@transaction.atomic
def webhook_endpoint_create(
    *, created_by: User, name: str, url: str, events: list[str], active: bool = True
) -> WebhookEndpoint:
    """A new endpoint with a fresh `whsec_...` secret (the caller shows it once: it is never read back by the API)."""
    endpoint = WebhookEndpoint(name=name, url=url, events=sorted(set(events)), active=active, created_by=created_by)
    endpoint.full_clean()
    endpoint.save()
    return endpoint


@transaction.atomic
def webhook_endpoint_update(
    *, endpoint: WebhookEndpoint, url: str | None = None, events: list[str] | None = None, active: bool | None = None
) -> WebhookEndpoint:
    """Change where an endpoint points, what it hears, or whether it hears anything. Pending deliveries use the new
    URL on their next attempt; deactivating fails them at their next turn without sending."""
    endpoint = WebhookEndpoint.objects.select_for_update().get(pk=endpoint.pk)
    fields: list[str] = []
    if url is not None:
        endpoint.url = url
        fields.append("url")
    if events is not None:
        endpoint.events = sorted(set(events))
        fields.append("events")
    if active is not None:
        endpoint.active = active
        fields.append("active")
    if fields:
        endpoint.full_clean()
        endpoint.save(update_fields=fields)
    return endpoint


# --- emitting ------------------------------------------------------------------------------------------------
@transaction.atomic
def webhook_emit(*, event: str, payload: dict[str, Any], event_id: uuid.UUID | str | None = None) -> list[int]:
    """Queue `event` for every active endpoint subscribed to it (or to "*"); returns the deliveries' ids.

    Call it inside the transaction that makes the event true: the rows commit or roll back with it, and delivery
    starts only after the commit. Passing the same `event_id` again (a retried caller) finds the deliveries made
    the first time and queues nothing new for them. `payload` must be JSON-serialisable (datetimes, UUIDs and
    decimals are turned into strings, as DjangoJSONEncoder does)."""
    if event not in EMITTABLE_EVENTS:
        raise ValueError(f"unknown webhook event {event!r}; emit one of {sorted(EMITTABLE_EVENTS)}")
    if not isinstance(payload, dict):
        raise TypeError(f"a webhook payload is a dict, not {type(payload).__name__}")
    endpoints = (
        WebhookEndpoint.objects.filter(active=True)
        .filter(Q(events__contains=[event]) | Q(events__contains=[ALL_EVENTS]))
        .order_by("pk")
    )
    deliveries = _deliveries_create(endpoints=list(endpoints), event=event, payload=payload, event_id=event_id)
    return [delivery.pk for delivery in deliveries]


@transaction.atomic
def webhook_ping(*, endpoint: WebhookEndpoint) -> WebhookDelivery:
    """Send a `ping` event to this endpoint only, whatever it subscribes to: a receiver's first signature check."""
    if not endpoint.active:
        raise ValidationError({"active": [f"endpoint {endpoint.name!r} is inactive; set active to true to ping it"]})
    payload = {
        "endpoint": {"id": endpoint.pk, "name": endpoint.name, "events": endpoint.events},
        "message": "Crucible webhook test: verify X-Crucible-Signature with this endpoint's secret and answer 2xx.",
    }
    [delivery] = _deliveries_create(endpoints=[endpoint], event=WebhookEvent.PING, payload=payload, event_id=None)
    return delivery


def _deliveries_create(
    *, endpoints: list[WebhookEndpoint], event: str, payload: dict[str, Any], event_id: uuid.UUID | str | None
) -> list[WebhookDelivery]:
    event_uuid = uuid.uuid4() if event_id is None else uuid.UUID(str(event_id))
    now = timezone.now()
    deliveries = []
    for endpoint in endpoints:
        # get_or_create inserts under a savepoint and reads the row on a unique-constraint clash, so two concurrent
        # emits of one event id make one row and only the one that created it queues a task.
        delivery, created = WebhookDelivery.objects.get_or_create(
            endpoint=endpoint,
            event_id=event_uuid,
            defaults={"event": event, "payload": payload, "next_attempt_at": now},
        )
        if delivery.event != event:
            raise ValueError(f"event id {event_uuid} was already emitted as {delivery.event!r}, not {event!r}")
        if created:
            _deliver_on_commit(delivery.pk)
        deliveries.append(delivery)
    return deliveries


def _deliver_on_commit(delivery_id: int) -> None:
    # robust: by the time this runs the caller's transaction (a gate decision, a deployment) has committed; a
    # broker hiccup must not turn that into an error. The row is pending and due, so the beat sweep
    # (tasks.webhook_retry_due) queues it instead.
    transaction.on_commit(lambda: tasks.deliver_webhook.delay(delivery_id), robust=True)


# --- delivering ----------------------------------------------------------------------------------------------
def delivery_body(delivery: WebhookDelivery) -> bytes:
    """The signed request body: compact JSON, the same bytes on every attempt of a delivery."""
    document = {
        "id": str(delivery.event_id),
        "event": delivery.event,
        "created_at": delivery.created_at.isoformat(),
        "data": delivery.payload,
    }
    return json.dumps(document, separators=(",", ":"), cls=DjangoJSONEncoder).encode()


def webhook_deliver(*, delivery_id: int, now: datetime | None = None) -> DeliveryResult:
    """Make one attempt at a pending delivery that is due, log it, and settle or reschedule the delivery.

    Two workers never send the same attempt: the claim takes the row with SKIP LOCKED and moves `next_attempt_at`
    a lease ahead, so a duplicate task or the beat sweep finds the row locked or not yet due and leaves it. The
    request itself runs outside any row lock (as runs.services.run_dispatch does with Ray): a receiver that takes
    ten seconds must not hold a transaction open. 2xx succeeds; 410 Gone fails at once; anything else (another
    status, a refused connection, a timeout) is retried after `retry_delay` until CRUCIBLE_WEBHOOK_MAX_ATTEMPTS.
    `now` is for tests; the signature timestamp is always the wall clock, as receivers compare it with theirs."""
    now = now or timezone.now()
    claimed = _claim(delivery_id, now)
    if isinstance(claimed, DeliveryResult):
        return claimed
    answer = _post(claimed, timeout=settings.WEBHOOK_TIMEOUT)
    return _record(delivery_id, answer, requested_at=now)


def _claim(delivery_id: int, now: datetime) -> _Outgoing | DeliveryResult:
    with transaction.atomic():
        delivery = (
            WebhookDelivery.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("endpoint")
            .filter(pk=delivery_id)
            .first()
        )
        if delivery is None:  # another worker is sending it, or its endpoint was deleted
            return DeliveryResult(delivery_id=delivery_id, status=None, attempted=False)
        due = delivery.next_attempt_at is None or delivery.next_attempt_at <= now + DUE_SLACK
        if delivery.status != DeliveryStatus.PENDING or not due:
            return DeliveryResult(delivery_id=delivery.pk, status=delivery.status, attempted=False)
        endpoint = delivery.endpoint
        if not endpoint.active:
            delivery.status = DeliveryStatus.FAILED
            delivery.next_attempt_at = None
            delivery.save(update_fields=["status", "next_attempt_at"])
            logger.info("webhook delivery %s not sent: endpoint %r is inactive", delivery.pk, endpoint.name)
            return DeliveryResult(delivery_id=delivery.pk, status=delivery.status, attempted=False)
        delivery.next_attempt_at = now + _lease()
        delivery.save(update_fields=["next_attempt_at"])
        body = delivery_body(delivery)
        timestamp = int(time.time())
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            signing.EVENT_HEADER: delivery.event,
            signing.DELIVERY_HEADER: str(delivery.event_id),
            signing.TIMESTAMP_HEADER: str(timestamp),
            signing.SIGNATURE_HEADER: signing.sign(endpoint.secret, timestamp, body),
        }
        return _Outgoing(url=endpoint.url, body=body, headers=headers)


def _post(outgoing: _Outgoing, *, timeout: float) -> _Answer:
    """Resolve and check the host (egress.resolve), then POST to the checked address without following redirects
    (a redirect is not a receipt, and could point inward) and read at most RESPONSE_EXCERPT_BYTES. Addresses are
    tried in the resolver's order until one connects."""
    started = time.monotonic()

    def answer(status_code: int | None = None, excerpt: str = "", error: str = "", **more: Any) -> _Answer:
        elapsed = int((time.monotonic() - started) * 1000)
        return _Answer(status_code=status_code, excerpt=excerpt, error=error, duration_ms=elapsed, **more)

    try:
        target = egress.resolve(outgoing.url)
    except egress.Refused as exc:
        return answer(error=str(exc), refused=True)
    except egress.Unresolvable as exc:
        return answer(error=str(exc))
    except httpx.InvalidURL as exc:
        return answer(error=f"InvalidURL: {exc}")
    status_code: int | None = None
    error = ""
    headers = {**outgoing.headers, "Host": target.host_header}
    extensions = {"sni_hostname": target.server_name} if target.url.scheme == "https" else {}
    try:
        with httpx.Client(timeout=timeout, follow_redirects=False, transport=_transport()) as client:
            for address in target.addresses:
                request = client.build_request(
                    "POST", target.pinned_url(address), content=outgoing.body, headers=headers, extensions=extensions
                )
                try:
                    response = client.send(request, stream=True)
                except httpx.ConnectError as exc:
                    error = f"could not connect to {outgoing.url} ({address}): {exc}"
                    continue
                try:
                    status_code = response.status_code
                    location = response.headers.get("Location", "")[:LOCATION_SHOWN_CHARS]
                    return answer(status_code=status_code, excerpt=_excerpt(response), location=location)
                finally:
                    response.close()
    except httpx.TimeoutException as exc:
        error = f"timed out after {timeout:g} s ({type(exc).__name__})"
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        error = f"{type(exc).__name__}: {exc}"
    return answer(status_code=status_code, error=error)


def _transport() -> httpx.BaseTransport:
    """An explicit transport, so no proxy is taken from HTTP(S)_PROXY: a proxy would resolve the name again itself
    and defeat the check (CA bundles from SSL_CERT_FILE still apply)."""
    return httpx.HTTPTransport()


def _excerpt(response: httpx.Response) -> str:
    head = bytearray()
    for chunk in response.iter_bytes():
        head += chunk
        if len(head) >= RESPONSE_EXCERPT_BYTES:
            break  # the rest is never read: a receiver answering megabytes costs nothing
    # PostgreSQL text cannot hold NUL; a binary answer is still worth a glance.
    return bytes(head[:RESPONSE_EXCERPT_BYTES]).decode("utf-8", errors="replace").replace("\x00", "\ufffd")


def _record(delivery_id: int, answer: _Answer, *, requested_at: datetime) -> DeliveryResult:
    finished = requested_at + timedelta(milliseconds=answer.duration_ms)
    with transaction.atomic():
        delivery = WebhookDelivery.objects.select_for_update().filter(pk=delivery_id).first()
        if delivery is None:  # the endpoint was deleted while the request was in flight
            return DeliveryResult(delivery_id=delivery_id, status=None, attempted=True)
        delivery.attempts += 1
        error, retry_in = answer.error, None
        if delivery.status == DeliveryStatus.PENDING:
            error, retry_in = _settle(delivery, answer, finished=finished)
        # else: settled by a worker that re-claimed it after this request outlived its lease: log, change nothing.
        WebhookAttempt.objects.create(
            delivery=delivery,
            number=delivery.attempts,
            requested_at=requested_at,
            duration_ms=answer.duration_ms,
            status_code=answer.status_code,
            error=error,
            response_excerpt=answer.excerpt,
        )
        delivery.save(update_fields=["attempts", "status", "delivered_at", "next_attempt_at", "refused_reason"])
        return DeliveryResult(delivery_id=delivery.pk, status=delivery.status, attempted=True, retry_in=retry_in)


def _settle(delivery: WebhookDelivery, answer: _Answer, *, finished: datetime) -> tuple[str, int | None]:
    """Apply one attempt's outcome to a pending delivery; returns the error to log and the seconds until a retry."""
    code, error = answer.status_code, answer.error
    retry_in: int | None = None
    if answer.refused:
        # Policy, not a failure of the receiver: retrying would only ask the resolver again (what a DNS rebinding
        # attacker wants). Change the URL or the allowed networks, then redeliver.
        delivery.refused_reason = error
        logger.warning("webhook delivery %s to endpoint %s %s", delivery.pk, delivery.endpoint_id, error)
    elif code is not None and 200 <= code < 300:
        delivery.status = DeliveryStatus.SUCCEEDED
        delivery.delivered_at = finished
    elif code is not None and 300 <= code < 400:
        where = f" to {answer.location}" if answer.location else ""
        error = error or (
            f"{code}: the receiver redirected{where}; redirects are not followed (point the endpoint at the final "
            "URL); not retried"
        )
    elif code == 410:
        error = error or "410 Gone: the receiver wants no more deliveries of this event; not retried"
    elif delivery.attempts >= settings.WEBHOOK_MAX_ATTEMPTS:
        logger.warning(
            "webhook delivery %s (%s) failed after %s attempts", delivery.pk, delivery.event, delivery.attempts
        )
    else:
        retry_in = retry_delay(delivery.attempts)
    if retry_in is not None:
        delivery.next_attempt_at = finished + timedelta(seconds=retry_in)
        return error, retry_in
    if delivery.status != DeliveryStatus.SUCCEEDED:
        delivery.status = DeliveryStatus.FAILED
    delivery.next_attempt_at = None
    return error, None


@transaction.atomic
def webhook_redeliver(*, delivery_id: int) -> WebhookDelivery:
    """Queue a new attempt now for a failed delivery (same event id and body, a fresh timestamp and signature).

    Attempts count against one budget per delivery: one that used all of CRUCIBLE_WEBHOOK_MAX_ATTEMPTS gets exactly
    one more; one that stopped early (410) gets what its budget has left."""
    delivery = (
        WebhookDelivery.objects.select_for_update(of=("self",)).select_related("endpoint").filter(pk=delivery_id).get()
    )
    if delivery.status != DeliveryStatus.FAILED:
        raise ValidationError(
            {"status": [f"delivery {delivery.pk} is {delivery.status}; only a failed delivery can be redelivered"]}
        )
    if not delivery.endpoint.active:
        raise ValidationError(
            {"endpoint": [f"endpoint {delivery.endpoint.name!r} is inactive; set active to true, then redeliver"]}
        )
    delivery.status = DeliveryStatus.PENDING
    delivery.next_attempt_at = timezone.now()
    delivery.refused_reason = ""  # the next try decides again, with today's URL and allowed networks
    delivery.save(update_fields=["status", "next_attempt_at", "refused_reason"])
    _deliver_on_commit(delivery.pk)
    return delivery
