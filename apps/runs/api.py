from __future__ import annotations

from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.models import Capability
from apps.benchmarks.models import BenchmarkVersion
from apps.datasets.models import DatasetVersion
from apps.rewards.models import RewardConfigVersion
from apps.runs import selectors, services
from apps.runs.models import Run, TrajectorySummary


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
        ]


class LaunchSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(
        choices=["rescore", "train", "sft"],
        help_text="Run kinds launched here (index and datagen: /search-indexes/, /datagen/)",
    )
    dataset_version = serializers.PrimaryKeyRelatedField(queryset=DatasetVersion.objects.select_related("dataset"))
    reward_version = serializers.PrimaryKeyRelatedField(queryset=RewardConfigVersion.objects.all())
    name = serializers.CharField(required=False, allow_blank=True, default="", max_length=200)
    tags = serializers.ListField(child=serializers.CharField(max_length=50), required=False, default=list)
    config = serializers.JSONField(
        required=False,
        default=dict,
        help_text="kind=train: the training config (workers.rl.config.TrainConfig); omitted fields take defaults",
    )
    corpus_version = serializers.PrimaryKeyRelatedField(
        queryset=DatasetVersion.objects.select_related("dataset"),
        required=False,
        allow_null=True,
        default=None,
        help_text="kind=train with environment 'search': the corpus version whose index the agent searches",
    )
    auto_eval = serializers.PrimaryKeyRelatedField(
        many=True,
        queryset=BenchmarkVersion.objects.all(),
        required=False,
        default=list,
        help_text="kind=train: benchmark versions every new checkpoint is evaluated on (results on the run page)",
    )
    allow_contamination = serializers.BooleanField(
        default=False,
        help_text="Launch even if the tasks overlap a benchmark that gates deployments; the run is flagged instead",
    )
    allow_excluded = serializers.BooleanField(
        default=False,
        help_text="kind=train: launch although reviewers excluded some of the tasks; those tasks are left out",
    )


class TrajectorySerializer(serializers.ModelSerializer):
    class Meta:
        model = TrajectorySummary
        fields = ["trajectory_id", "task_id", "step", "reward", "terms", "num_turns", "error", "storage_uri"]


class RunViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = RunSerializer
    capability_map = {"create": Capability.LAUNCH, "cancel": Capability.LAUNCH, "resume": Capability.LAUNCH}

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
        common = {
            "created_by": request.user,
            "dataset_version": data["dataset_version"],
            "reward_version": data["reward_version"],
            "name": data["name"],
            "tags": data["tags"],
        }
        if data["kind"] == "train":
            if not isinstance(data["config"], dict):
                raise ValidationError({"config": ["must be a JSON object of training settings"]})
            run = services.run_launch_train(
                **common,
                config=data["config"],
                corpus_version=data["corpus_version"],
                auto_eval=data["auto_eval"],
                allow_contamination=data["allow_contamination"],
                allow_excluded=data["allow_excluded"],
            )
        elif data["kind"] == "sft":
            if not isinstance(data["config"], dict):
                raise ValidationError(
                    {"config": ["must be a JSON object of SFT settings (workers.jobs.sft.SFTConfig)"]}
                )
            run = services.run_launch_sft(
                **common,
                config=data["config"],
                corpus_version=data["corpus_version"],
                allow_contamination=data["allow_contamination"],
            )
        else:
            run = services.run_launch_rescore(**common)
        return Response(RunSerializer(run).data, status=status.HTTP_201_CREATED)

    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str | None = None) -> Response:
        """Continue a stopped or failed training run from its latest checkpoint, as a new run linked to it."""
        run = services.run_resume(run=self.get_object(), user=request.user)
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
        """Non-metric events in commit order (metrics: see `metrics`). Start with no parameters; then pass back
        `next` while it is not null, and after that poll with `after_batch` = the `cursor` you were given."""
        run = self.get_object()
        position: dict[str, int | None] = {"after_batch": 0, "after_seq": None}
        for param in position:
            if param not in request.query_params:
                continue
            try:
                position[param] = int(request.query_params[param])
            except ValueError:
                raise ValidationError({param: ["must be a whole number (from `next` or `cursor` of the last reply)"]})
        run, events, more = selectors.run_events_after(
            run_id=run.pk, after_batch=position["after_batch"] or 0, after_seq=position["after_seq"], limit=1000
        )
        return Response(
            {
                "events": events,
                "next": {"after_batch": more[0], "after_seq": more[1]} if more else None,
                "cursor": run.ingest_batches,
                "last_seq": run.last_seq,
            }
        )

    @action(detail=True, methods=["get"])
    def trajectories(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        page = self.paginate_queryset(run.trajectories.order_by("id"))
        return self.get_paginated_response(TrajectorySerializer(page, many=True).data)
