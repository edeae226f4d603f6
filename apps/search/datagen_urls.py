"""API for synthetic-task generation, under /api/v1/datagen/.

`POST` launches a datagen run (operator: the `launch` capability); `GET` lists datagen runs and `GET <id>/` gives one
with its verification report (anyone who may read).
"""

from __future__ import annotations

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from rest_framework import serializers, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter

from apps.accounts.models import Capability
from apps.datasets.models import DatasetVersion
from apps.runs import selectors
from apps.runs.api import RunSerializer
from apps.runs.models import Run, RunKind
from apps.search.datagen_services import datagen_launch, datagen_report


class DatagenLaunchSerializer(serializers.Serializer):
    corpus_version = serializers.PrimaryKeyRelatedField(
        queryset=DatasetVersion.objects.select_related("dataset"), help_text="A version of a corpus dataset"
    )
    target_dataset = serializers.CharField(
        max_length=100, help_text="Name of the tasks dataset that receives the new version (created if missing)"
    )
    params = serializers.JSONField(
        required=False,
        default=dict,
        help_text=(
            "workers.search.synth.SynthParams: generator (template|llm), model, num_tasks, max_hops, distractors, "
            "min_distractors, seed, ...; omitted fields take defaults"
        ),
    )


class DatagenViewSet(viewsets.GenericViewSet):
    serializer_class = RunSerializer
    capability_map = {"create": Capability.LAUNCH}

    def get_queryset(self) -> QuerySet[Run]:
        return selectors.run_list().filter(kind=RunKind.DATAGEN)

    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(RunSerializer(page, many=True).data)

    def retrieve(self, request: Request, pk: str | None = None) -> Response:
        """The run, the outcome of its registration (`datagen`) and the job's verification report (`report`,
        null until the job has written it)."""
        run = get_object_or_404(self.get_queryset(), pk=pk)
        return Response(
            {"run": RunSerializer(run).data, "datagen": run.summary.get("datagen"), "report": datagen_report(run)}
        )

    def create(self, request: Request) -> Response:
        body = DatagenLaunchSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        run = datagen_launch(
            corpus_version=data["corpus_version"],
            target_dataset=data["target_dataset"],
            params=data["params"],
            user=request.user,  # type: ignore[arg-type]
        )
        return Response(RunSerializer(run).data, status=status.HTTP_201_CREATED)


router = SimpleRouter()
router.register("datagen", DatagenViewSet, basename="datagen")
urlpatterns = router.urls
