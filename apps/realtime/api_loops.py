"""Real-time RL loops and their cycles (under /api/v1/).

GET  /api/v1/loops/                 every gate's loop, with its latest cycle and median cycle time  (viewer)
POST /api/v1/loops/                 {"gate": "coding", "serve_run": 12, "reward_version": 5, ...}  (admin)
GET  /api/v1/loops/<id>/            one loop
POST /api/v1/loops/<id>/pause/      stop advancing (the running cycle stays where it is)             (admin)
POST /api/v1/loops/<id>/resume/                                                                       (admin)
GET  /api/v1/loops/<id>/cycles/     its cycles, newest first: phases with durations, sessions, tokens, reward,
                                    eval deltas, the gate's verdict
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.models import Capability
from apps.accounts.permissions import request_user
from apps.common.routers import AppRouter
from apps.gates.models import Gate
from apps.realtime.models import Cycle, Loop
from apps.realtime.selectors import median_cycle_seconds, phase_durations
from apps.realtime.services.loops import loop_create, loop_set_paused
from apps.rewards.models import RewardConfigVersion
from apps.runs.models import Run


class CycleSerializer(serializers.ModelSerializer[Cycle]):
    phases = serializers.SerializerMethodField(help_text="[{phase, started_at, ended_at, seconds}] in order")
    seconds = serializers.FloatField(read_only=True, allow_null=True, help_text="Wall time once it ended")
    verdict = serializers.SerializerMethodField(help_text="The gate decision's final verdict, once decided")

    class Meta:
        model = Cycle
        fields = [
            "id",
            "loop",
            "number",
            "phase",
            "status",
            "reason",
            "phases",
            "seconds",
            "sessions",
            "turns",
            "tokens",
            "on_policy_share",
            "feedback_share",
            "reward_mean",
            "dataset_version",
            "train_run",
            "checkpoint",
            "gate_check",
            "verdict",
            "base_deployment",
            "deployment",
            "eval_deltas",
            "started_at",
            "ended_at",
        ]

    def get_phases(self, cycle: Cycle) -> list[dict[str, Any]]:
        return phase_durations(cycle)

    def get_verdict(self, cycle: Cycle) -> str | None:
        check = cycle.gate_check
        decision = getattr(check, "decision", None) if check is not None else None
        return decision.final_verdict if decision is not None else None


class LoopSerializer(serializers.ModelSerializer[Loop]):
    gate: serializers.SlugRelatedField[Gate] = serializers.SlugRelatedField(slug_field="name", read_only=True)
    latest_cycle = serializers.SerializerMethodField()
    median_cycle_seconds = serializers.SerializerMethodField(help_text="Median wall time of deployed cycles")

    class Meta:
        model = Loop
        fields = [
            "id",
            "gate",
            "serve_run",
            "reward_version",
            "min_sessions",
            "target_sessions",
            "max_wait_seconds",
            "settle_seconds",
            "training",
            "requires_approval",
            "paused",
            "latest_cycle",
            "median_cycle_seconds",
            "created_at",
        ]

    def get_latest_cycle(self, loop: Loop) -> dict[str, Any] | None:
        cycle = loop.cycles.order_by("-number").first()
        return dict(CycleSerializer(cycle).data) if cycle is not None else None

    def get_median_cycle_seconds(self, loop: Loop) -> float | None:
        return median_cycle_seconds(loop)


class LoopCreateSerializer(serializers.Serializer):
    gate = serializers.SlugRelatedField(slug_field="name", queryset=Gate.objects.all())
    serve_run = serializers.PrimaryKeyRelatedField(queryset=Run.objects.all(), help_text="A serve run of this gate")
    reward_version = serializers.PrimaryKeyRelatedField(
        queryset=RewardConfigVersion.objects.all(), help_text="A reward config version with a session_feedback term"
    )
    min_sessions = serializers.IntegerField(default=8, min_value=1, max_value=1_000_000)
    target_sessions = serializers.IntegerField(default=64, min_value=1, max_value=1_000_000)
    max_wait_seconds = serializers.IntegerField(default=5 * 3600, min_value=0, max_value=30 * 86400)
    settle_seconds = serializers.IntegerField(default=30, min_value=0, max_value=7 * 86400)
    training = serializers.DictField(
        required=False,
        default=dict,
        help_text='{"baseline": "batch_mean" | "task_type_mean" | "none", "max_samples": 4096, "config": {...}}',
    )
    requires_approval = serializers.BooleanField(required=False, allow_null=True, default=None)


class LoopViewSet(viewsets.GenericViewSet):
    """Reads need `read`; configuring, pausing and resuming need `admin` (a loop deploys, as gates do)."""

    serializer_class = LoopSerializer
    capability_map = {"create": Capability.ADMIN, "pause": Capability.ADMIN, "resume": Capability.ADMIN}

    def get_queryset(self) -> QuerySet[Loop]:
        return Loop.objects.select_related("gate").order_by("gate__name")

    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(LoopSerializer(page, many=True).data)

    def retrieve(self, request: Request, pk: int | None = None) -> Response:
        return Response(LoopSerializer(get_object_or_404(self.get_queryset(), pk=pk)).data)

    @extend_schema(
        request=LoopCreateSerializer,
        responses={201: LoopSerializer, 400: OpenApiResponse(description="A field names what to fix")},
    )
    def create(self, request: Request) -> Response:
        """Configure a gate's loop; beat then advances it: collect → train → evaluate and gate → deploy."""
        body = LoopCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        loop = loop_create(user=request_user(request), **body.validated_data)
        return Response(LoopSerializer(loop).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=LoopSerializer)
    @action(detail=True, methods=["post"])
    def pause(self, request: Request, pk: int | None = None) -> Response:
        loop = get_object_or_404(self.get_queryset(), pk=pk)
        return Response(LoopSerializer(loop_set_paused(loop=loop, user=request_user(request), paused=True)).data)

    @extend_schema(request=None, responses=LoopSerializer)
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: int | None = None) -> Response:
        loop = get_object_or_404(self.get_queryset(), pk=pk)
        return Response(LoopSerializer(loop_set_paused(loop=loop, user=request_user(request), paused=False)).data)

    @extend_schema(responses=CycleSerializer(many=True))
    @action(detail=True, methods=["get"])
    def cycles(self, request: Request, pk: int | None = None) -> Response:
        loop = get_object_or_404(self.get_queryset(), pk=pk)
        cycles = loop.cycles.select_related("gate_check__decision").order_by("-number")
        page = self.paginate_queryset(cycles)
        return self.get_paginated_response(CycleSerializer(page, many=True).data)


router = AppRouter()
router.register("loops", LoopViewSet, basename="loops")
