"""Webhook endpoints and their delivery log. Everything needs `admin`: URLs, payloads and the secret are sensitive."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.models import Capability, User
from apps.accounts.permissions import request_user
from apps.common.routers import AppRouter
from apps.webhooks import selectors, services
from apps.webhooks.models import (
    SUBSCRIBABLE_EVENTS,
    DeliveryStatus,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    validate_event_names,
)

EVENTS_HELP = f"Event names to receive, from {SUBSCRIBABLE_EVENTS}"


class WebhookEndpointSerializer(serializers.ModelSerializer):
    """What reads show: never the secret."""

    events = serializers.ListField(
        child=serializers.CharField(max_length=64), validators=[validate_event_names], help_text=EVENTS_HELP
    )
    created_by: serializers.StringRelatedField[User] = serializers.StringRelatedField()

    class Meta:
        model = WebhookEndpoint
        fields = ["id", "name", "url", "events", "active", "created_by", "created_at"]
        read_only_fields = ["created_by", "created_at"]


class WebhookEndpointCreatedSerializer(WebhookEndpointSerializer):
    """The create response: the only place the signing secret is ever shown."""

    secret = serializers.CharField(read_only=True, help_text="Shown once; store it where the receiver can read it")

    class Meta(WebhookEndpointSerializer.Meta):
        fields = [*WebhookEndpointSerializer.Meta.fields, "secret"]


class WebhookEndpointUpdateSerializer(serializers.ModelSerializer):
    events = serializers.ListField(
        child=serializers.CharField(max_length=64), validators=[validate_event_names], help_text=EVENTS_HELP
    )

    class Meta:
        model = WebhookEndpoint
        fields = ["url", "events", "active"]


class WebhookAttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = WebhookAttempt
        fields = ["number", "requested_at", "duration_ms", "status_code", "error", "response_excerpt"]


class WebhookDeliverySerializer(serializers.ModelSerializer):
    endpoint_name = serializers.CharField(source="endpoint.name", read_only=True)

    class Meta:
        model = WebhookDelivery
        fields = [
            "id",
            "endpoint",
            "endpoint_name",
            "event",
            "event_id",
            "status",
            "attempts",
            "next_attempt_at",
            "delivered_at",
            "refused_reason",
            "created_at",
        ]


class WebhookDeliveryDetailSerializer(WebhookDeliverySerializer):
    attempt_log = WebhookAttemptSerializer(many=True, read_only=True)

    class Meta(WebhookDeliverySerializer.Meta):
        fields = [*WebhookDeliverySerializer.Meta.fields, "payload", "attempt_log"]


class WebhookEndpointViewSet(viewsets.ModelViewSet):
    """Endpoints that receive signed events. The secret is in the create response only; PATCH changes url, events
    or active; DELETE removes the endpoint and its delivery log."""

    serializer_class = WebhookEndpointSerializer
    read_capability = Capability.ADMIN
    write_capability = Capability.ADMIN
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self) -> QuerySet[WebhookEndpoint]:
        return selectors.webhook_endpoint_list()

    @extend_schema(request=WebhookEndpointSerializer, responses={201: WebhookEndpointCreatedSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        body = WebhookEndpointSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        endpoint = services.webhook_endpoint_create(
            created_by=request_user(request),
            name=data["name"],
            url=data["url"],
            events=data["events"],
            active=data.get("active", True),
        )
        return Response(WebhookEndpointCreatedSerializer(endpoint).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=WebhookEndpointUpdateSerializer, responses={200: WebhookEndpointSerializer})
    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        endpoint = self.get_object()
        body = WebhookEndpointUpdateSerializer(endpoint, data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        endpoint = services.webhook_endpoint_update(endpoint=endpoint, **body.validated_data)
        return Response(WebhookEndpointSerializer(endpoint).data)

    @extend_schema(request=None, responses={202: WebhookDeliverySerializer})
    @action(detail=True, methods=["post"])
    def ping(self, request: Request, pk: str | None = None) -> Response:
        """Send a `ping` event to this endpoint only (its subscriptions aside), to check the receiver end to end."""
        delivery = services.webhook_ping(endpoint=self.get_object())
        return Response(WebhookDeliverySerializer(delivery).data, status=status.HTTP_202_ACCEPTED)


class WebhookDeliveryViewSet(viewsets.ReadOnlyModelViewSet):
    """The delivery log: one row per (endpoint, event), newest first; the detail adds the payload and every attempt.
    Filter with ?endpoint=<id>&status=pending|succeeded|failed."""

    serializer_class = WebhookDeliverySerializer
    read_capability = Capability.ADMIN
    write_capability = Capability.ADMIN

    def get_queryset(self) -> QuerySet[WebhookDelivery]:
        if self.action != "list":
            return selectors.webhook_delivery_with_log()
        params = self.request.query_params
        endpoint, wanted = params.get("endpoint") or None, params.get("status") or None
        if endpoint is not None and not endpoint.isdigit():
            raise ValidationError({"endpoint": [f"{endpoint!r} is not an endpoint id; give a whole number"]})
        if wanted is not None and wanted not in DeliveryStatus.values:
            raise ValidationError({"status": [f"unknown status {wanted!r}; choose from {DeliveryStatus.values}"]})
        return selectors.webhook_delivery_list(endpoint_id=int(endpoint) if endpoint else None, status=wanted)

    def get_serializer_class(self) -> type[serializers.BaseSerializer]:
        return WebhookDeliverySerializer if self.action == "list" else WebhookDeliveryDetailSerializer

    @extend_schema(
        parameters=[
            OpenApiParameter("endpoint", int, description="Only this endpoint's deliveries"),
            OpenApiParameter("status", str, enum=DeliveryStatus.values, description="Only deliveries in this state"),
        ]
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    @extend_schema(request=None, responses={202: WebhookDeliveryDetailSerializer})
    @action(detail=True, methods=["post"])
    def redeliver(self, request: Request, pk: str | None = None) -> Response:
        """Queue a new attempt now for a failed delivery (same event id and body, fresh timestamp and signature)."""
        delivery = services.webhook_redeliver(delivery_id=self.get_object().pk)
        return Response(
            WebhookDeliveryDetailSerializer(selectors.webhook_delivery_with_log().get(pk=delivery.pk)).data,
            status=status.HTTP_202_ACCEPTED,
        )


router = AppRouter()  # controlplane.urls gathers every app's router into the one API root
router.register("webhooks", WebhookEndpointViewSet, basename="webhook")
router.register("webhook-deliveries", WebhookDeliveryViewSet, basename="webhook-delivery")
