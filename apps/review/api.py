from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.models import Capability, User
from apps.accounts.permissions import request_user
from apps.common.fields import JSONObjectField
from apps.common.params import id_field, query_params
from apps.common.routers import AppRouter
from apps.datasets.models import Dataset
from apps.review import services
from apps.review.models import (
    Flag,
    ItemStatus,
    Label,
    QueueItem,
    Review,
    ReviewAction,
    ReviewQueue,
    RewardDraft,
    Severity,
    TaskExclusion,
)
from apps.review.services.queues import MIN_LOCK_TIMEOUT_S
from workers.detectors.registry import detectors


class ReviewSerializer(serializers.ModelSerializer):
    reviewer: serializers.StringRelatedField[User] = serializers.StringRelatedField()

    class Meta:
        model = Review
        fields = ["id", "flag", "reviewer", "label", "note", "created_at"]
        read_only_fields = ["flag", "reviewer", "created_at"]


class FlagSerializer(serializers.ModelSerializer):
    reviews = ReviewSerializer(many=True, read_only=True)

    class Meta:
        model = Flag
        fields = [
            "id",
            "run",
            "trajectory_ref",
            "detector",
            "detector_version",
            "severity",
            "evidence",
            "step",
            "created_at",
            "reviews",
        ]


class RewardDraftSerializer(serializers.ModelSerializer):
    created_by: serializers.StringRelatedField[User] = serializers.StringRelatedField()
    decided_by: serializers.StringRelatedField[User] = serializers.StringRelatedField()

    class Meta:
        model = RewardDraft
        fields = [
            "id",
            "flag",
            "base_version",
            "proposed_spec",
            "reason",
            "status",
            "result_version",
            "created_by",
            "created_at",
            "decided_by",
            "decided_at",
        ]


class TaskExclusionSerializer(serializers.ModelSerializer):
    created_by: serializers.StringRelatedField[User] = serializers.StringRelatedField()

    class Meta:
        model = TaskExclusion
        fields = ["id", "dataset", "task_id", "flag", "reason", "created_by", "created_at"]


class ReviewActionSerializer(serializers.ModelSerializer):
    actor: serializers.StringRelatedField[User] = serializers.StringRelatedField()

    class Meta:
        model = ReviewAction
        fields = [
            "id",
            "kind",
            "flag",
            "actor",
            "created_at",
            "draft",
            "reward_version",
            "benchmark_version",
            "exclusion",
            "detail",
        ]


class PromoteSerializer(serializers.Serializer):
    benchmark = serializers.CharField(max_length=100, help_text="Benchmark to add the task to (created if new)")
    task_id = serializers.CharField(max_length=200, required=False, default="", help_text="When the trajectory is gone")


class PromotedSerializer(serializers.Serializer):
    benchmark_version = serializers.IntegerField(help_text="The new version holding the task")
    benchmark = serializers.CharField()
    number = serializers.IntegerField()


class ExcludeSerializer(serializers.Serializer):
    dataset = serializers.PrimaryKeyRelatedField(
        queryset=Dataset.objects.all(), required=False, default=None, help_text="Default: the run's dataset"
    )
    task_id = serializers.CharField(max_length=200, required=False, default="", help_text="When the trajectory is gone")
    reason = serializers.CharField(required=False, default="", allow_blank=True)


class FlagViewSet(viewsets.ReadOnlyModelViewSet):
    """Flags are read by everyone; only reviewers (and admins) judge them and act on confirmed hacks."""

    serializer_class = FlagSerializer
    queryset = Flag.objects.prefetch_related("reviews__reviewer").order_by("-created_at")
    capability_map = {
        "review": Capability.REVIEW,
        "reward_draft": Capability.REVIEW,
        "promote": Capability.REVIEW,
        "exclude": Capability.REVIEW,
    }

    @extend_schema(request=ReviewSerializer, responses={201: ReviewSerializer})
    @action(detail=True, methods=["post"])
    def review(self, request: Request, pk: str | None = None) -> Response:
        body = ReviewSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        review = services.review_submit(
            flag=self.get_object(),
            reviewer=request_user(request),
            label=body.validated_data["label"],
            note=body.validated_data.get("note", ""),
        )
        return Response(ReviewSerializer(review).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={201: RewardDraftSerializer})
    @action(detail=True, methods=["post"], url_path="reward-draft")
    def reward_draft(self, request: Request, pk: str | None = None) -> Response:
        """Draft the run's reward config with a penalty for this detector, left for an operator to accept."""
        draft = services.reward_draft_create(flag=self.get_object(), created_by=request_user(request))
        return Response(RewardDraftSerializer(draft).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=PromoteSerializer, responses={201: PromotedSerializer})
    @action(detail=True, methods=["post"], serializer_class=PromoteSerializer)
    def promote(self, request: Request, pk: str | None = None) -> Response:
        """Append the trajectory's task to a benchmark as a regression case (a new version, provenance review)."""
        body = PromoteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        version = services.task_promote(
            flag=self.get_object(),
            benchmark_name=body.validated_data["benchmark"],
            task_id=body.validated_data["task_id"],
            user=request_user(request),
        )
        return Response(
            {"benchmark_version": version.pk, "benchmark": version.benchmark.name, "number": version.number},
            status=status.HTTP_201_CREATED,
        )

    @extend_schema(request=ExcludeSerializer, responses={201: TaskExclusionSerializer})
    @action(detail=True, methods=["post"], serializer_class=ExcludeSerializer)
    def exclude(self, request: Request, pk: str | None = None) -> Response:
        """Exclude the trajectory's task from future training on its dataset."""
        body = ExcludeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        exclusion = services.task_exclude(flag=self.get_object(), user=request_user(request), **body.validated_data)
        return Response(TaskExclusionSerializer(exclusion).data, status=status.HTTP_201_CREATED)


class ReviewQueueSerializer(serializers.ModelSerializer):
    created_by: serializers.StringRelatedField[User] = serializers.StringRelatedField()
    min_severity = serializers.ChoiceField(choices=Severity.choices, required=False, default="", allow_blank=True)
    detector = serializers.ChoiceField(
        choices=sorted(detectors()), required=False, default="", allow_blank=True, help_text="Blank: any detector"
    )

    class Meta:
        model = ReviewQueue
        fields = [
            "id",
            "name",
            "description",
            "run",
            "detector",
            "min_severity",
            "required_reviews",
            "lock_timeout_s",
            "created_by",
            "created_at",
            "synced_at",
        ]
        read_only_fields = ["created_by", "created_at", "synced_at"]
        extra_kwargs: dict[str, dict[str, Any]] = {
            "name": {"validators": []},
            "required_reviews": {"min_value": 1},
            "lock_timeout_s": {"min_value": MIN_LOCK_TIMEOUT_S},
        }


class QueueItemSerializer(serializers.ModelSerializer):
    locked_by: serializers.StringRelatedField[User] = serializers.StringRelatedField()
    flag = FlagSerializer(read_only=True)

    class Meta:
        model = QueueItem
        fields = ["id", "queue", "flag", "run", "trajectory_ref", "status", "locked_by", "locked_until", "done_at"]


class LabelSerializer(serializers.Serializer):
    # The API field is named `label`; the stubs see it replace Field.label, but the serializer's metaclass takes
    # declared fields off the class, so at run time it does not.
    label = serializers.ChoiceField(choices=Label.choices)  # type: ignore[assignment]
    note = serializers.CharField(required=False, default="", allow_blank=True)


class SyncedSerializer(serializers.Serializer):
    added = serializers.IntegerField(help_text="Items queued by this sync")


class ReviewQueueViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Review queues: anyone reads them; reviewers create, sync and take items from them."""

    serializer_class = ReviewQueueSerializer
    queryset = ReviewQueue.objects.select_related("created_by").order_by("name")
    capability_map = {"create": Capability.REVIEW, "sync": Capability.REVIEW, "next": Capability.REVIEW}

    @extend_schema(responses={201: ReviewQueueSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        body = ReviewQueueSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        queue = services.queue_create(
            name=data["name"],
            description=data.get("description", ""),
            run_id=data["run"].pk if data.get("run") else None,
            detector=data.get("detector", ""),
            min_severity=data.get("min_severity", ""),
            required_reviews=data.get("required_reviews", 1),
            lock_timeout_s=data.get("lock_timeout_s", 900),
            created_by=request_user(request),
        )
        return Response(ReviewQueueSerializer(queue).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=SyncedSerializer)
    @action(detail=True, methods=["post"])
    def sync(self, request: Request, pk: str | None = None) -> Response:
        """Queue the flags that arrived since the last sync."""
        return Response({"added": services.queue_sync(queue=self.get_object())})

    @extend_schema(request=None, responses={200: QueueItemSerializer, 204: None})
    @action(detail=True, methods=["post"])
    def next(self, request: Request, pk: str | None = None) -> Response:
        """Claim and lock the next item you have not reviewed; 204 when none is left for you."""
        item = services.queue_next(queue=self.get_object(), reviewer=request_user(request))
        if item is None:
            return Response(status=status.HTTP_204_NO_CONTENT)
        return Response(QueueItemSerializer(item).data)


class ItemFilters(serializers.Serializer):
    queue = id_field("Only this queue's items")
    status = serializers.ChoiceField(choices=ItemStatus.choices, required=False, help_text="Only items in this state")


class QueueItemViewSet(viewsets.ReadOnlyModelViewSet):
    """Items of the queues (`?queue=<id>`, `?status=open|done`); the lock holder labels one."""

    serializer_class = QueueItemSerializer
    capability_map = {"label": Capability.REVIEW}

    def get_queryset(self) -> Any:
        items = QueueItem.objects.select_related("flag", "locked_by").prefetch_related("flag__reviews__reviewer")
        if self.action == "list":
            filters = query_params(self.request, ItemFilters)
            if "queue" in filters:
                items = items.filter(queue_id=filters["queue"])
            if "status" in filters:
                items = items.filter(status=filters["status"])
        return items.order_by("queue", "status", "-priority", "id")

    @extend_schema(parameters=[ItemFilters])
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)

    @extend_schema(request=LabelSerializer, responses={201: ReviewSerializer})
    @action(detail=True, methods=["post"], serializer_class=LabelSerializer)
    def label(self, request: Request, pk: str | None = None) -> Response:
        body = LabelSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        review = services.item_label(item=self.get_object(), reviewer=request_user(request), **body.validated_data)
        return Response(ReviewSerializer(review).data, status=status.HTTP_201_CREATED)


class AcceptSerializer(serializers.Serializer):
    spec = JSONObjectField(
        required=False, allow_null=True, default=None, help_text="Your edit of the proposed spec; omit to take it"
    )


class RewardDraftViewSet(viewsets.ReadOnlyModelViewSet):
    """Reward changes drafted from confirmed hacks; an operator accepts (a new reward version) or discards one."""

    serializer_class = RewardDraftSerializer
    queryset = RewardDraft.objects.select_related("created_by", "decided_by").order_by("-created_at")
    capability_map = {"accept": Capability.LAUNCH, "discard": Capability.LAUNCH}

    @extend_schema(request=AcceptSerializer, responses=RewardDraftSerializer)
    @action(detail=True, methods=["post"])
    def accept(self, request: Request, pk: str | None = None) -> Response:
        """Create the next reward config version from the draft, or from `spec` (your edit of it) when given."""
        body = AcceptSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        spec = body.validated_data.get("spec")
        draft = services.reward_draft_accept(draft=self.get_object(), user=request_user(request), spec=spec)
        return Response(RewardDraftSerializer(draft).data)

    @extend_schema(request=None, responses=RewardDraftSerializer)
    @action(detail=True, methods=["post"])
    def discard(self, request: Request, pk: str | None = None) -> Response:
        draft = services.reward_draft_discard(draft=self.get_object(), user=request_user(request))
        return Response(RewardDraftSerializer(draft).data)


class ActionFilters(serializers.Serializer):
    flag = id_field("Only what reviews of this flag led to")


class ReviewActionViewSet(viewsets.ReadOnlyModelViewSet):
    """What reviews led to, who did it and when (`?flag=<id>`)."""

    serializer_class = ReviewActionSerializer

    def get_queryset(self) -> Any:
        actions = ReviewAction.objects.select_related("actor").order_by("-created_at", "-id")
        if self.action == "list" and "flag" in (filters := query_params(self.request, ActionFilters)):
            actions = actions.filter(flag_id=filters["flag"])
        return actions

    @extend_schema(parameters=[ActionFilters])
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().list(request, *args, **kwargs)


class TaskExclusionViewSet(viewsets.ReadOnlyModelViewSet):
    """Tasks kept out of training after review, per dataset."""

    serializer_class = TaskExclusionSerializer
    queryset = TaskExclusion.objects.select_related("created_by").order_by("-created_at")


router = AppRouter()  # controlplane.urls gathers every app's router into the one API root
router.register("flags", FlagViewSet, basename="flag")
router.register("review-queues", ReviewQueueViewSet, basename="review-queue")
router.register("review-items", QueueItemViewSet, basename="review-item")
router.register("reward-drafts", RewardDraftViewSet, basename="reward-draft")
router.register("review-actions", ReviewActionViewSet, basename="review-action")
router.register("task-exclusions", TaskExclusionViewSet, basename="task-exclusion")
