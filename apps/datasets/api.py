from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.models import Capability, User
from apps.accounts.permissions import request_user
from apps.common.routers import AppRouter
from apps.datasets.models import Dataset, DatasetVersion
from apps.datasets.services import (
    dataset_create,
    dataset_file_check_size,
    dataset_version_create,
    dataset_version_split,
)


class DatasetVersionSerializer(serializers.ModelSerializer):
    created_by: serializers.StringRelatedField[User] = serializers.StringRelatedField()
    dataset: serializers.StringRelatedField[Dataset] = serializers.StringRelatedField()

    class Meta:
        model = DatasetVersion
        fields = [
            "id",
            "dataset",
            "number",
            "row_count",
            "size_bytes",
            "content_hash",
            "validation_report",
            "notes",
            "created_by",
            "created_at",
        ]


class DatasetSerializer(serializers.ModelSerializer):
    owner: serializers.StringRelatedField[User] = serializers.StringRelatedField()
    latest_version = serializers.SerializerMethodField()

    class Meta:
        model = Dataset
        fields = ["id", "name", "kind", "description", "owner", "created_at", "latest_version"]
        read_only_fields = ["owner", "created_at"]
        extra_kwargs: dict[str, dict[str, Any]] = {"name": {"validators": []}}

    def get_latest_version(self, obj: Dataset) -> int | None:
        versions = getattr(obj, "prefetched_versions", None)
        return versions[0].number if versions else None


class UploadSerializer(serializers.Serializer):
    file = serializers.FileField()
    notes = serializers.CharField(required=False, allow_blank=True, default="")
    chunker = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        help_text='Corpus datasets only: chunker options as a JSON object, e.g. {"max_words": 150}',
    )


class DatasetViewSet(viewsets.ModelViewSet):
    serializer_class = DatasetSerializer
    parser_classes = [JSONParser, MultiPartParser, FormParser]
    http_method_names = ["get", "post", "head", "options"]

    def get_queryset(self) -> QuerySet[Dataset]:
        from django.db.models import Prefetch

        return Dataset.objects.select_related("owner").prefetch_related(
            Prefetch("versions", queryset=DatasetVersion.objects.order_by("-number"), to_attr="prefetched_versions")
        )

    def perform_create(self, serializer: Any) -> None:
        serializer.instance = dataset_create(owner=request_user(self.request), **serializer.validated_data)

    @extend_schema(methods=["GET"], request=None, responses=DatasetVersionSerializer(many=True))
    @extend_schema(methods=["POST"], request=UploadSerializer, responses={201: DatasetVersionSerializer})
    @action(detail=True, methods=["get", "post"], parser_classes=[MultiPartParser, FormParser])
    def versions(self, request: Request, pk: str | None = None) -> Response:
        """GET lists versions; POST (multipart `file`) validates the whole file and adds the next version.

        For a corpus, `file` is a documents JSONL or a zip of .md/.rst/.txt/.html/.py files, chunked with the optional
        `chunker` field (a JSON object of chunker options); the version stores the chunks.
        """
        dataset = get_object_or_404(Dataset, pk=pk)
        if request.method == "GET":
            page = self.paginate_queryset(dataset.versions.select_related("dataset", "created_by").order_by("-number"))
            return self.get_paginated_response(DatasetVersionSerializer(page, many=True).data)
        upload = UploadSerializer(data=request.data)
        upload.is_valid(raise_exception=True)
        handle = upload.validated_data["file"]
        dataset_file_check_size(handle.size)
        version = dataset_version_create(
            dataset=dataset,
            data=handle.read(),
            filename=handle.name,
            created_by=request_user(request),
            notes=upload.validated_data["notes"],
            chunker=upload.validated_data["chunker"] or None,
        )
        return Response(DatasetVersionSerializer(version).data, status=201)


class SplitSerializer(serializers.Serializer):
    test_fraction = serializers.FloatField(
        default=0.2, min_value=0.01, max_value=0.99, help_text="Share of the rows held out for testing"
    )
    seed = serializers.IntegerField(default=0, min_value=0, help_text="The same seed gives the same split")
    train_dataset = serializers.CharField(
        required=False, default="", allow_blank=True, max_length=100, help_text="Default: <dataset>-train"
    )
    test_dataset = serializers.CharField(
        required=False, default="", allow_blank=True, max_length=100, help_text="Default: <dataset>-test"
    )


class SplitResultSerializer(serializers.Serializer):
    train = DatasetVersionSerializer()
    test = DatasetVersionSerializer()


class DatasetVersionViewSet(viewsets.ReadOnlyModelViewSet):
    """Reads need `read`; a split (which writes two versions) needs `launch`."""

    serializer_class = DatasetVersionSerializer
    queryset = DatasetVersion.objects.select_related("dataset", "created_by").order_by("-created_at")
    capability_map = {"split": Capability.LAUNCH}

    @extend_schema(request=SplitSerializer, responses={201: SplitResultSerializer})
    @action(detail=True, methods=["post"], parser_classes=[JSONParser])
    def split(self, request: Request, pk: str | None = None) -> Response:
        """Split a tasks or repo_tasks version into a train part and a held-out test part, each the next version of
        its own dataset (deterministic in `seed`; repository tasks are split within each family)."""
        version = self.get_object()
        body = SplitSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        train, test = dataset_version_split(version=version, created_by=request_user(request), **body.validated_data)
        return Response(
            {"train": DatasetVersionSerializer(train).data, "test": DatasetVersionSerializer(test).data}, status=201
        )


router = AppRouter()  # controlplane.urls gathers every app's router into the one API root
router.register("datasets", DatasetViewSet, basename="dataset")
router.register("dataset-versions", DatasetVersionViewSet, basename="dataset-version")
