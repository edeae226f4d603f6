"""Search API (under /api/v1/): corpus index builds and synthetic-task generation.

POST /api/v1/search-indexes/      {"corpus_version": 12, "config": {"rrf_k": 60}}   (operator)
GET  /api/v1/search-indexes/      ?corpus_version=12&status=ready                    (viewer)
GET  /api/v1/search-indexes/<id>/
POST /api/v1/datagen/             {"corpus_version": 12, "target_dataset": "t", "params": {}} (operator)
GET  /api/v1/datagen/, /api/v1/datagen/<id>/ (with the verification report)
POST /api/v1/widesearch-imports/  multipart: file (WideSearch zip), tasks_dataset, judge_columns? (operator)
POST /api/v1/beir-imports/   multipart: file (BEIR zip), corpus_dataset, tasks_dataset, splits?, chunker? (operator)
"""

from __future__ import annotations

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.models import Capability, User
from apps.accounts.permissions import request_user
from apps.common.params import id_field, query_params
from apps.common.routers import AppRouter
from apps.datasets.api import DatasetVersionSerializer
from apps.datasets.models import DatasetVersion
from apps.runs import selectors
from apps.runs.api import RunSerializer
from apps.runs.models import Run, RunKind
from apps.search.models import CorpusIndex
from apps.search.selectors import datagen_report
from apps.search.services.datagen import datagen_launch
from apps.search.services.imports import beir_import, widesearch_import
from apps.search.services.indexes import index_launch_or_reuse
from workers.swarm.widesearch import JUDGE_COLUMNS


class CorpusIndexSerializer(serializers.ModelSerializer):
    corpus_version_name: serializers.StringRelatedField[DatasetVersion] = serializers.StringRelatedField(
        source="corpus_version"
    )
    created_by: serializers.StringRelatedField[User] = serializers.StringRelatedField()
    status = serializers.CharField(read_only=True)
    run_status = serializers.CharField(source="run.status", read_only=True)
    progress = serializers.FloatField(source="run.progress_fraction", read_only=True)

    class Meta:
        model = CorpusIndex
        fields = [
            "id",
            "corpus_version",
            "corpus_version_name",
            "config",
            "config_hash",
            "status",
            "uri",
            "run",
            "run_status",
            "progress",
            "stats",
            "created_by",
            "created_at",
            "ready_at",
        ]


class IndexLaunchSerializer(serializers.Serializer):
    corpus_version = serializers.PrimaryKeyRelatedField(queryset=DatasetVersion.objects.select_related("dataset"))
    config = serializers.DictField(
        required=False,
        default=dict,
        help_text="workers.search.index.IndexConfig; omitted fields take defaults ({} builds the default index)",
    )


class IndexFilters(serializers.Serializer):
    corpus_version = id_field("Only indexes of this corpus version")
    status = serializers.ChoiceField(choices=["ready"], required=False, help_text="`ready`: only built indexes")


class CorpusIndexViewSet(viewsets.ReadOnlyModelViewSet):
    """Reads need `read`; building needs `launch` (operators and admins), like launching runs."""

    serializer_class = CorpusIndexSerializer
    capability_map = {"create": Capability.LAUNCH}

    def get_queryset(self) -> QuerySet[CorpusIndex]:
        qs = CorpusIndex.objects.select_related("corpus_version__dataset", "run", "created_by")
        if self.action != "list":
            return qs
        filters = query_params(self.request, IndexFilters)
        if "corpus_version" in filters:
            qs = qs.filter(corpus_version_id=filters["corpus_version"])
        if filters.get("status") == "ready":
            qs = qs.filter(ready_at__isnull=False)
        return qs

    @extend_schema(parameters=[IndexFilters])
    def list(self, request: Request, *args: object, **kwargs: object) -> Response:
        return super().list(request, *args, **kwargs)

    @extend_schema(request=IndexLaunchSerializer, responses={200: CorpusIndexSerializer, 201: CorpusIndexSerializer})
    def create(self, request: Request) -> Response:
        """Build an index of a corpus version; an index with the same config that is not failed is returned as
        it is (200) instead of building again (201)."""
        body = IndexLaunchSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        index, launched = index_launch_or_reuse(
            corpus_version=body.validated_data["corpus_version"],
            config=body.validated_data["config"],
            user=request_user(request),
        )
        return Response(
            CorpusIndexSerializer(index).data, status=status.HTTP_201_CREATED if launched else status.HTTP_200_OK
        )


class DatagenLaunchSerializer(serializers.Serializer):
    corpus_version = serializers.PrimaryKeyRelatedField(
        queryset=DatasetVersion.objects.select_related("dataset"), help_text="A version of a corpus dataset"
    )
    target_dataset = serializers.CharField(
        max_length=100, help_text="Name of the tasks dataset that receives the new version (created if missing)"
    )
    params = serializers.DictField(
        required=False,
        default=dict,
        error_messages={"not_a_dict": 'must be a JSON object, e.g. {{"num_tasks": 50}}, not a {input_type}'},
        help_text=(
            "workers.search.synth_params.SynthParams: generator (template|llm), model, num_tasks, max_hops, "
            "distractors, min_distractors, seed, ...; omitted fields take defaults"
        ),
    )


class DatagenDetailSerializer(serializers.Serializer):
    run = RunSerializer()
    datagen = serializers.DictField(allow_null=True, help_text="The outcome of registering the generated tasks")
    report = serializers.DictField(allow_null=True, help_text="The job's verification report; null until written")


class DatagenViewSet(viewsets.GenericViewSet):
    serializer_class = RunSerializer
    capability_map = {"create": Capability.LAUNCH}

    def get_queryset(self) -> QuerySet[Run]:
        return selectors.run_list().filter(kind=RunKind.DATAGEN)

    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(RunSerializer(page, many=True).data)

    @extend_schema(responses=DatagenDetailSerializer)
    def retrieve(self, request: Request, pk: str | None = None) -> Response:
        """The run, the outcome of its registration (`datagen`) and the job's verification report (`report`,
        null until the job has written it)."""
        run = get_object_or_404(self.get_queryset(), pk=pk)
        return Response(
            {"run": RunSerializer(run).data, "datagen": run.summary.get("datagen"), "report": datagen_report(run)}
        )

    @extend_schema(request=DatagenLaunchSerializer, responses={201: RunSerializer})
    def create(self, request: Request) -> Response:
        body = DatagenLaunchSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        run = datagen_launch(
            corpus_version=data["corpus_version"],
            target_dataset=data["target_dataset"],
            params=data["params"],
            user=request_user(request),
        )
        return Response(RunSerializer(run).data, status=status.HTTP_201_CREATED)


class BeirImportSerializer(serializers.Serializer):
    file = serializers.FileField(help_text="A BEIR zip as published: corpus.jsonl, queries.jsonl, qrels/*.tsv")
    corpus_dataset = serializers.CharField(max_length=100, help_text="Corpus dataset for the documents (created)")
    tasks_dataset = serializers.CharField(max_length=100, help_text="Tasks dataset for the judged queries (created)")
    splits = serializers.CharField(
        required=False, allow_blank=True, default="", help_text="Comma-separated qrels splits; default: every one"
    )
    chunker = serializers.CharField(
        required=False, allow_blank=True, default="", help_text='Chunker options as JSON, e.g. {"max_words": 150}'
    )
    notes = serializers.CharField(required=False, allow_blank=True, default="")


class BeirImportResultSerializer(serializers.Serializer):
    corpus_version = DatasetVersionSerializer()
    tasks_version = DatasetVersionSerializer()
    corpus_reused = serializers.BooleanField(help_text="The same documents, chunked the same way, were already stored")
    report = serializers.DictField()


class BeirImportViewSet(viewsets.GenericViewSet):
    """Import a BEIR dataset (workers.search.beir): its corpus as a corpus version, its judged queries with their
    graded document relevance as a tasks version; the whole zip is checked first and nothing is stored on a
    problem (a 400 naming the file, line and field)."""

    serializer_class = BeirImportSerializer
    parser_classes = [MultiPartParser, FormParser]
    capability_map = {"create": Capability.LAUNCH}

    @extend_schema(request=BeirImportSerializer, responses={201: BeirImportResultSerializer})
    def create(self, request: Request) -> Response:
        body = BeirImportSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        handle = data["file"]
        result = beir_import(
            data=handle.read(),
            filename=handle.name,
            corpus_dataset=data["corpus_dataset"],
            tasks_dataset=data["tasks_dataset"],
            user=request_user(request),
            splits=[s for s in data["splits"].split(",") if s.strip()],
            chunker=data["chunker"] or None,
            notes=data["notes"],
        )
        return Response(
            {
                "corpus_version": DatasetVersionSerializer(result.corpus_version).data,
                "tasks_version": DatasetVersionSerializer(result.tasks_version).data,
                "corpus_reused": result.corpus_reused,
                "report": result.report,
            },
            status=status.HTTP_201_CREATED,
        )


class WideSearchImportSerializer(serializers.Serializer):
    file = serializers.FileField(help_text="A zip of the WideSearch queries (one .jsonl) and gold tables (<id>.csv)")
    tasks_dataset = serializers.CharField(max_length=100, help_text="Tasks dataset for the wide tasks (created)")
    judge_columns = serializers.ChoiceField(
        choices=list(JUDGE_COLUMNS),
        default="refuse",
        help_text="llm_judge columns: refuse the task (default), score them by exact_match, or drop them",
    )
    notes = serializers.CharField(required=False, allow_blank=True, default="")


class WideSearchImportViewSet(viewsets.GenericViewSet):
    """Import WideSearch tasks (workers.swarm.widesearch) as a tasks version of wide tasks, each scored by its own
    evaluation spec; the whole zip is checked first and nothing is stored on a problem."""

    serializer_class = WideSearchImportSerializer
    parser_classes = [MultiPartParser, FormParser]
    capability_map = {"create": Capability.LAUNCH}

    @extend_schema(request=WideSearchImportSerializer, responses={201: DatasetVersionSerializer})
    def create(self, request: Request) -> Response:
        body = WideSearchImportSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        version = widesearch_import(
            data=data["file"].read(),
            filename=data["file"].name,
            tasks_dataset=data["tasks_dataset"],
            user=request_user(request),
            judge_columns=data["judge_columns"],
            notes=data["notes"],
        )
        return Response(DatasetVersionSerializer(version).data, status=status.HTTP_201_CREATED)


router = AppRouter()  # controlplane.urls gathers every app's router into the one API root
router.register("search-indexes", CorpusIndexViewSet, basename="search-index")
router.register("datagen", DatagenViewSet, basename="datagen")
router.register("beir-imports", BeirImportViewSet, basename="beir-import")
router.register("widesearch-imports", WideSearchImportViewSet, basename="widesearch-import")
