from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.models import Capability, User
from apps.accounts.permissions import request_user
from apps.common.routers import AppRouter
from apps.rewards.models import RewardConfig, RewardConfigVersion
from apps.rewards.services import reward_config_create, reward_spec_diff, reward_version_create


class RewardVersionSerializer(serializers.ModelSerializer):
    config: serializers.StringRelatedField[RewardConfig] = serializers.StringRelatedField()
    created_by: serializers.StringRelatedField[User] = serializers.StringRelatedField()
    run_ids = serializers.SerializerMethodField()

    class Meta:
        model = RewardConfigVersion
        fields = [
            "id",
            "config",
            "number",
            "spec",
            "content_hash",
            "notes",
            "parent",
            "created_by",
            "created_at",
            "run_ids",
        ]

    def get_run_ids(self, obj: RewardConfigVersion) -> list[int]:
        return [run.pk for run in obj.runs.all()]


class RewardConfigSerializer(serializers.ModelSerializer):
    owner: serializers.StringRelatedField[User] = serializers.StringRelatedField()
    spec = serializers.DictField(write_only=True, help_text="The first version's reward spec (workers.rewards.schema)")
    notes = serializers.CharField(write_only=True, required=False, allow_blank=True, default="")

    class Meta:
        model = RewardConfig
        fields = ["id", "name", "description", "owner", "created_at", "spec", "notes"]
        read_only_fields = ["owner", "created_at"]
        extra_kwargs: dict[str, dict[str, Any]] = {"name": {"validators": []}}


class NewVersionSerializer(serializers.Serializer):
    spec = serializers.DictField(help_text="The reward spec (workers.rewards.schema)")
    notes = serializers.CharField(required=False, allow_blank=True, default="")


class RewardConfigViewSet(viewsets.ModelViewSet):
    serializer_class = RewardConfigSerializer
    queryset = RewardConfig.objects.select_related("owner")
    http_method_names = ["get", "post", "head", "options"]

    def perform_create(self, serializer: Any) -> None:
        serializer.instance = reward_config_create(owner=request_user(self.request), **serializer.validated_data)

    @extend_schema(methods=["GET"], request=None, responses=RewardVersionSerializer(many=True))
    @extend_schema(methods=["POST"], request=NewVersionSerializer, responses={201: RewardVersionSerializer})
    @action(detail=True, methods=["get", "post"])
    def versions(self, request: Request, pk: str | None = None) -> Response:
        """GET lists versions; POST {spec, notes} makes the next version (versions are never edited)."""
        config = get_object_or_404(RewardConfig, pk=pk)
        if request.method == "GET":
            qs = config.versions.select_related("config", "created_by").prefetch_related("runs").order_by("-number")
            page = self.paginate_queryset(qs)
            return self.get_paginated_response(RewardVersionSerializer(page, many=True).data)
        body = NewVersionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        version = reward_version_create(config=config, created_by=request_user(request), **body.validated_data)
        return Response(RewardVersionSerializer(version).data, status=201)


class SpecChangeSerializer(serializers.Serializer):
    path = serializers.CharField(help_text="Dotted path in the spec; terms are named by their name or type")
    change = serializers.ChoiceField(choices=["added", "removed", "changed"])
    old = serializers.JSONField(allow_null=True)
    new = serializers.JSONField(allow_null=True)


class SpecDiffSerializer(serializers.Serializer):
    old = serializers.CharField(help_text="The version in the path (config@vN)")
    new = serializers.CharField(help_text="The `other` version")
    changes = SpecChangeSerializer(many=True)


class RewardVersionViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = RewardVersionSerializer
    queryset = RewardConfigVersion.objects.select_related("config", "created_by").prefetch_related("runs")
    capability_map = {"diff": Capability.READ}

    @extend_schema(responses=SpecDiffSerializer)
    @action(detail=True, methods=["get"], url_path="diff/<int:other>")
    def diff(self, request: Request, pk: str | None = None, other: str | None = None) -> Response:
        old = get_object_or_404(RewardConfigVersion, pk=pk)
        new = get_object_or_404(RewardConfigVersion, pk=other)
        return Response({"old": str(old), "new": str(new), "changes": reward_spec_diff(old.spec, new.spec)})


router = AppRouter()  # controlplane.urls gathers every app's router into the one API root
router.register("reward-configs", RewardConfigViewSet, basename="reward-config")
router.register("reward-versions", RewardVersionViewSet, basename="reward-version")
