from __future__ import annotations

from typing import Any

from django.conf import settings
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from pydantic import ValidationError as PydanticError
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import AuthenticationFailed, ValidationError
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts.authentication import bearer_secret
from apps.accounts.models import Capability
from apps.datasets.models import DatasetVersion
from apps.rewards.models import RewardConfigVersion
from apps.runs import selectors, services
from apps.runs.models import Run, TrajectorySummary
from workers.events import EventBatch


class RunSerializer(serializers.ModelSerializer):
    created_by = serializers.StringRelatedField()
    progress = serializers.FloatField(source="progress_fraction", read_only=True)

    class Meta:
        model = Run
        fields = [
            "id",
            "kind",
            "name",
            "status",
            "spec",
            "dataset_version",
            "reward_version",
            "tags",
            "ray_job_id",
            "progress_done",
            "progress_total",
            "progress",
            "last_seq",
            "failure_reason",
            "log_tail",
            "summary",
            "created_by",
            "created_at",
            "submitted_at",
            "started_at",
            "finished_at",
        ]


class LaunchSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["rescore"], help_text="Run kinds that can be launched so far")
    dataset_version = serializers.PrimaryKeyRelatedField(queryset=DatasetVersion.objects.select_related("dataset"))
    reward_version = serializers.PrimaryKeyRelatedField(queryset=RewardConfigVersion.objects.all())
    name = serializers.CharField(required=False, allow_blank=True, default="", max_length=200)
    tags = serializers.ListField(child=serializers.CharField(max_length=50), required=False, default=list)


class TrajectorySerializer(serializers.ModelSerializer):
    class Meta:
        model = TrajectorySummary
        fields = ["trajectory_id", "task_id", "step", "reward", "terms", "num_turns", "error", "storage_uri"]


class RunViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = RunSerializer
    capability_map = {"create": Capability.LAUNCH, "cancel": Capability.LAUNCH}

    def get_queryset(self):  # type: ignore[no-untyped-def]
        qs = selectors.run_list()
        for field in ("status", "kind"):
            if value := self.request.query_params.get(field):
                qs = qs.filter(**{field: value})
        return qs

    def create(self, request: Request) -> Response:
        body = LaunchSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        run = services.run_launch_rescore(
            created_by=request.user,
            dataset_version=data["dataset_version"],
            reward_version=data["reward_version"],
            name=data["name"],
            tags=data["tags"],
        )
        return Response(RunSerializer(run).data, status=status.HTTP_201_CREATED)

    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        run = services.run_cancel(run=self.get_object(), user=request.user)
        return Response(RunSerializer(run).data, status=status.HTTP_202_ACCEPTED)

    @action(detail=True, methods=["get"])
    def metrics(self, request: Request, pk: str | None = None) -> Response:
        """`?name=reward_mean&max_points=1000` gives one downsampled series; no name lists the names."""
        run = self.get_object()
        name = request.query_params.get("name")
        if not name:
            return Response({"names": selectors.metric_names(run_id=run.pk), "last_seq": run.last_seq})
        try:
            max_points = int(request.query_params.get("max_points", 1000))
        except ValueError:
            raise ValidationError({"max_points": ["must be a whole number between 10 and 5000"]})
        return Response(
            {**selectors.metric_series(run_id=run.pk, name=name, max_points=max_points), "last_seq": run.last_seq}
        )

    @action(detail=True, methods=["get"])
    def events(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        try:
            after = int(request.query_params.get("after", 0))
        except ValueError:
            raise ValidationError({"after": ["must be a whole number (the last sequence number you have)"]})
        _, events = selectors.run_events_after(run_id=run.pk, after=after, limit=1000)
        return Response({"events": events, "last_seq": run.last_seq})

    @action(detail=True, methods=["get"])
    def trajectories(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        page = self.paginate_queryset(run.trajectories.order_by("id"))
        return self.get_paginated_response(TrajectorySerializer(page, many=True).data)


class IngestView(APIView):
    """Workers report here with their run's ingest token (`Authorization: Bearer cri_...`), nothing else works."""

    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []
    parser_classes = [JSONParser]

    def get_authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="ingest"'

    @extend_schema(
        request=OpenApiTypes.OBJECT,
        responses={200: OpenApiTypes.OBJECT},
        description='Body: {"events": [...]} in the format of workers/events.py',
    )
    def post(self, request: Request, run_id: int) -> Response:
        run = get_object_or_404(Run, pk=run_id)
        token = bearer_secret(request)
        if token is None:
            raise AuthenticationFailed("send the run's ingest token as `Authorization: Bearer cri_...`")
        if not services.ingest_token_valid(run, token):
            return Response({"detail": f"this token is not run {run.pk}'s ingest token"}, status=403)
        length = int(request.META.get("CONTENT_LENGTH") or 0)
        if length > settings.INGEST_MAX_BYTES:
            return Response(
                {"detail": f"batch of {length} bytes is over {settings.INGEST_MAX_BYTES}; send smaller batches"},
                status=413,
            )
        raw = request.data
        if isinstance(raw, dict) and isinstance(raw.get("events"), list):
            if len(raw["events"]) > settings.INGEST_MAX_EVENTS:
                return Response(
                    {
                        "detail": f"{len(raw['events'])} events is over the {settings.INGEST_MAX_EVENTS}-event "
                        "limit per batch; split the batch"
                    },
                    status=413,
                )
        try:
            batch = EventBatch.model_validate(raw)
        except PydanticError as exc:
            raise ValidationError(
                {".".join(str(p) for p in err["loc"]) or "events": [err["msg"]] for err in exc.errors()[:20]}
            )
        result = services.ingest_batch(run_id=run.pk, events=batch.events)
        return Response({"accepted": result.accepted, "duplicates": result.duplicates, "last_seq": result.last_seq})
