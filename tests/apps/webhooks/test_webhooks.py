"""Webhooks against a real HTTP receiver on 127.0.0.1: signing, retries, the delivery log, idempotence, the API.

Deliveries run synchronously (the service, or the task's `.run`), never through a broker: `queued` replaces the
task's `.delay` with a list, so what would have been queued is asserted instead."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from apps.accounts.models import Role
from apps.webhooks.models import DeliveryStatus, WebhookDelivery, WebhookEndpoint
from apps.webhooks.services import (
    DeliveryResult,
    webhook_deliver,
    webhook_emit,
    webhook_endpoint_create,
    webhook_endpoint_update,
)
from apps.webhooks.signing import sign, verify

pytestmark = pytest.mark.django_db

NON_ADMIN_ROLES = [role for role in Role.values if role != Role.ADMIN]


@pytest.fixture
def closed_port_url() -> str:
    """A loopback URL nothing listens on: connecting is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/hooks"


def deliver_when_due(delivery_id: int) -> DeliveryResult:
    """One worker turn at the moment the delivery's next attempt falls due (no sleeping through backoff)."""
    due = WebhookDelivery.objects.get(pk=delivery_id).next_attempt_at
    assert due is not None
    return webhook_deliver(delivery_id=delivery_id, now=max(due, timezone.now()))


def emit_decision(**payload: Any) -> int:
    [delivery_id] = webhook_emit(event="gate.decision.created", payload={"decision": 7, "verdict": "pass", **payload})
    return delivery_id


# --- signing -------------------------------------------------------------------------------------------------
def test_the_signature_is_the_hmac_sha256_of_timestamp_dot_body_keyed_with_the_secret() -> None:
    body = b'{"id":"x","event":"ping"}'
    by_hand = hmac.new(b"whsec_abc", b"1700000000." + body, hashlib.sha256).hexdigest()
    assert sign("whsec_abc", 1700000000, body) == f"v1={by_hand}"
    assert sign("whsec_abc", 1700000000, body.decode()) == f"v1={by_hand}"


def test_a_delivery_verifies_with_the_secret_and_not_with_a_wrong_secret_a_tampered_body_or_a_stale_timestamp(
    endpoint, receiver
):
    delivery_id = emit_decision()
    assert webhook_deliver(delivery_id=delivery_id).status == DeliveryStatus.SUCCEEDED
    [request] = receiver.requests
    delivery = WebhookDelivery.objects.get(pk=delivery_id)
    assert request.path == "/hooks/crucible"
    assert request.header("Content-Type") == "application/json"
    assert request.header("X-Crucible-Event") == "gate.decision.created"
    assert request.header("X-Crucible-Delivery") == str(delivery.event_id)
    assert json.loads(request.body) == {
        "id": str(delivery.event_id),
        "event": "gate.decision.created",
        "created_at": delivery.created_at.isoformat(),
        "data": {"decision": 7, "verdict": "pass"},
    }
    assert b", " not in request.body and b": " not in request.body  # compact JSON
    timestamp = int(request.header("X-Crucible-Timestamp"))

    assert verify(endpoint.secret, request.headers, request.body)
    assert not verify("whsec_not-the-secret", request.headers, request.body)
    assert not verify(endpoint.secret, request.headers, request.body.replace(b'"pass"', b'"fail"'))
    assert verify(endpoint.secret, request.headers, request.body, now=timestamp + 299)
    assert not verify(endpoint.secret, request.headers, request.body, now=timestamp + 301)
    assert not verify(endpoint.secret, request.headers, request.body, now=timestamp - 301)
    # A replay with a fresh timestamp does not carry a matching signature.
    replayed = {**request.headers, "X-Crucible-Timestamp": str(timestamp + 600)}
    assert not verify(endpoint.secret, replayed, request.body, now=timestamp + 600)
    assert not verify(endpoint.secret, {}, request.body)


# --- retries and the delivery log ----------------------------------------------------------------------------
def test_a_500_then_a_200_ends_succeeded_after_two_attempts_with_both_logged(endpoint, receiver):
    receiver.answer(500)
    delivery_id = emit_decision()

    first = webhook_deliver(delivery_id=delivery_id)
    assert (first.status, first.attempted, first.retry_in) == (DeliveryStatus.PENDING, True, 10)
    assert webhook_deliver(delivery_id=delivery_id).attempted is False  # a duplicate task before it is due
    second = deliver_when_due(delivery_id)
    assert (second.status, second.retry_in) == (DeliveryStatus.SUCCEEDED, None)

    delivery = WebhookDelivery.objects.get(pk=delivery_id)
    assert delivery.attempts == 2
    assert delivery.delivered_at is not None and delivery.next_attempt_at is None
    log = list(delivery.attempt_log.values_list("number", "status_code", "error", "response_excerpt"))
    assert log == [(1, 500, "", "answered 500"), (2, 200, "", "answered 200")]
    assert len(receiver.requests) == 2
    assert receiver.requests[0].body == receiver.requests[1].body
    assert {r.header("X-Crucible-Delivery") for r in receiver.requests} == {str(delivery.event_id)}


def test_a_delivery_failing_past_the_maximum_attempts_ends_failed_after_backing_off(endpoint, receiver, settings):
    settings.WEBHOOK_MAX_ATTEMPTS = 3
    receiver.answer(500, 503, 500, 200)
    delivery_id = emit_decision()

    waits = [webhook_deliver(delivery_id=delivery_id).retry_in, deliver_when_due(delivery_id).retry_in]
    last = deliver_when_due(delivery_id)
    assert waits == [10, 30]
    assert (last.status, last.retry_in) == (DeliveryStatus.FAILED, None)
    assert webhook_deliver(delivery_id=delivery_id, now=timezone.now() + timedelta(days=1)).attempted is False
    delivery = WebhookDelivery.objects.get(pk=delivery_id)
    assert (delivery.status, delivery.attempts, delivery.next_attempt_at) == (DeliveryStatus.FAILED, 3, None)
    assert list(delivery.attempt_log.values_list("status_code", flat=True)) == [500, 503, 500]
    assert len(receiver.requests) == 3


def test_a_410_gone_fails_the_delivery_at_once(endpoint, receiver):
    receiver.answer(410)
    delivery_id = emit_decision()
    result = webhook_deliver(delivery_id=delivery_id)
    assert (result.status, result.retry_in) == (DeliveryStatus.FAILED, None)
    [attempt] = WebhookDelivery.objects.get(pk=delivery_id).attempt_log.all()
    assert attempt.status_code == 410 and "not retried" in attempt.error
    assert len(receiver.requests) == 1


def test_a_refused_connection_is_logged_as_an_error_attempt_and_retried(users, receiver, closed_port_url):
    endpoint = webhook_endpoint_create(
        created_by=users["admin"], name="down", url=closed_port_url, events=["gate.decision.created"]
    )
    delivery_id = emit_decision()
    assert webhook_deliver(delivery_id=delivery_id).retry_in == 10
    assert deliver_when_due(delivery_id).retry_in == 30
    webhook_endpoint_update(endpoint=endpoint, url=receiver.url)  # the receiver comes up at its real address
    assert deliver_when_due(delivery_id).status == DeliveryStatus.SUCCEEDED

    log = list(WebhookDelivery.objects.get(pk=delivery_id).attempt_log.all())
    assert [(a.number, a.status_code) for a in log] == [(1, None), (2, None), (3, 200)]
    assert "could not connect" in log[0].error and closed_port_url in log[0].error
    assert len(receiver.requests) == 1


def test_only_the_first_kilobyte_of_an_answer_is_kept(endpoint, receiver):
    receiver.reply_body = "é".encode() * 5000 + b"\x00"
    webhook_deliver(delivery_id=emit_decision())
    attempt = WebhookDelivery.objects.get().attempt_log.get()
    assert len(attempt.response_excerpt.encode()) <= 1024 + 3
    assert attempt.response_excerpt.startswith("éé")


def test_the_task_retries_with_the_services_countdown_and_returns_the_final_status(endpoint, receiver, monkeypatch):
    from apps.webhooks.tasks import deliver_webhook

    class Retried(Exception):
        pass

    countdowns: list[int] = []

    def retry(*, countdown: int) -> Exception:
        countdowns.append(countdown)
        return Retried()

    monkeypatch.setattr(deliver_webhook, "retry", retry)
    receiver.answer(502)
    delivery_id = emit_decision()
    with pytest.raises(Retried):
        deliver_webhook.run(delivery_id)
    assert countdowns == [10]
    assert deliver_webhook.run(delivery_id) == DeliveryStatus.PENDING  # early: nothing sent, nothing rescheduled
    WebhookDelivery.objects.filter(pk=delivery_id).update(next_attempt_at=timezone.now())
    assert deliver_webhook.run(delivery_id) == DeliveryStatus.SUCCEEDED
    assert countdowns == [10] and len(receiver.requests) == 2


# --- emitting ------------------------------------------------------------------------------------------------
def test_the_same_event_id_emitted_twice_delivers_once(endpoint, receiver, queued, django_capture_on_commit_callbacks):
    event_id = uuid.uuid4()
    with django_capture_on_commit_callbacks(execute=True):
        first = webhook_emit(event="deployment.created", payload={"deployment": 3}, event_id=event_id)
        again = webhook_emit(event="deployment.created", payload={"deployment": 3}, event_id=str(event_id))
    assert first == again and len(first) == 1
    assert queued == first  # queued once, after the commit
    for delivery_id in [*queued, *first]:  # the queued task, and a duplicate of it
        webhook_deliver(delivery_id=delivery_id)
    assert len(receiver.requests) == 1
    assert WebhookDelivery.objects.count() == 1


def test_inactive_endpoints_and_unsubscribed_events_get_nothing(users, receiver):
    admin = users["admin"]
    listening = webhook_endpoint_create(created_by=admin, name="all", url=receiver.url, events=["*"])
    webhook_endpoint_create(created_by=admin, name="off", url=receiver.url, events=["*"], active=False)
    webhook_endpoint_create(created_by=admin, name="deploys", url=receiver.url, events=["deployment.created"])
    exact = webhook_endpoint_create(
        created_by=admin, name="decisions", url=receiver.url, events=["ping", "gate.decision.created"]
    )

    ids = webhook_emit(event="gate.decision.created", payload={"decision": 1})
    assert set(WebhookDelivery.objects.filter(pk__in=ids).values_list("endpoint__name", flat=True)) == {
        listening.name,
        exact.name,
    }
    assert webhook_emit(event="deployment.rolled_back", payload={}) == [
        WebhookDelivery.objects.get(endpoint=listening, event="deployment.rolled_back").pk
    ]


def test_an_endpoint_deactivated_after_the_emit_is_sent_nothing(endpoint, receiver):
    delivery_id = emit_decision()
    webhook_endpoint_update(endpoint=endpoint, active=False)
    result = webhook_deliver(delivery_id=delivery_id)
    assert (result.status, result.attempted) == (DeliveryStatus.FAILED, False)
    assert receiver.requests == []


def test_an_emit_inside_a_rolled_back_transaction_schedules_nothing(
    endpoint, queued, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        with pytest.raises(RuntimeError):
            with transaction.atomic():
                webhook_emit(event="gate.decision.approved", payload={"decision": 9})
                raise RuntimeError("the approval failed to save")
    assert callbacks == [] and queued == []
    assert not WebhookDelivery.objects.exists()
    with django_capture_on_commit_callbacks(execute=True):
        ids = webhook_emit(event="gate.decision.approved", payload={"decision": 9})
    assert queued == ids  # the control: a committed emit does queue


def test_an_unknown_event_or_a_broadcast_ping_is_a_programming_error(endpoint):
    with pytest.raises(ValueError, match="gate.decision.created"):
        webhook_emit(event="gate.created", payload={})
    with pytest.raises(ValueError):
        webhook_emit(event="ping", payload={})


def test_the_beat_sweep_requeues_only_overdue_pending_deliveries(endpoint, queued):
    from apps.webhooks.tasks import webhook_retry_due

    now = timezone.now()
    overdue, fresh, later, failed = (emit_decision(n=n) for n in range(4))
    WebhookDelivery.objects.filter(pk__in=[overdue, failed]).update(next_attempt_at=now - timedelta(minutes=5))
    WebhookDelivery.objects.filter(pk=later).update(next_attempt_at=now + timedelta(minutes=5))
    WebhookDelivery.objects.filter(pk=failed).update(status=DeliveryStatus.FAILED)
    assert webhook_retry_due() == 1
    assert queued == [overdue]


@pytest.mark.django_db(transaction=True)
def test_a_second_worker_never_sends_an_attempt_already_in_flight(endpoint, receiver, queued):
    """Two real connections: worker A's request hangs at the receiver while worker B (a duplicate task, the beat
    sweep) tries the same delivery; B sends nothing. Then B cannot take a row A holds locked either."""
    delivery_id = emit_decision()
    receiver.hold = True
    outcome: list[DeliveryResult] = []
    worker_a = threading.Thread(
        target=in_own_connection(lambda: outcome.append(webhook_deliver(delivery_id=delivery_id)))
    )
    worker_a.start()
    assert receiver.arrived.wait(timeout=10)
    assert webhook_deliver(delivery_id=delivery_id).attempted is False
    receiver.release.set()
    worker_a.join(timeout=10)
    assert outcome[0].status == DeliveryStatus.SUCCEEDED
    assert len(receiver.requests) == 1

    other_id = emit_decision(n=2)
    seen: list[DeliveryResult] = []
    with transaction.atomic():
        WebhookDelivery.objects.select_for_update().get(pk=other_id)
        worker_b = threading.Thread(
            target=in_own_connection(lambda: seen.append(webhook_deliver(delivery_id=other_id)))
        )
        worker_b.start()
        worker_b.join(timeout=10)
    assert (seen[0].status, seen[0].attempted) == (None, False)
    assert len(receiver.requests) == 1


def in_own_connection(work: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        try:
            work()
        finally:
            connection.close()

    return run


# --- the API -------------------------------------------------------------------------------------------------
def test_the_secret_is_in_the_create_response_and_never_in_a_read(client_for, receiver, queued):
    admin = client_for("admin")
    created = admin.post(
        "/api/v1/webhooks/", {"name": "ci", "url": receiver.url, "events": ["gate.decision.created"]}, format="json"
    )
    assert created.status_code == 201, created.json()
    secret = created.json()["secret"]
    assert secret.startswith("whsec_") and len(secret) > 40
    assert WebhookEndpoint.objects.get(name="ci").secret == secret
    endpoint_id = created.json()["id"]
    ping = admin.post(f"/api/v1/webhooks/{endpoint_id}/ping/")
    reads = [
        admin.get("/api/v1/webhooks/"),
        admin.get(f"/api/v1/webhooks/{endpoint_id}/"),
        admin.patch(f"/api/v1/webhooks/{endpoint_id}/", {"active": True}, format="json"),
        admin.get("/api/v1/webhook-deliveries/"),
        admin.get(f"/api/v1/webhook-deliveries/{ping.json()['id']}/"),
    ]
    for response in reads:
        assert response.status_code == 200
        assert secret not in response.content.decode()
    listed, retrieved, patched = (response.json() for response in reads[:3])
    for shown in [*listed["results"], retrieved, patched]:
        assert "secret" not in shown


@pytest.mark.parametrize("role", NON_ADMIN_ROLES)
def test_a_non_admin_gets_403_on_every_webhook_endpoint(client_for, endpoint, role):
    delivery_id = emit_decision()
    client = client_for(role)
    calls = [
        ("get", "/api/v1/webhooks/", None),
        ("post", "/api/v1/webhooks/", {"name": "x", "url": "https://example.com/h", "events": ["*"]}),
        ("get", f"/api/v1/webhooks/{endpoint.pk}/", None),
        ("patch", f"/api/v1/webhooks/{endpoint.pk}/", {"active": False}),
        ("delete", f"/api/v1/webhooks/{endpoint.pk}/", None),
        ("post", f"/api/v1/webhooks/{endpoint.pk}/ping/", None),
        ("get", "/api/v1/webhook-deliveries/", None),
        ("get", f"/api/v1/webhook-deliveries/{delivery_id}/", None),
        ("post", f"/api/v1/webhook-deliveries/{delivery_id}/redeliver/", None),
    ]
    for method, path, body in calls:
        response = getattr(client, method)(path, body, format="json")
        assert response.status_code == 403, (method, path, response.status_code)
    endpoint.refresh_from_db()
    assert endpoint.active and WebhookDelivery.objects.count() == 1


@pytest.mark.parametrize("url", ["ftp://example.com/hook", "example.com/hook", "http://", "https://exa mple.com/", ""])
def test_a_url_that_is_not_http_is_a_400_naming_the_url_field(client_for, url):
    response = client_for("admin").post(
        "/api/v1/webhooks/", {"name": "bad", "url": url, "events": ["*"]}, format="json"
    )
    assert response.status_code == 400
    assert list(response.json()["fields"]) == ["url"]
    assert not WebhookEndpoint.objects.exists()


def test_a_missing_url_is_a_400_naming_the_url_field_and_ftp_is_told_to_use_http(client_for):
    admin = client_for("admin")
    missing = admin.post("/api/v1/webhooks/", {"name": "bad", "events": ["*"]}, format="json")
    assert missing.status_code == 400 and "url" in missing.json()["fields"]
    ftp = admin.post("/api/v1/webhooks/", {"name": "bad", "url": "ftp://example.com/", "events": ["*"]}, format="json")
    assert "http:// or https://" in ftp.json()["detail"]


@pytest.mark.parametrize("events", [["gate.created"], [], "gate.decision.created", [7]])
def test_unknown_or_malformed_events_are_a_400_naming_the_field_and_listing_the_allowed_ones(client_for, events):
    response = client_for("admin").post(
        "/api/v1/webhooks/", {"name": "bad", "url": "https://example.com/h", "events": events}, format="json"
    )
    assert response.status_code == 400
    assert list(response.json()["fields"]) == ["events"]
    if events == ["gate.created"]:
        assert "gate.created" in response.json()["detail"]
        for allowed in ("gate.decision.created", "deployment.rolled_back", "ping", "*"):
            assert allowed in response.json()["detail"]


def test_an_admin_changes_an_endpoint_and_deleting_it_removes_its_log(client_for, endpoint, receiver):
    admin = client_for("admin")
    path = f"/api/v1/webhooks/{endpoint.pk}/"
    changed = admin.patch(
        path, {"events": ["deployment.created", "deployment.created"], "active": False}, format="json"
    )
    assert changed.status_code == 200
    assert (changed.json()["events"], changed.json()["active"]) == (["deployment.created"], False)
    refused = admin.patch(path, {"url": "ftp://example.com/"}, format="json")
    assert refused.status_code == 400 and list(refused.json()["fields"]) == ["url"]
    assert admin.patch(path, {"events": ["nope"]}, format="json").json()["fields"].keys() == {"events"}
    assert admin.put(path, {"name": "x"}, format="json").status_code == 405

    admin.patch(path, {"active": True}, format="json")
    webhook_deliver(delivery_id=webhook_emit(event="deployment.created", payload={})[0])
    assert admin.delete(path).status_code == 204
    assert not WebhookEndpoint.objects.exists() and not WebhookDelivery.objects.exists()


def test_ping_sends_a_ping_to_that_endpoint_only(
    client_for, users, receiver, queued, django_capture_on_commit_callbacks
):
    admin = client_for("admin")
    target = webhook_endpoint_create(
        created_by=users["admin"], name="t", url=receiver.url, events=["deployment.created"]
    )
    webhook_endpoint_create(created_by=users["admin"], name="other", url=receiver.url, events=["*"])
    with django_capture_on_commit_callbacks(execute=True):
        response = admin.post(f"/api/v1/webhooks/{target.pk}/ping/")
    assert response.status_code == 202
    assert (response.json()["event"], response.json()["status"]) == ("ping", "pending")
    assert queued == [response.json()["id"]]
    webhook_deliver(delivery_id=queued[0])
    [request] = receiver.requests
    assert request.header("X-Crucible-Event") == "ping"
    assert json.loads(request.body)["data"]["endpoint"]["name"] == "t"
    assert verify(target.secret, request.headers, request.body)

    webhook_endpoint_update(endpoint=target, active=False)
    refused = admin.post(f"/api/v1/webhooks/{target.pk}/ping/")
    assert refused.status_code == 400 and "active" in refused.json()["fields"]


def test_redeliver_queues_a_new_attempt_for_a_failed_delivery_only(
    client_for, endpoint, receiver, queued, django_capture_on_commit_callbacks
):
    admin = client_for("admin")
    receiver.answer(410)
    delivery_id = emit_decision()
    webhook_deliver(delivery_id=delivery_id)
    with django_capture_on_commit_callbacks(execute=True):
        response = admin.post(f"/api/v1/webhook-deliveries/{delivery_id}/redeliver/")
    assert response.status_code == 202
    assert response.json()["status"] == "pending"
    assert queued == [delivery_id]
    assert webhook_deliver(delivery_id=delivery_id).status == DeliveryStatus.SUCCEEDED

    detail = admin.get(f"/api/v1/webhook-deliveries/{delivery_id}/").json()
    assert [(a["number"], a["status_code"]) for a in detail["attempt_log"]] == [(1, 410), (2, 200)]
    assert detail["payload"] == {"decision": 7, "verdict": "pass"}
    again = admin.post(f"/api/v1/webhook-deliveries/{delivery_id}/redeliver/")
    assert again.status_code == 400 and "status" in again.json()["fields"]
    assert len(receiver.requests) == 2


def test_the_delivery_list_filters_by_endpoint_and_status(client_for, users, endpoint, receiver):
    admin = client_for("admin")
    other = webhook_endpoint_create(created_by=users["admin"], name="other", url=receiver.url, events=["*"])
    receiver.answer(410)
    ids = webhook_emit(event="deployment.created", payload={"deployment": 1})
    webhook_deliver(delivery_id=ids[0])

    def listed(query: str) -> list[int]:
        response = admin.get(f"/api/v1/webhook-deliveries/{query}")
        assert response.status_code == 200
        return [row["id"] for row in response.json()["results"]]

    assert sorted(listed("")) == sorted(ids)
    assert listed(f"?endpoint={other.pk}") == [ids[1]]
    assert listed(f"?endpoint={endpoint.pk}&status=failed") == [ids[0]]
    assert listed(f"?endpoint={endpoint.pk}&status=pending") == []
    bad_status = admin.get("/api/v1/webhook-deliveries/?status=lost")
    assert bad_status.status_code == 400 and list(bad_status.json()["fields"]) == ["status"]
    bad_endpoint = admin.get("/api/v1/webhook-deliveries/?endpoint=ci")
    assert bad_endpoint.status_code == 400 and list(bad_endpoint.json()["fields"]) == ["endpoint"]
