from __future__ import annotations

from typing import Any

from rest_framework import serializers, viewsets

from apps.accounts.models import Capability
from apps.gates.models import Deployment, Gate, GateDecision


class GateSerializer(serializers.ModelSerializer):
    owner = serializers.StringRelatedField()

    class Meta:
        model = Gate
        fields = [
            "id",
            "name",
            "description",
            "benchmark_versions",
            "rules",
            "requires_approval",
            "owner",
            "created_at",
        ]
        read_only_fields = ["owner", "created_at"]


class GateViewSet(viewsets.ModelViewSet):
    """Reading gates needs `read`; creating or changing one needs `admin`."""

    serializer_class = GateSerializer
    queryset = Gate.objects.select_related("owner").prefetch_related("benchmark_versions").order_by("name")
    write_capability = Capability.ADMIN
    http_method_names = ["get", "post", "patch", "head", "options"]

    def perform_create(self, serializer: Any) -> None:
        serializer.save(owner=self.request.user)


class GateDecisionSerializer(serializers.ModelSerializer):
    class Meta:
        model = GateDecision
        fields = [
            "id",
            "gate",
            "checkpoint",
            "verdict",
            "evidence",
            "approval",
            "approved_by",
            "approved_at",
            "created_at",
        ]


class GateDecisionViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = GateDecisionSerializer
    queryset = GateDecision.objects.order_by("-created_at")


class DeploymentSerializer(serializers.ModelSerializer):
    class Meta:
        model = Deployment
        fields = ["id", "gate", "checkpoint", "decision", "is_current", "created_by", "created_at"]


class DeploymentViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = DeploymentSerializer
    queryset = Deployment.objects.order_by("-created_at")
