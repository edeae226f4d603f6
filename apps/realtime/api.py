"""Real-time RL API (under /api/v1/): sessions and their feedback, serving runs and their A/B statistics. The
launches of the serve, simulate and sessiontrain kinds (`POST /api/v1/runs/ {"kind": ...}`) are in `launches`.

GET  /api/v1/sessions/                       sessions, newest last turn first; filters below          (viewer)
GET  /api/v1/sessions/<id>/                  one session with its turns and feedback                   (viewer)
POST /api/v1/sessions/<client session id>/feedback/   one typed signal: 201 new, 200 a repeated event_id (409
                                             if it repeats with another signal; 400 for a turn it does not have)
                                             (serve scope, a signed-in user, or a simulate run's token)
GET  /api/v1/serving/                        serving runs with their endpoint URLs                     (viewer)
GET  /api/v1/serving/<run id>/               one serving run, its endpoint and its current target      (viewer)
GET  /api/v1/serving/<run id>/ab/            per-arm rates and latency with intervals; b against a     (viewer)
PUT  /api/v1/serving/<run id>/split/         start, change or end its A/B split                        (operator)
GET  /api/v1/serving/<run id>/target/        the serving job's own control endpoints, with its run token
POST /api/v1/serving/<run id>/keys/verify/   (apps.realtime.control; not in the schema)
"""

from __future__ import annotations

import re
from typing import Any

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from django.urls import path
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from pydantic import ValidationError as PydanticError
from rest_framework import serializers, status, viewsets
from rest_framework.authentication import SessionAuthentication
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts.authentication import ApiTokenAuthentication
from apps.accounts.models import Capability, User
from apps.common.errors import MAX_FIELD_ERRORS
from apps.common.params import id_field, query_params
from apps.common.routers import AppRouter
from apps.common.schema import ErrorSerializer
from apps.realtime import selectors
from apps.realtime.auth import CanPostFeedback, SimulateRunAuthentication, SimulateRunCredential
from apps.realtime.control import keys_verify_view, target_view
from apps.realtime.models import Feedback, Session, SessionTurn
from apps.realtime.models.sessions import SIGNAL_CHOICES
from apps.realtime.services.serving import (
    serve_endpoint_url,
    serve_split_update,
)
from apps.realtime.services.sessions import (
    FeedbackConflict,
    FeedbackOutsideWindow,
    FeedbackTurnUnknown,
    feedback_create,
)
from apps.runs.api import RunSerializer
from apps.runs.models import Run
from workers.session_records import EVENT_ID_MAX, SESSION_ID_MAX, FeedbackIn

# --- sessions -----------------------------------------------------------------------------------------------------


class FeedbackSerializer(serializers.ModelSerializer):
    user: serializers.StringRelatedField[User] = serializers.StringRelatedField()

    class Meta:
        model = Feedback
        fields = ["id", "event_id", "signal", "value", "turn_index", "text", "user", "run", "created_at"]


class FeedbackPostedSerializer(FeedbackSerializer):
    session = serializers.IntegerField(source="session_id", help_text="The session's id in this API")
    session_id = serializers.CharField(source="session.client_session_id", help_text="The client's session id")
    duplicate = serializers.BooleanField(help_text="True: this event_id was posted before; nothing was added")

    class Meta(FeedbackSerializer.Meta):
        fields = [*FeedbackSerializer.Meta.fields, "session", "session_id", "duplicate"]


class FeedbackInSerializer(serializers.Serializer):
    """workers.session_records.FeedbackIn, for the schema (the view validates with FeedbackIn itself)."""

    event_id = serializers.CharField(max_length=EVENT_ID_MAX, help_text="The client's id for this event")
    signal = serializers.ChoiceField(choices=SIGNAL_CHOICES)
    value = serializers.FloatField(
        required=False,
        allow_null=True,
        help_text="thumbs: +1 or -1 (required); tests_passed/tests_failed: optional fraction in [0, 1]; else none",
    )
    turn_index = serializers.IntegerField(min_value=0, required=False, allow_null=True)
    text = serializers.CharField(required=False, allow_blank=True, max_length=10_000, help_text="signal=text: needed")


class TurnSerializer(serializers.ModelSerializer):
    class Meta:
        model = SessionTurn
        fields = [
            "turn_index",
            "request_id",
            "messages",
            "tools",
            "response",
            "prompt_tokens",
            "completion_tokens",
            "prompt_token_ids",
            "completion_token_ids",
            "logprobs",
            "policy_version",
            "deployment",
            "arm",
            "latency_ms",
            "finish_reason",
            "created_at",
        ]


class SessionSerializer(serializers.ModelSerializer):
    session_id = serializers.CharField(source="client_session_id", help_text="The client's session id")
    user: serializers.StringRelatedField[User] = serializers.StringRelatedField()
    gate = serializers.CharField(source="deployment.gate.name", allow_null=True, default=None)

    class Meta:
        model = Session
        fields = [
            "id",
            "session_id",
            "serve_run",
            "user",
            "task_type",
            "arm",
            "deployment",
            "gate",
            "first_policy_version",
            "last_policy_version",
            "num_turns",
            "prompt_tokens",
            "completion_tokens",
            "feedback_counts",
            "reward",
            "reward_version",
            "cycle",
            "started_at",
            "last_turn_at",
        ]


class SessionDetailSerializer(SessionSerializer):
    turns = TurnSerializer(many=True, read_only=True)
    feedback = FeedbackSerializer(many=True, read_only=True)

    class Meta(SessionSerializer.Meta):
        fields = [*SessionSerializer.Meta.fields, "reward_terms", "turns", "feedback"]


BOOLEAN_CHOICES = ["1", "true", "0", "false"]


class SessionFilters(serializers.Serializer):
    serve_run = id_field("Only sessions of this serving run")
    deployment = id_field("Only sessions whose first turn this deployment served")
    policy_version = serializers.IntegerField(
        min_value=0, max_value=2**63 - 1, required=False, help_text="Sessions whose first or last turn had it"
    )
    has_feedback = serializers.ChoiceField(
        choices=BOOLEAN_CHOICES, required=False, help_text="1 or true: with feedback; 0 or false: without"
    )
    since = serializers.DateTimeField(required=False, help_text="Last turn at or after (ISO 8601)")
    until = serializers.DateTimeField(required=False, help_text="Last turn before (ISO 8601)")
    arm = serializers.RegexField(r"^[A-Za-z0-9_-]{0,16}$", required=False, help_text="A/B arm ('a', 'b')")
    task_type = serializers.CharField(required=False, max_length=100)
    cycle = id_field("Only sessions this cycle collected")
    user = serializers.CharField(required=False, max_length=150, help_text="Only this user's sessions (username)")
    session_id = serializers.CharField(required=False, max_length=SESSION_ID_MAX, help_text="The client's id")

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        if "has_feedback" in data:
            data["has_feedback"] = data["has_feedback"] in ("1", "true")
        if data.get("since") and data.get("until") and data["since"] >= data["until"]:
            raise ValidationError({"until": ["must be after since"]})
        return data


class SessionViewSet(viewsets.ReadOnlyModelViewSet):
    """Served sessions (`?serve_run=`, `?deployment=`, `?policy_version=`, `?has_feedback=1`, `?since=`, ...)."""

    serializer_class = SessionSerializer

    def get_queryset(self) -> QuerySet[Session]:
        if self.action == "list":
            return selectors.session_list(**query_params(self.request, SessionFilters))
        return selectors.session_list()

    def get_serializer_class(self) -> type[serializers.BaseSerializer[Any]]:
        return SessionDetailSerializer if self.action == "retrieve" else SessionSerializer

    @extend_schema(parameters=[SessionFilters])
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        session = selectors.session_detail(int(kwargs["pk"]))
        if session is None:
            raise NotFound(f"session {kwargs['pk']} does not exist")
        return Response(SessionDetailSerializer(session).data)


_FIELD_IN_MESSAGE = re.compile(r"^(?:Value error, )?([a-z_]+): (.+)$", re.S)


def _feedback_problems(exc: PydanticError) -> dict[str, list[str]]:
    """FeedbackIn's errors by field; a cross-field rule names its field at the start of its message."""
    problems: dict[str, list[str]] = {}
    for err in exc.errors()[:MAX_FIELD_ERRORS]:
        where = ".".join(str(p) for p in err["loc"])
        message = err["msg"]
        if not where and (named := _FIELD_IN_MESSAGE.match(message)) and named.group(1) in FeedbackIn.model_fields:
            where, message = named.group(1), named.group(2)
        problems.setdefault(where or "body", []).append(message)
    return problems


class FeedbackView(APIView):
    """`POST /api/v1/sessions/{session_id}/feedback/`: one typed signal about the caller's session (the client's
    session id; the newest of the caller's sessions with that id), idempotent by `event_id`."""

    authentication_classes = [ApiTokenAuthentication, SessionAuthentication, SimulateRunAuthentication]
    permission_classes = [CanPostFeedback]

    @extend_schema(
        operation_id="sessions_feedback_create",
        request=FeedbackInSerializer,
        parameters=[
            OpenApiParameter(
                "session_id", str, OpenApiParameter.PATH, description="The client's session id (X-Session-Id)"
            )
        ],
        responses={
            201: FeedbackPostedSerializer,
            200: OpenApiResponse(FeedbackPostedSerializer, description="A repeated event_id: nothing was added"),
            404: OpenApiResponse(ErrorSerializer, description="No session of yours has this id (yet)"),
            400: OpenApiResponse(
                ErrorSerializer, description="A malformed body, or a turn_index the session has no turn for"
            ),
            409: OpenApiResponse(
                ErrorSerializer,
                description="The session's feedback window has closed, or this event_id was posted before with "
                "another signal or content",
            ),
        },
    )
    def post(self, request: Request, session_id: str) -> Response:
        """Feedback about a session: edit_kept, edit_reverted, dissatisfied_followup, accepted, rejected, thumbs
        (value +1 or -1), tests_passed / tests_failed (value: optional fraction), text. 201 when stored, 200 with
        the stored row when this event_id was posted before with the same body (nothing added), 400 for a malformed
        body or a turn_index the session has no turn for, 404 for a session id none of your sessions has (turns
        are recorded in batches: retry for a few seconds), 409 after the window (CRUCIBLE_FEEDBACK_WINDOW_HOURS
        after the session's last turn) or when this event_id was posted before with another signal or content."""
        try:
            body = FeedbackIn.model_validate(request.data)
        except PydanticError as exc:
            raise ValidationError(_feedback_problems(exc)) from None
        credential = request.auth if isinstance(request.auth, SimulateRunCredential) else None
        user = request.user if credential is None and isinstance(request.user, User) else None
        session = selectors.session_for_feedback(
            client_session_id=session_id,
            user=user,
            serve_run_id=credential.serve_run_id if credential else None,
        )
        if session is None:
            response = Response(
                {"detail": f"no session {session_id!r} of yours has been recorded (yet)"},
                status=status.HTTP_404_NOT_FOUND,
            )
            response["Retry-After"] = "2"
            return response
        try:
            result = feedback_create(session=session, body=body, user=user, run=credential.run if credential else None)
        except (FeedbackOutsideWindow, FeedbackConflict) as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        except FeedbackTurnUnknown as exc:
            # Retry-After: turns are recorded a moment after they are served, so a client posting about the turn it
            # was just served may be early; a turn that never comes stays a 400.
            return Response(
                {"detail": f"turn_index: {exc}", "fields": {"turn_index": [str(exc)]}},
                status=status.HTTP_400_BAD_REQUEST,
                headers={"Retry-After": "2"},
            )
        result.feedback.duplicate = not result.created  # type: ignore[attr-defined]
        return Response(
            FeedbackPostedSerializer(result.feedback).data,
            status=status.HTTP_201_CREATED if result.created else status.HTTP_200_OK,
        )


# --- serving runs -------------------------------------------------------------------------------------------------


class ServingRunSerializer(serializers.Serializer):
    run = RunSerializer()
    endpoint = serializers.CharField(help_text="The OpenAI base URL clients use (…/v1)")
    model_name = serializers.CharField()
    target = serializers.DictField(help_text="What it serves now: revision, model_name, arms")
    sessions = serializers.IntegerField()


class IntervalSerializer(serializers.Serializer):
    value = serializers.FloatField(allow_null=True)
    ci = serializers.ListField(child=serializers.FloatField(allow_null=True), allow_null=True)


class RateSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    rate = serializers.FloatField(allow_null=True)
    ci = serializers.ListField(child=serializers.FloatField(), allow_null=True, help_text="95% Wilson interval")


class LatencySerializer(serializers.Serializer):
    p50 = IntervalSerializer()
    p95 = IntervalSerializer()


class ArmStatsSerializer(serializers.Serializer):
    name = serializers.CharField()
    deployment_id = serializers.IntegerField(allow_null=True)
    sessions = serializers.IntegerField()
    sessions_with_feedback = serializers.IntegerField()
    turns = serializers.IntegerField()
    edit_kept = RateSerializer()
    dissatisfied = RateSerializer()
    latency_ms = LatencySerializer()


class DifferenceSerializer(serializers.Serializer):
    difference = serializers.FloatField(allow_null=True, help_text="b − a")
    relative = serializers.FloatField(allow_null=True, required=False, help_text="(b − a) / a")
    ci = serializers.ListField(child=serializers.FloatField(), allow_null=True)
    p_value = serializers.FloatField(allow_null=True)


class ComparisonSerializer(serializers.Serializer):
    arm = serializers.CharField()
    baseline = serializers.CharField()
    edit_kept = DifferenceSerializer()
    dissatisfied = DifferenceSerializer()
    latency_p50 = DifferenceSerializer()


class AbStatsSerializer(serializers.Serializer):
    serve_run = serializers.IntegerField()
    confidence = serializers.FloatField()
    arms = ArmStatsSerializer(many=True)
    comparisons = ComparisonSerializer(many=True)


class AbQuery(serializers.Serializer):
    since = serializers.DateTimeField(required=False, help_text="Only sessions whose last turn is at or after")
    until = serializers.DateTimeField(required=False, help_text="Only sessions whose last turn is before")


class AbSplitSerializer(serializers.Serializer):
    deployment = serializers.IntegerField(
        min_value=1, max_value=2**63 - 1, allow_null=True, help_text="Arm b's deployment; null ends the split"
    )
    share = serializers.FloatField(
        required=False, default=0.5, min_value=0.0, max_value=1.0, help_text="Share of sessions arm b gets, in (0, 1)"
    )


class ServingViewSet(viewsets.GenericViewSet):
    """Serving runs (kind serve): the endpoint, what it serves, and its A/B statistics."""

    serializer_class = ServingRunSerializer
    capability_map = {"split": Capability.LAUNCH}

    def get_queryset(self) -> QuerySet[Run]:
        return selectors.serve_runs()

    def _payload(self, run: Run) -> dict[str, Any]:
        return {
            "run": RunSerializer(run).data,
            "endpoint": serve_endpoint_url(run),
            "model_name": str(run.spec.get("model_name", "")),
            "target": selectors.serve_target(run),
            "sessions": Session.objects.filter(serve_run=run).count(),
        }

    @extend_schema(responses=ServingRunSerializer(many=True))
    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response([self._payload(run) for run in page or []])

    @extend_schema(responses=ServingRunSerializer)
    def retrieve(self, request: Request, pk: str | None = None) -> Response:
        return Response(self._payload(get_object_or_404(self.get_queryset(), pk=pk)))

    @extend_schema(parameters=[AbQuery], responses=AbStatsSerializer)
    @action(detail=True, methods=["get"])
    def ab(self, request: Request, pk: str | None = None) -> Response:
        """Per arm: sessions, the edit-kept and dissatisfied follow-up rates (share of sessions with that signal;
        95% Wilson intervals), latency p50/p95 over turns (order-statistic intervals); each arm against arm "a":
        differences of the rates (Newcombe interval, two-proportion z-test) and of median latency (bootstrap
        interval, Mann-Whitney U)."""
        run = get_object_or_404(self.get_queryset(), pk=pk)
        window = query_params(request, AbQuery)
        return Response(selectors.ab_stats(run, since=window.get("since"), until=window.get("until")))

    @extend_schema(request=AbSplitSerializer, responses=ServingRunSerializer)
    @action(detail=True, methods=["put"])
    def split(self, request: Request, pk: str | None = None) -> Response:
        """Start or change the A/B split (arm b serves `deployment` to `share` of the sessions) or end it
        (deployment null); the replicas follow at their next poll."""
        run = get_object_or_404(self.get_queryset(), pk=pk)
        body = AbSplitSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        ab = None if data["deployment"] is None else {"deployment": data["deployment"], "share": data["share"]}
        return Response(self._payload(serve_split_update(run=run, ab=ab)))


router = AppRouter()  # controlplane.urls gathers every app's router into the one API root
router.register("sessions", SessionViewSet, basename="session")
router.register("serving", ServingViewSet, basename="serving")
urlpatterns = [
    path("sessions/<path:session_id>/feedback/", FeedbackView.as_view(), name="session-feedback"),
    path("serving/<int:run_id>/target/", target_view, name="serving-target"),
    path("serving/<int:run_id>/keys/verify/", keys_verify_view, name="serving-keys-verify"),
]
