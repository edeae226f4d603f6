from __future__ import annotations

from typing import Any, TypeVar

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.models import Capability, User
from apps.accounts.permissions import request_user
from apps.benchmarks.api import EvalSerializer
from apps.benchmarks.models import BenchmarkVersion
from apps.common.fields import JSONObjectField, slug_field
from apps.common.params import query_params
from apps.common.routers import AppRouter
from apps.gates import services
from apps.gates.models import CheckStatus, Deployment, Gate, GateCheck, GateDecision
from apps.runs.models import Checkpoint


class GateSerializer(serializers.ModelSerializer):
    owner: serializers.StringRelatedField[User] = serializers.StringRelatedField()
    rules = serializers.ListField(
        child=JSONObjectField(),
        min_length=1,
        error_messages={"min_length": 'give at least one rule, e.g. [{{"type": "threshold", ...}}]'},
        help_text="A list of rules (workers.evals.gates): threshold, no_regression, flag_rate, approval",
    )
    benchmark_versions = serializers.PrimaryKeyRelatedField(
        many=True,
        queryset=BenchmarkVersion.objects.select_related("benchmark"),
        allow_empty=False,
        help_text="The benchmark versions the gate's evals run on (at least one)",
    )
    current_deployment = serializers.SerializerMethodField()

    class Meta:
        model = Gate
        fields = [
            "id",
            "name",
            "description",
            "benchmark_versions",
            "rules",
            "requires_approval",
            "eval_k",
            "max_new_tokens",
            "current_deployment",
            "owner",
            "created_at",
        ]
        read_only_fields = ["owner", "created_at"]
        extra_kwargs: dict[str, dict[str, Any]] = {
            "eval_k": {"min_value": 1, "max_value": 100},
            "max_new_tokens": {"min_value": 1, "max_value": 32_768},
        }

    def get_current_deployment(self, gate: Gate) -> int | None:
        current = [d for d in gate.deployments.all() if d.is_current]
        return current[0].pk if current else None


class EvaluateSerializer(serializers.Serializer):
    checkpoint = serializers.PrimaryKeyRelatedField(
        queryset=Checkpoint.objects.select_related("run"), required=False, allow_null=True, default=None
    )
    checkpoint_uri = serializers.CharField(required=False, allow_blank=True, default="", max_length=500)
    benchmark_versions = serializers.PrimaryKeyRelatedField(
        many=True, queryset=BenchmarkVersion.objects.select_related("benchmark"), required=False, default=list
    )


class NoteSerializer(serializers.Serializer):
    note = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


class GateDecisionSerializer(serializers.ModelSerializer):
    gate_name = serializers.CharField(source="gate.name", read_only=True)
    approved_by: serializers.StringRelatedField[User] = serializers.StringRelatedField()
    # One verdict (issue 39): `verdict` is the outcome with the approval applied; `final_verdict` stays as an
    # alias of it for scripts written before; `stages` says how it got there (checks, then approval).
    verdict = serializers.CharField(source="final_verdict", read_only=True)
    stages = serializers.ListField(read_only=True)

    class Meta:
        model = GateDecision
        fields = [
            "id",
            "gate",
            "gate_name",
            "checkpoint",
            "gate_check",
            "verdict",
            "final_verdict",
            "stages",
            "evidence",
            "approval",
            "approved_by",
            "approved_at",
            "approval_note",
            "created_at",
        ]


class GateCheckSerializer(serializers.ModelSerializer):
    gate_name = serializers.CharField(source="gate.name", read_only=True)
    candidate_evals = EvalSerializer(many=True, read_only=True)
    baseline_evals = EvalSerializer(many=True, read_only=True)
    decision = serializers.SerializerMethodField()

    class Meta:
        model = GateCheck
        fields = [
            "id",
            "gate",
            "gate_name",
            "checkpoint",
            "benchmark_versions",
            "status",
            "error",
            "candidate_evals",
            "baseline_evals",
            "baseline_deployment",
            "decision",
            "created_at",
            "decided_at",
        ]

    def get_decision(self, check: GateCheck) -> dict[str, Any] | None:
        try:
            decision = check.decision  # reverse one-to-one: select_related by the views
        except GateDecision.DoesNotExist:
            return None
        return GateDecisionSerializer(decision).data


CHECK_PREFETCH = [
    f"{side}_evals__{related}"
    for side in ("candidate", "baseline")
    for related in ("run", "checkpoint", "benchmark_version__benchmark")
] + ["benchmark_versions"]


def _checks() -> Any:
    return GateCheck.objects.select_related("gate", "decision__gate", "decision__approved_by").prefetch_related(
        *CHECK_PREFETCH
    )


def _check_response(check: GateCheck) -> Response:
    """The check with its evals and decision; `check` must come from `_checks()` (one query per relation)."""
    code = status.HTTP_202_ACCEPTED if check.status == CheckStatus.WAITING else status.HTTP_200_OK
    return Response(GateCheckSerializer(check).data, status=code)


class DeploymentSerializer(serializers.ModelSerializer):
    gate_name = serializers.CharField(source="gate.name", read_only=True)
    checkpoint_uri = serializers.CharField(source="checkpoint.uri", read_only=True)
    created_by: serializers.StringRelatedField[User] = serializers.StringRelatedField()

    class Meta:
        model = Deployment
        fields = [
            "id",
            "gate",
            "gate_name",
            "checkpoint",
            "checkpoint_uri",
            "decision",
            "is_current",
            "rolled_back_from",
            "note",
            "created_by",
            "created_at",
            "ended_at",
        ]


class GateFilters(serializers.Serializer):
    name = slug_field("Only the gate of this name", required=False)


class GateRefFilters(serializers.Serializer):
    gate = serializers.RegexField(
        r"^[-a-zA-Z0-9_]{1,100}$", max_length=100, required=False, help_text="A gate's id or name"
    )


class DeploymentFilters(GateRefFilters):
    current = serializers.ChoiceField(
        choices=["1", "true", "0", "false"], required=False, help_text="1 or true: only the current deployments"
    )


_Decisions = TypeVar("_Decisions", QuerySet[GateDecision], QuerySet[Deployment])


def _gate_filter(qs: _Decisions, gate: str | None) -> _Decisions:
    if not gate:
        return qs
    return qs.filter(gate_id=int(gate)) if gate.isdigit() else qs.filter(gate__name=gate)


class GateViewSet(viewsets.ModelViewSet):
    """Gates. Reading needs `read`; creating one needs `admin` (a gate is not edited: its decisions record the
    rules they applied, and a new rule set is a new gate). `evaluate` needs `launch` (CI); `rollback` needs
    `approve`."""

    serializer_class = GateSerializer
    queryset = (
        Gate.objects.select_related("owner").prefetch_related("benchmark_versions", "deployments").order_by("name")
    )
    write_capability = Capability.ADMIN
    capability_map = {"evaluate": Capability.LAUNCH, "rollback": Capability.APPROVE}
    http_method_names = ["get", "post", "head", "options"]

    def get_queryset(self) -> QuerySet[Gate]:
        qs = super().get_queryset()
        if self.action == "list" and (name := query_params(self.request, GateFilters).get("name")):
            qs = qs.filter(name=name)
        return qs

    @extend_schema(parameters=[GateFilters])
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    def perform_create(self, serializer: Any) -> None:
        data = serializer.validated_data
        serializer.instance = services.gate_create(
            name=data["name"],
            description=data.get("description", ""),
            rules=data["rules"],
            benchmark_versions=data["benchmark_versions"],
            requires_approval=data.get("requires_approval", True),
            eval_k=data.get("eval_k", 1),
            max_new_tokens=data.get("max_new_tokens", 384),
            owner=request_user(self.request),
        )

    @extend_schema(request=EvaluateSerializer, responses={200: GateCheckSerializer, 202: GateCheckSerializer})
    @action(detail=True, methods=["post"])
    def evaluate(self, request: Request, pk: str | None = None) -> Response:
        """Gate a checkpoint (`checkpoint` id or its `checkpoint_uri`) on the gate's benchmark versions, or on
        the pinned `benchmark_versions`. 200 with the decision when every eval had already run; else 202 with
        a check to poll at /api/v1/gate-checks/{id}/."""
        gate = self.get_object()
        body = EvaluateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        checkpoint = data["checkpoint"]
        if checkpoint is None and data["checkpoint_uri"]:
            checkpoint = Checkpoint.objects.select_related("run").filter(uri=data["checkpoint_uri"]).first()
            if checkpoint is None:
                raise ValidationError(
                    {"checkpoint_uri": [f"no checkpoint is registered at {data['checkpoint_uri']}; check the URI"]}
                )
        if checkpoint is None:
            raise ValidationError({"checkpoint": ["give a checkpoint id or checkpoint_uri"]})
        check = services.gate_evaluate(
            gate=gate, checkpoint=checkpoint, user=request_user(request), benchmark_versions=data["benchmark_versions"]
        )
        return _check_response(_checks().get(pk=check.pk))

    @extend_schema(request=NoteSerializer, responses={201: DeploymentSerializer})
    @action(detail=True, methods=["post"])
    def rollback(self, request: Request, pk: str | None = None) -> Response:
        body = NoteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        deployment = services.deployment_rollback(
            gate=self.get_object(), user=request_user(request), **body.validated_data
        )
        return Response(DeploymentSerializer(deployment).data, status=status.HTTP_201_CREATED)


class GateCheckViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = GateCheckSerializer
    queryset = _checks().order_by("-created_at")

    @extend_schema(responses={200: GateCheckSerializer, 202: GateCheckSerializer})
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """200 once the check is decided; 202 while its evals are running (poll again)."""
        return _check_response(self.get_object())


class GateDecisionViewSet(viewsets.ReadOnlyModelViewSet):
    """Decisions are read-only; `approve` and `reject` (permission `approve`) record a human's call once."""

    serializer_class = GateDecisionSerializer
    capability_map = {"approve": Capability.APPROVE, "reject": Capability.APPROVE}

    def get_queryset(self) -> QuerySet[GateDecision]:
        qs = GateDecision.objects.select_related("gate", "approved_by").order_by("-created_at")
        if self.action == "list":
            qs = _gate_filter(qs, query_params(self.request, GateRefFilters).get("gate"))
        return qs

    @extend_schema(parameters=[GateRefFilters])
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    def _judge(self, request: Request, approve: bool) -> Response:
        body = NoteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        decision = services.gate_decision_approve(
            decision=self.get_object(), user=request_user(request), approve=approve, note=body.validated_data["note"]
        )
        return Response(GateDecisionSerializer(decision).data)

    @extend_schema(request=NoteSerializer, responses=GateDecisionSerializer)
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str | None = None) -> Response:
        return self._judge(request, True)

    @extend_schema(request=NoteSerializer, responses=GateDecisionSerializer)
    @action(detail=True, methods=["post"])
    def reject(self, request: Request, pk: str | None = None) -> Response:
        return self._judge(request, False)


class DeploymentViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = DeploymentSerializer

    def get_queryset(self) -> QuerySet[Deployment]:
        qs = Deployment.objects.select_related("gate", "checkpoint", "created_by").order_by("-created_at")
        if self.action != "list":
            return qs
        filters = query_params(self.request, DeploymentFilters)
        qs = _gate_filter(qs, filters.get("gate"))
        if filters.get("current") in ("1", "true"):
            qs = qs.filter(is_current=True)
        return qs

    @extend_schema(parameters=[DeploymentFilters])
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)


router = AppRouter()  # controlplane.urls gathers every app's router into the one API root
router.register("gates", GateViewSet, basename="gate")
router.register("gate-checks", GateCheckViewSet, basename="gate-check")
router.register("gate-decisions", GateDecisionViewSet, basename="gate-decision")
router.register("deployments", DeploymentViewSet, basename="deployment")
