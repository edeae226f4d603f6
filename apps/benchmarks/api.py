from __future__ import annotations

import json
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.parsers import JSONParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.models import Capability, User
from apps.accounts.permissions import request_user
from apps.benchmarks import selectors, services
from apps.benchmarks.models import Benchmark, BenchmarkTask, BenchmarkVersion, Eval, TaskProvenance
from apps.common.fields import JSONObjectField
from apps.common.params import id_field, query_params
from apps.common.routers import AppRouter
from apps.datasets.models import DatasetVersion
from apps.runs.models import Checkpoint, TaskResult
from workers.envs.registry import ENVIRONMENTS

MAX_TASKS_UPLOAD_BYTES = 64 * 1024 * 1024


class BenchmarkSerializer(serializers.ModelSerializer):
    owner: serializers.StringRelatedField[User] = serializers.StringRelatedField()
    environment = serializers.ChoiceField(
        choices=sorted(ENVIRONMENTS),
        help_text="Environment the tasks run in (workers.envs.registry)",
        error_messages={
            "invalid_choice": f"unknown environment {{input!r}}; choose one of: {', '.join(sorted(ENVIRONMENTS))}"
        },
    )

    class Meta:
        model = Benchmark
        fields = ["id", "name", "description", "environment", "metric", "score_field", "owner", "created_at"]
        read_only_fields = ["owner", "created_at"]
        extra_kwargs = {
            "metric": {"required": False, "help_text": "Headline metric; default by environment (coding: pass@1)"},
            "score_field": {"required": False, "help_text": "Scores one attempt; default by environment"},
        }


class BenchmarkVersionSerializer(serializers.ModelSerializer):
    benchmark_name = serializers.CharField(source="benchmark.name", read_only=True)
    excluded_training_data: serializers.PrimaryKeyRelatedField[DatasetVersion] = serializers.PrimaryKeyRelatedField(
        many=True, read_only=True
    )

    class Meta:
        model = BenchmarkVersion
        fields = [
            "id",
            "benchmark",
            "benchmark_name",
            "number",
            "content_hash",
            "env_params",
            "task_count",
            "excluded_training_data",
            "notes",
            "created_at",
        ]


class VersionCreateSerializer(serializers.Serializer):
    """What POST /benchmarks/{id}/versions/ reads, from a JSON body (`tasks`) or a multipart form (`file`)."""

    tasks = serializers.JSONField(required=False, help_text="A list of task rows (or upload `file`, JSONL)")
    file = serializers.FileField(required=False, help_text="Task rows as JSONL, one per line")
    env_params = JSONObjectField(required=False, default=dict)
    provenance = serializers.ChoiceField(choices=TaskProvenance.choices, default=TaskProvenance.HAND_WRITTEN)
    source_ref = serializers.CharField(required=False, allow_blank=True, default="", max_length=300)
    excluded_training_data = serializers.PrimaryKeyRelatedField(
        many=True, queryset=DatasetVersion.objects.all(), required=False, default=list
    )
    notes = serializers.CharField(required=False, allow_blank=True, default="")
    corpus_version = serializers.PrimaryKeyRelatedField(
        queryset=DatasetVersion.objects.select_related("dataset"),
        required=False,
        allow_null=True,
        default=None,
        help_text="Search benchmarks: the corpus version whose ready index the tasks search (pinned in env_params)",
    )
    dataset_version = serializers.PrimaryKeyRelatedField(
        queryset=DatasetVersion.objects.select_related("dataset"),
        required=False,
        allow_null=True,
        default=None,
        help_text=(
            "Take the task rows from this tasks or repo_tasks dataset version (e.g. the test part of a split) instead "
            "of `tasks` or `file`; the version is added to the training data the benchmark must never see"
        ),
    )


class VersionJsonSerializer(VersionCreateSerializer):
    """The JSON body: the task rows inline."""

    tasks = serializers.ListField(  # type: ignore[assignment]
        child=JSONObjectField(), min_length=1, help_text="The task rows"
    )
    file = None  # type: ignore[assignment]


class VersionUploadSerializer(VersionCreateSerializer):
    """The multipart form: the task rows as a JSONL file."""

    tasks = None  # type: ignore[assignment]
    file = serializers.FileField(help_text="Task rows as JSONL, one per line")


def _rows_from_jsonl(data: bytes) -> list[Any]:
    rows: list[Any] = []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValidationError({"file": [f"line {number}: not valid JSON ({exc}); write one JSON object per line"]})
    return rows


class BenchmarkViewSet(viewsets.ModelViewSet):
    """Benchmarks: reading needs `read`; creating one or adding a version needs `launch`. Versions are immutable:
    there is no update or delete."""

    serializer_class = BenchmarkSerializer
    queryset = Benchmark.objects.select_related("owner").order_by("name")
    http_method_names = ["get", "post", "head", "options"]

    def perform_create(self, serializer: Any) -> None:
        data = serializer.validated_data
        serializer.instance = services.benchmark_create(
            name=data["name"],
            environment=data["environment"],
            metric=data.get("metric", ""),
            score_field=data.get("score_field", ""),
            description=data.get("description", ""),
            owner=request_user(self.request),
        )

    @extend_schema(
        request={"application/json": VersionJsonSerializer, "multipart/form-data": VersionUploadSerializer},
        responses={200: BenchmarkVersionSerializer, 201: BenchmarkVersionSerializer},
    )
    @action(detail=True, methods=["post"], parser_classes=[JSONParser, MultiPartParser])
    def versions(self, request: Request, pk: str | None = None) -> Response:
        """Add a version: `tasks` (a JSON list) or `file` (JSONL). The same content as an existing version
        returns that version with 200 instead of 201."""
        benchmark = self.get_object()
        body = VersionCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        upload = data.get("file")
        source = data.get("dataset_version")
        given = [name for name in ("tasks", "file", "dataset_version") if data.get(name) is not None]
        if len(given) > 1:
            raise ValidationError({given[1]: [f"send one of `tasks`, `file` or `dataset_version`, not {given}"]})
        excluded = list(data["excluded_training_data"])
        if source is not None:
            tasks = services.benchmark_rows_from_dataset(source)
            excluded = [*excluded, source] if source not in excluded else excluded
        elif upload is not None:
            if upload.size > MAX_TASKS_UPLOAD_BYTES:
                raise ValidationError(
                    {"file": [f"{upload.size} bytes is over the {MAX_TASKS_UPLOAD_BYTES}-byte limit"]}
                )
            tasks = _rows_from_jsonl(upload.read())
        else:
            tasks = data.get("tasks")
            if not isinstance(tasks, list):
                raise ValidationError({"tasks": ["send a JSON list of task rows, or upload `file` as JSONL"]})
        version, created = services.benchmark_version_create(
            benchmark=benchmark,
            tasks=tasks,
            created_by=request_user(request),
            env_params=data["env_params"],
            provenance=data["provenance"],
            source_ref=data["source_ref"],
            excluded_training_data=excluded,
            notes=data["notes"],
            corpus_version=data["corpus_version"],
        )
        return Response(
            BenchmarkVersionSerializer(version).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK
        )


class BenchmarkTaskSerializer(serializers.ModelSerializer):
    class Meta:
        model = BenchmarkTask
        fields = ["task_id", "payload", "tags", "difficulty", "provenance", "source_ref"]


class BenchmarkVersionViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = BenchmarkVersionSerializer
    queryset = (
        BenchmarkVersion.objects.select_related("benchmark")
        .prefetch_related("excluded_training_data")
        .order_by("-created_at")
    )

    @extend_schema(responses=BenchmarkTaskSerializer(many=True))
    @action(detail=True, methods=["get"])
    def tasks(self, request: Request, pk: str | None = None) -> Response:
        version = self.get_object()
        page = self.paginate_queryset(version.tasks.order_by("task_id"))
        return self.get_paginated_response(BenchmarkTaskSerializer(page, many=True).data)


class EvalSerializer(serializers.ModelSerializer):
    status = serializers.CharField(source="run.status", read_only=True)
    progress_done = serializers.IntegerField(source="run.progress_done", read_only=True)
    progress_total = serializers.IntegerField(source="run.progress_total", read_only=True)
    failure_reason = serializers.CharField(source="run.failure_reason", read_only=True)
    benchmark = serializers.CharField(source="benchmark_version.benchmark.name", read_only=True)
    model = serializers.CharField(source="model_label", read_only=True)

    class Meta:
        model = Eval
        fields = [
            "id",
            "run",
            "benchmark",
            "benchmark_version",
            "checkpoint",
            "base_model",
            "model",
            "k",
            "status",
            "progress_done",
            "progress_total",
            "failure_reason",
            "metrics",
            "created_at",
        ]


class EvalCreateSerializer(serializers.Serializer):
    benchmark_version = serializers.PrimaryKeyRelatedField(
        queryset=BenchmarkVersion.objects.select_related("benchmark")
    )
    checkpoint = serializers.PrimaryKeyRelatedField(
        queryset=Checkpoint.objects.select_related("run"), required=False, allow_null=True, default=None
    )
    base_model = serializers.CharField(required=False, allow_blank=True, default="", max_length=300)
    k = serializers.IntegerField(min_value=1, max_value=100, default=1)
    temperature = serializers.FloatField(min_value=0.0, max_value=2.0, required=False, allow_null=True, default=None)
    max_new_tokens = serializers.IntegerField(min_value=1, max_value=32768, default=384)
    reuse = serializers.BooleanField(default=True)


class TaskResultSerializer(serializers.ModelSerializer):
    class Meta:
        model = TaskResult
        fields = ["task_id", "samples", "passed", "score", "outcomes", "trajectory_ids"]


class EvalFilters(serializers.Serializer):
    benchmark_version = id_field("Only evals on this benchmark version")
    checkpoint = id_field("Only evals of this checkpoint")
    run = id_field("Only the eval of this eval run")


@extend_schema_field(
    {"type": "number", "minimum": 0, "maximum": 0.5, "exclusiveMinimum": True, "exclusiveMaximum": True}
)
class AlphaField(serializers.FloatField):
    """A significance level: strictly between 0 and 0.5 (apps.benchmarks.selectors.eval_compare)."""


class CompareQuery(serializers.Serializer):
    before = serializers.IntegerField(min_value=1, max_value=2**63 - 1, help_text="The eval compared from")
    after = serializers.IntegerField(min_value=1, max_value=2**63 - 1, help_text="The eval compared to")
    slice_by = serializers.RegexField(
        r"^((tag|difficulty|source)(,(tag|difficulty|source))*)?$",
        required=False,
        default="",
        allow_blank=True,
        help_text="Comma-separated slices: tag, difficulty, source",
    )
    alpha = AlphaField(required=False, default=0.05, help_text="Significance level of the paired test")


class EvalSideSerializer(serializers.Serializer):
    eval = serializers.IntegerField()
    model = serializers.CharField()
    benchmark_version = serializers.IntegerField()


class TaskDiffSerializer(serializers.Serializer):
    task_id = serializers.CharField()
    before = serializers.FloatField()
    after = serializers.FloatField()
    diff = serializers.FloatField()


class CompareSerializer(serializers.Serializer):
    before = EvalSideSerializer()
    after = EvalSideSerializer()
    alpha = serializers.FloatField()
    comparison = serializers.DictField(help_text="workers.evals.paired.compare_paired: overall and per slice")
    tasks = TaskDiffSerializer(many=True)


class EvalViewSet(viewsets.ReadOnlyModelViewSet):
    """Evals: `launch` starts one (or reuses a matching one: 200 instead of 201); reads need `read`."""

    serializer_class = EvalSerializer
    capability_map = {"create": Capability.LAUNCH}

    def get_queryset(self) -> QuerySet[Eval]:
        qs = Eval.objects.select_related("run", "benchmark_version__benchmark", "checkpoint").order_by("-created_at")
        if self.action == "list":
            qs = qs.filter(**{f"{param}_id": value for param, value in query_params(self.request, EvalFilters).items()})
        return qs

    @extend_schema(parameters=[EvalFilters])
    def list(self, request: Request, *args: object, **kwargs: object) -> Response:
        return super().list(request, *args, **kwargs)

    @extend_schema(request=EvalCreateSerializer, responses={200: EvalSerializer, 201: EvalSerializer})
    def create(self, request: Request) -> Response:
        body = EvalCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        evaluation, created = services.eval_launch(created_by=request_user(request), **body.validated_data)
        return Response(
            EvalSerializer(evaluation).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK
        )

    @extend_schema(responses=TaskResultSerializer(many=True))
    @action(detail=True, methods=["get"])
    def tasks(self, request: Request, pk: str | None = None) -> Response:
        evaluation = self.get_object()
        page = self.paginate_queryset(TaskResult.objects.filter(run_id=evaluation.run_id).order_by("task_id"))
        return self.get_paginated_response(TaskResultSerializer(page, many=True).data)

    @extend_schema(parameters=[CompareQuery], responses=CompareSerializer)
    @action(detail=False, methods=["get"])
    def compare(self, request: Request) -> Response:
        """`?before=<eval id>&after=<eval id>&slice_by=tag,difficulty&alpha=0.05`: per-task differences with a
        paired test and confidence intervals, overall and per slice."""
        query = query_params(request, CompareQuery)
        ids: dict[str, Eval] = {}
        for param in ("before", "after"):
            found = self.get_queryset().filter(pk=query[param]).first()
            if found is None:
                raise ValidationError({param: [f"eval {query[param]} does not exist"]})
            ids[param] = found
        slice_by = [s for s in query["slice_by"].split(",") if s]
        alpha = query["alpha"]
        comparison = selectors.eval_compare(before=ids["before"], after=ids["after"], slice_by=slice_by, alpha=alpha)
        return Response(comparison)


router = AppRouter()  # controlplane.urls gathers every app's router into the one API root
router.register("benchmarks", BenchmarkViewSet, basename="benchmark")
router.register("benchmark-versions", BenchmarkVersionViewSet, basename="benchmark-version")
router.register("evals", EvalViewSet, basename="eval")
