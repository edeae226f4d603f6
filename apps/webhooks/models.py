"""Webhook endpoints, one delivery per (endpoint, event), and the log of every attempt to deliver it."""

from __future__ import annotations

import secrets
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models

from apps.webhooks.egress import literal_refusal


class WebhookEvent(models.TextChoices):
    """The catalogue: every event an endpoint can subscribe to. `ping` is only ever sent by the ping action."""

    GATE_DECISION_CREATED = "gate.decision.created", "A gate was evaluated on a checkpoint"
    GATE_DECISION_APPROVED = "gate.decision.approved", "A gate decision was approved"
    GATE_DECISION_REJECTED = "gate.decision.rejected", "A gate decision was rejected"
    DEPLOYMENT_CREATED = "deployment.created", "A checkpoint was deployed"
    DEPLOYMENT_ROLLED_BACK = "deployment.rolled_back", "A deployment was rolled back"
    RUN_STALLED = "run.stalled", "A running job stayed silent past its stall limit (stack dumps in the payload)"
    PING = "ping", "A test delivery to one endpoint"


ALL_EVENTS = "*"
SUBSCRIBABLE_EVENTS = [*WebhookEvent.values, ALL_EVENTS]


def new_webhook_secret() -> str:
    return f"whsec_{secrets.token_urlsafe(32)}"


def validate_webhook_url(value: str) -> None:
    """http(s) with a host, and not an address (in any spelling the resolver reads as one, `0x7f000001` included)
    that deliveries would refuse (egress.literal_refusal; names are resolved and checked at delivery time). Not
    Django's URLValidator: it refuses single-label hosts such as `http://receiver:8080/`, which is how services on
    one private network (docker compose) name each other."""
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018  (raises ValueError on a port that is not a number)
    except ValueError:
        raise ValidationError(f"{value!r} is not a URL; give one like https://example.com/hooks/crucible")
    if not parts.scheme:
        raise ValidationError(f"{value!r} has no scheme; give a full URL like https://example.com/hooks/crucible")
    if parts.scheme not in {"http", "https"}:
        raise ValidationError(
            f"{value!r}: webhooks are sent over HTTP; use an http:// or https:// URL, not {parts.scheme}://"
        )
    if not parts.hostname:
        raise ValidationError(f"{value!r} has no host; give one like https://example.com/hooks/crucible")
    if any(ch.isspace() for ch in value):
        raise ValidationError(f"{value!r} contains whitespace; percent-encode it (a space is %20)")
    refusal = literal_refusal(value)
    if refusal is not None:
        raise ValidationError(refusal.replace("refused, not sent: ", f"{value!r}: ", 1))


def validate_event_names(value: Any) -> None:
    if not isinstance(value, list) or not value or not all(isinstance(name, str) for name in value):
        raise ValidationError(f'give a non-empty list of event names, e.g. ["*"]; choose from {SUBSCRIBABLE_EVENTS}')
    unknown = sorted(set(value) - set(SUBSCRIBABLE_EVENTS))
    if unknown:
        raise ValidationError(f"unknown event(s) {unknown}; choose from {SUBSCRIBABLE_EVENTS}")


class WebhookEndpoint(models.Model):
    """A receiver URL and the events it wants.

    The secret is stored as it is, not hashed like API tokens: the server needs it to sign every delivery. The API
    shows it once, in the create response; reads, the admin and the delivery log never show it again."""

    name = models.CharField(max_length=100, unique=True)
    url = models.CharField(max_length=500, validators=[validate_webhook_url])
    secret = models.CharField(max_length=100, default=new_webhook_secret, editable=False)
    events = models.JSONField(
        default=list,
        validators=[validate_event_names],
        help_text='Event names from the catalogue (WebhookEvent), or "*" for all of them',
    )
    active = models.BooleanField(default=True, help_text="An inactive endpoint is sent nothing")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"


class WebhookDelivery(models.Model):
    """One event for one endpoint, delivered at most once successfully however often it is emitted or retried."""

    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=64)
    event_id = models.UUIDField(help_text="X-Crucible-Delivery; the same on every attempt")
    payload = models.JSONField(encoder=DjangoJSONEncoder, default=dict)
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(
        null=True, blank=True, help_text="When a pending delivery may be tried next (also the lease while sending)"
    )
    delivered_at = models.DateTimeField(null=True, blank=True)
    refused_reason = models.TextField(
        blank=True,
        help_text="Why the last try was refused without sending (an address webhooks may not reach); empty if not",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # A retried emit (same event id) finds the row instead of delivering the event a second time.
            models.UniqueConstraint(fields=["endpoint", "event_id"], name="uniq_webhook_delivery_per_event"),
        ]
        indexes = [
            # The beat sweep reads only pending rows by due time.
            models.Index(
                fields=["next_attempt_at"],
                condition=models.Q(status="pending"),
                name="webhook_delivery_pending_due",
            ),
            models.Index(fields=["endpoint", "-created_at"], name="webhook_delivery_by_endpoint"),
        ]

    def __str__(self) -> str:
        return f"{self.event} {self.event_id} -> {self.endpoint_id}"


class WebhookAttempt(models.Model):
    """The delivery log: one row per HTTP request made (or tried) for a delivery."""

    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.CASCADE, related_name="attempt_log")
    number = models.PositiveIntegerField()
    requested_at = models.DateTimeField()
    duration_ms = models.PositiveIntegerField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True, help_text="Empty when no response came")
    error = models.TextField(blank=True)
    response_excerpt = models.TextField(blank=True, help_text="The first 1 KB of the response body")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["delivery", "number"], name="uniq_webhook_attempt_number")]
        ordering = ["delivery", "number"]

    def __str__(self) -> str:
        return f"attempt {self.number} of delivery {self.delivery_id}"
