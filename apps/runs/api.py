from __future__ import annotations

from django.db import transaction
from django.db.models import QuerySet
from django.urls import path
from drf_spectacular.utils import PolymorphicProxySerializer, extend_schema, extend_schema_field
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts.models import Capability, User
from apps.accounts.permissions import request_user
from apps.common.params import query_params
from apps.common.routers import AppRouter
from apps.runs import kinds, selectors, services
from apps.runs.health import HEALTH_STATUSES, run_health
from apps.runs.ingest import ingest_file_view, ingest_view
from apps.runs.learning import learning_view, run_learning
from apps.runs.models import Run, RunStatus, TrajectorySummary
from apps.runs.selectors_list import LEARNING_EVAL, LEARNING_FILTERS, LEARNING_REWARD, learning_filter


class LearningRewardSerializer(serializers.Serializer):
    steps = serializers.IntegerField(help_text="Points fitted (steps; bucket means past 1,000 steps)")
    verdict = serializers.ChoiceField(choices=[*LEARNING_REWARD, "unknown"], help_text="improving: the CI is above 0")
    slope = serializers.FloatField(allow_null=True, help_text="reward_mean per step, least squares")
    ci = serializers.ListField(
        child=serializers.FloatField(), allow_null=True, help_text="The slope's 95% interval (Student's t)"
    )
    start = serializers.FloatField(required=False, help_text="The fitted line at the first step")
    end = serializers.FloatField(required=False, help_text="The fitted line at the last step")
    first_mean = serializers.FloatField(required=False, help_text="Mean reward of the first `window` points")
    last_mean = serializers.FloatField(required=False, help_text="Mean reward of the last `window` points")
    window = serializers.IntegerField(required=False)


class LearningSignalSerializer(serializers.Serializer):
    share = serializers.FloatField(allow_null=True, help_text="Share of groups whose rewards were not all equal")
    groups = serializers.IntegerField(help_text="Groups counted over the run")
    basis = serializers.ChoiceField(
        choices=["learner", "dynamic_sampling", "not recorded"],
        help_text="learner: signal_groups / groups; dynamic_sampling: 1 - filtered / generated groups",
    )


class LearningSideSerializer(serializers.Serializer):
    eval = serializers.IntegerField()
    score = serializers.FloatField(help_text="Mean task score over the paired tasks")
    model = serializers.CharField(required=False)
    step = serializers.IntegerField(required=False)


class LearningEvalSerializer(serializers.Serializer):
    verdict = serializers.ChoiceField(choices=LEARNING_EVAL, help_text="At alpha, from the paired test's p-value")
    benchmark_version = serializers.IntegerField()
    benchmark = serializers.CharField()
    metric = serializers.CharField()
    n = serializers.IntegerField(help_text="Tasks paired")
    base = LearningSideSerializer(help_text="The eval of what the run starts from")
    checkpoint = LearningSideSerializer(help_text="The eval of its last evaluated checkpoint")
    diff = serializers.FloatField(help_text="Mean paired difference, checkpoint - base")
    ci = serializers.ListField(child=serializers.FloatField(), help_text="Its 95% paired-bootstrap interval")
    p_value = serializers.FloatField(help_text="Two-sided: exact McNemar (0/1 scores) or sign test")
    test = serializers.CharField()
    alpha = serializers.FloatField()


class LearningSerializer(serializers.Serializer):
    """Did it learn? (docs/did-it-learn.md)"""

    line = serializers.CharField(help_text="The whole answer in one line, as the run page heads with it")
    reward = LearningRewardSerializer(allow_null=True, help_text="The reward trend; null before the first step")
    signal = LearningSignalSerializer()
    eval = LearningEvalSerializer(allow_null=True, help_text="The first benchmark's verdict; null until both evals")
    evals = LearningEvalSerializer(many=True, help_text="A verdict per benchmark version evaluated")
    eval_pending = serializers.CharField(help_text="Why there is no verdict yet ('' when there is)")


class RunSerializer(serializers.ModelSerializer):
    created_by: serializers.StringRelatedField[User] = serializers.StringRelatedField()
    progress = serializers.FloatField(source="progress_fraction", read_only=True)
    queue_position = serializers.SerializerMethodField(help_text="1 = next to start; null unless queued")
    learning = serializers.SerializerMethodField(
        help_text="Did it learn? Live on a single run; as last stored (with health) in lists"
    )

    def get_queue_position(self, run: Run) -> int | None:
        return selectors.queue_position(run)

    @extend_schema_field(LearningSerializer)
    def get_learning(self, run: Run) -> dict[str, object]:
        view = self.context.get("view")
        if getattr(view, "action", None) == "retrieve":
            return run_learning(run)
        return learning_view(run.learning or {}, run.learning or {})

    class Meta:
        model = Run
        fields = [
            "id",
            "kind",
            "name",
            "status",
            "queue_position",
            "queued_reason",
            "priority",
            "resources",
            "spec",
            "dataset_version",
            "reward_version",
            "tags",
            "parent",
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
            "last_event_at",
            "stalled_at",
            "health",
            "health_problems",
            "learning",
            "stall_report",
        ]


def _launch_inputs() -> dict[str, serializers.Serializer | type[serializers.Serializer]]:
    inputs: dict[str, serializers.Serializer | type[serializers.Serializer]] = {}
    for kind, handler in kinds.launchable().items():
        assert handler.launch_input is not None  # kinds.register: a kind with a launch has a launch input
        inputs[kind] = handler.launch_input
    return inputs


# The body of POST /runs/ is the launch input of the kind it names; evaluated when the schema is generated, after
# every app registered its kinds.
LaunchRequestSerializer = PolymorphicProxySerializer(
    component_name="RunLaunch",
    serializers=_launch_inputs,
    resource_type_field_name="kind",
)


class TrajectorySerializer(serializers.ModelSerializer):
    class Meta:
        model = TrajectorySummary
        fields = ["trajectory_id", "task_id", "step", "reward", "terms", "num_turns", "error", "storage_uri"]


class RunFilters(serializers.Serializer):
    status = serializers.ChoiceField(choices=RunStatus.choices, required=False, help_text="Only runs in this state")
    kind = serializers.CharField(
        required=False, max_length=16, help_text="Only runs of this kind (any registered kind: train, serve, ...)"
    )

    stalled = serializers.BooleanField(
        required=False, allow_null=True, default=None, help_text="true: only runs the stall watchdog marked stalled"
    )
    health = serializers.ChoiceField(
        choices=HEALTH_STATUSES, required=False, help_text="Only runs whose health panel is at this status"
    )
    learning = serializers.ChoiceField(
        choices=LEARNING_FILTERS,
        required=False,
        help_text="Only runs whose reward trend (improving, flat, worsening) or held-out verdict (better, "
        "no_difference, worse) is this, as last stored",
    )

    def validate_kind(self, value: str) -> str:
        known = [handler.kind for handler in kinds.handlers()]
        if value not in known:
            raise serializers.ValidationError(f"unknown kind {value!r}; choose one of: {', '.join(known)}")
        return value


class MetricsQuery(serializers.Serializer):
    name = serializers.CharField(required=False, max_length=200, help_text="A metric name; none lists the names")
    max_points = serializers.IntegerField(
        min_value=10, max_value=5000, default=1000, help_text="At most this many buckets in the series"
    )


class HealthSignalSerializer(serializers.Serializer):
    key = serializers.CharField()
    title = serializers.CharField()
    status = serializers.ChoiceField(choices=HEALTH_STATUSES)
    value = serializers.FloatField(allow_null=True)
    shown = serializers.CharField()
    threshold = serializers.CharField()
    meaning = serializers.CharField()


class HealthSerializer(serializers.Serializer):
    """Is the run healthy (each signal against its threshold, over the last `window` steps) and is it learning
    (the reward's slope per step with its 95% confidence interval; held-out evals first to last)?"""

    status = serializers.ChoiceField(choices=HEALTH_STATUSES, help_text="The worst known signal")
    signals = HealthSignalSerializer(many=True)
    problems = serializers.ListField(child=serializers.CharField())
    trend = serializers.DictField()
    window = serializers.IntegerField()


class MetricsSerializer(serializers.Serializer):
    """Without `name`: the metric names. With it: the series, downsampled to buckets (min, mean, max of each)."""

    names = serializers.ListField(child=serializers.CharField(), required=False)
    name = serializers.CharField(required=False)
    steps = serializers.ListField(child=serializers.IntegerField(), required=False)
    mean = serializers.ListField(child=serializers.FloatField(), required=False)
    min = serializers.ListField(child=serializers.FloatField(), required=False)
    max = serializers.ListField(child=serializers.FloatField(), required=False)
    count = serializers.IntegerField(required=False, help_text="Points in the series")
    last_seq = serializers.IntegerField()


class EventsQuery(serializers.Serializer):
    after_batch = serializers.IntegerField(
        min_value=0, required=False, help_text="`cursor` (or `next.after_batch`) of the last reply"
    )
    after_seq = serializers.IntegerField(min_value=0, required=False, help_text="`next.after_seq` of the last reply")


class EventsPositionSerializer(serializers.Serializer):
    after_batch = serializers.IntegerField()
    after_seq = serializers.IntegerField()


class EventsSerializer(serializers.Serializer):
    events = serializers.ListField(child=serializers.DictField(), help_text="Each event with its `seq`")
    next = EventsPositionSerializer(allow_null=True, help_text="Pass back while not null: more events are waiting")
    cursor = serializers.IntegerField(help_text="Poll with after_batch = this")
    last_seq = serializers.IntegerField()


class PrioritySerializer(serializers.Serializer):
    priority = serializers.IntegerField(
        min_value=-10, max_value=10, default=0, help_text="Queue order, higher first; above 0 needs the admin role"
    )


def _checked_priority(request: Request) -> int:
    data = request.data if isinstance(request.data, dict) else {}
    body = PrioritySerializer(data={"priority": data.get("priority", 0)})
    body.is_valid(raise_exception=True)
    priority: int = body.validated_data["priority"]
    if priority > 0 and not request_user(request).can(Capability.ADMIN):
        raise PermissionDenied("priority above 0 puts a run ahead of other people's: only admins may set it")
    return priority


class RunViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = RunSerializer
    capability_map = {"create": Capability.LAUNCH, "cancel": Capability.LAUNCH, "priority": Capability.LAUNCH}

    def get_queryset(self) -> QuerySet[Run]:
        qs = selectors.run_list()
        if self.action == "list":
            filters = query_params(self.request, RunFilters)
            stalled = filters.pop("stalled", None)
            learning = filters.pop("learning", None)
            qs = qs.filter(**filters)
            if learning:
                qs = qs.filter(**learning_filter(learning))
            if stalled is not None:
                qs = qs.filter(stalled_at__isnull=not stalled)
        return qs

    @extend_schema(parameters=[RunFilters])
    def list(self, request: Request, *args: object, **kwargs: object) -> Response:
        return super().list(request, *args, **kwargs)

    @extend_schema(request=LaunchRequestSerializer, responses={201: RunSerializer})
    def create(self, request: Request) -> Response:
        """Launch a run of a kind whose app registered an API launch (apps.runs.kinds); the body is that kind's
        launch input. Other kinds have their own endpoints (index: /search-indexes/, datagen: /datagen/,
        eval: /evals/)."""
        launchable = kinds.launchable()
        kind = request.data.get("kind") if isinstance(request.data, dict) else None
        if kind not in launchable:
            raise ValidationError(
                {"kind": [f"{kind!r} is not a run kind launched here; choose one of {', '.join(launchable)}"]}
            )
        handler = launchable[kind]
        assert handler.launch_input is not None and handler.launch is not None
        priority = _checked_priority(request)
        body = handler.launch_input(data=request.data)
        body.is_valid(raise_exception=True)
        with transaction.atomic():  # the priority is set before the dispatch that follows the commit
            run = handler.launch(request_user(request), body.validated_data)
            if priority:
                run = services.run_set_priority(run=run, priority=priority)
        return Response(RunSerializer(run).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=PrioritySerializer, responses={200: RunSerializer})
    @action(detail=True, methods=["post"])
    def priority(self, request: Request, pk: str | None = None) -> Response:
        """Move a queued or pending run in the queue (higher first); the queue is re-read at once."""
        run = self.get_object()
        priority = _checked_priority(request)
        if run.created_by_id != request_user(request).pk and not request_user(request).can(Capability.ADMIN):
            raise PermissionDenied("only the run's owner or an admin may change its priority")
        run = services.run_set_priority(run=run, priority=priority)
        return Response(RunSerializer(run).data)

    @extend_schema(request=None, responses={202: RunSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        run = services.run_cancel(run=self.get_object(), user=request_user(request))
        return Response(RunSerializer(run).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(parameters=[MetricsQuery], responses=MetricsSerializer)
    @action(detail=True, methods=["get"])
    def metrics(self, request: Request, pk: str | None = None) -> Response:
        """`?name=reward_mean&max_points=1000` gives one downsampled series; no name lists the names."""
        run = self.get_object()
        query = query_params(request, MetricsQuery)
        name, max_points = query.get("name"), query["max_points"]
        if not name:
            return Response({"names": selectors.metric_names(run_id=run.pk), "last_seq": run.last_seq})
        return Response(
            {**selectors.metric_series(run_id=run.pk, name=name, max_points=max_points), "last_seq": run.last_seq}
        )

    @extend_schema(responses=HealthSerializer)
    @action(detail=True, methods=["get"])
    def health(self, request: Request, pk: str | None = None) -> Response:
        """The run's health panel: docs/tours/run-health.md."""
        return Response(run_health(self.get_object()))

    @extend_schema(parameters=[EventsQuery], responses=EventsSerializer)
    @action(detail=True, methods=["get"])
    def events(self, request: Request, pk: str | None = None) -> Response:
        """Non-metric events in commit order (metrics: see `metrics`). Start with no parameters; then pass back
        `next` while it is not null, and after that poll with `after_batch` = the `cursor` you were given."""
        run = self.get_object()
        position = query_params(request, EventsQuery)
        run, events, more = selectors.run_events_after(
            run_id=run.pk, after_batch=position.get("after_batch", 0), after_seq=position.get("after_seq"), limit=1000
        )
        return Response(
            {
                "events": events,
                "next": {"after_batch": more[0], "after_seq": more[1]} if more else None,
                "cursor": run.ingest_batches,
                "last_seq": run.last_seq,
            }
        )

    @extend_schema(responses=TrajectorySerializer(many=True))
    @action(detail=True, methods=["get"])
    def trajectories(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        page = self.paginate_queryset(run.trajectories.order_by("id"))
        return self.get_paginated_response(TrajectorySerializer(page, many=True).data)


class ClusterNodeSerializer(serializers.Serializer):
    node_id = serializers.CharField()
    ip = serializers.CharField()
    alive = serializers.BooleanField()
    head = serializers.BooleanField()
    resources = serializers.DictField(child=serializers.FloatField())
    used = serializers.DictField(child=serializers.FloatField(), help_text="What its alive actors hold")
    actors = serializers.ListField(child=serializers.DictField())


class ClusterSerializer(serializers.Serializer):
    address = serializers.CharField()
    error = serializers.CharField(help_text="Why Ray did not answer; empty when it did")
    capacity = serializers.DictField(child=serializers.FloatField(), allow_null=True)
    capacity_source = serializers.CharField()
    nodes = ClusterNodeSerializer(many=True)
    queued = serializers.ListField(child=serializers.DictField())


class ClusterView(APIView):
    @extend_schema(responses=ClusterSerializer)
    def get(self, request: Request) -> Response:
        """The Ray cluster's nodes, what each holds and for which run, and the run queue."""
        view = selectors.cluster_overview()
        nodes = [
            {
                "node_id": row["node"].node_id,
                "ip": row["node"].ip,
                "alive": row["node"].alive,
                "head": row["node"].head,
                "resources": row["resources"],
                "used": row["used"],
                "actors": [
                    {
                        "class_name": a["actor"].class_name,
                        "pid": a["actor"].pid,
                        "resources": a["resources"],
                        "run": a["run"].pk if a["run"] else None,
                    }
                    for a in row["actors"]
                ],
            }
            for row in view["nodes"]
        ]
        queued = [
            {
                "id": run.pk,
                "position": i,
                "priority": run.priority,
                "needs": run.resources.get("text", ""),
                "reason": run.queued_reason,
            }
            for i, run in enumerate(view["queued"], start=1)
        ]
        body = {**{k: view[k] for k in ("address", "error", "capacity", "capacity_source")}, "nodes": nodes}
        return Response({**body, "queued": queued})


router = AppRouter()  # controlplane.urls gathers every app's router into the one API root
router.register("runs", RunViewSet, basename="run")
urlpatterns = [
    path("runs/<int:run_id>/ingest/", ingest_view, name="run-ingest"),
    path("runs/<int:run_id>/ingest/files/<str:name>", ingest_file_view, name="run-ingest-file"),
    path("cluster/", ClusterView.as_view(), name="cluster"),
]
