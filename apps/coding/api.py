"""Repository-task API (under /api/v1/): import and generation runs.

POST /api/v1/repo-tasks/import/     multipart: target_dataset, file, notes?, keep_valid?        (operator)
POST /api/v1/repo-tasks/generate/   {"target_dataset": "toolz-tasks", "params": {"sources": ["toolz"]}} (operator)
POST /api/v1/repo-tasks/mine/       {"target_dataset": "t", "location": "/srv/git/toolz", "repo": "pytoolz/toolz",
                                     "params": {"max_commits": 500}, "benchmark": {"name": "b"}?}     (operator)
GET  /api/v1/repo-tasks/sources/    the vendored libraries the generator mutates                 (viewer)
GET  /api/v1/repo-tasks/            import and generation runs                                   (viewer)
GET  /api/v1/repo-tasks/<run id>/   the run, the outcome of its registration and the job's report
"""

from __future__ import annotations

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.models import Capability
from apps.accounts.permissions import request_user
from apps.coding.services import (
    CODEGEN,
    REPOIMPORT,
    REPOMINE,
    codegen_launch,
    job_report,
    repo_import_launch,
    repo_mine_launch,
)
from apps.common.routers import AppRouter
from apps.datasets.services import dataset_file_check_size
from apps.runs import selectors
from apps.runs.api import RunSerializer
from apps.runs.models import Run
from workers.coding.libraries import vendored_sources


class ImportSerializer(serializers.Serializer):
    target_dataset = serializers.CharField(
        max_length=100, help_text="The repo_tasks dataset that receives the verified tasks (created if missing)"
    )
    file = serializers.FileField(
        help_text="JSONL of tasks with inline repositories, or a zip/tar.gz bundle with tasks.jsonl (docs/recipes.md)"
    )
    notes = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)
    keep_valid = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Store the tasks that pass when others are refused (default: all or nothing)",
    )


class GenerateSerializer(serializers.Serializer):
    target_dataset = serializers.CharField(
        max_length=100, help_text="The repo_tasks dataset that receives the generated tasks (created if missing)"
    )
    params = serializers.DictField(
        required=False,
        default=dict,
        error_messages={"not_a_dict": 'must be a JSON object, e.g. {{"sources": ["toolz"]}}, not a {input_type}'},
        help_text=(
            "workers.coding.candidates.CodegenParams: sources, families (repair, implement), operators, max_tasks, "
            "max_candidates, seed, test_scope, ...; omitted fields take defaults"
        ),
    )
    benchmark = serializers.DictField(
        required=False,
        allow_null=True,
        default=None,
        help_text='Also make a held-out benchmark from the kept tasks: {"name": "toolz-bench", "test_fraction": 0.25}',
    )


class MineSerializer(serializers.Serializer):
    target_dataset = serializers.CharField(
        max_length=100, help_text="The repo_tasks dataset that receives the mined tasks (created if missing)"
    )
    location = serializers.CharField(
        max_length=1000,
        help_text="The git repository: a path on the cluster, a URL the cluster can clone, or a bundle's storage URI",
    )
    repo = serializers.CharField(max_length=200, help_text="Its name, owner/name")
    params = serializers.DictField(
        required=False,
        default=dict,
        error_messages={"not_a_dict": 'must be a JSON object, e.g. {{"max_commits": 500}}, not a {input_type}'},
        help_text=(
            "workers.coding.mining.MineParams: max_commits, max_tasks, min_lines, max_lines, max_files, "
            "test_pattern, code_pattern, runs, test_command, ref; omitted fields take defaults"
        ),
    )
    benchmark = serializers.DictField(
        required=False,
        allow_null=True,
        default=None,
        help_text='Also pin the newest commits as a held-out benchmark: {"name": "toolz-mined", "test_fraction": 0.25}',
    )


class SourceSerializer(serializers.Serializer):
    name = serializers.CharField()
    version = serializers.CharField()
    sha256 = serializers.CharField()
    license = serializers.CharField()
    url = serializers.CharField()


class RepoTaskRunSerializer(serializers.Serializer):
    run = RunSerializer()
    repo_tasks = serializers.DictField(allow_null=True, help_text="The outcome of registering the kept tasks")
    report = serializers.DictField(allow_null=True, help_text="The job's report; null until it is written")


class RepoTaskRunViewSet(viewsets.GenericViewSet):
    """Reads need `read`; importing and generating need `launch` (operators and admins)."""

    serializer_class = RunSerializer
    capability_map = {"import_tasks": Capability.LAUNCH, "generate": Capability.LAUNCH, "mine": Capability.LAUNCH}

    def get_queryset(self) -> QuerySet[Run]:
        return selectors.run_list().filter(kind__in=[REPOIMPORT, CODEGEN, REPOMINE])

    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(RunSerializer(page, many=True).data)

    @extend_schema(responses=RepoTaskRunSerializer)
    def retrieve(self, request: Request, pk: str | None = None) -> Response:
        run = get_object_or_404(self.get_queryset(), pk=pk)
        return Response(
            {"run": RunSerializer(run).data, "repo_tasks": run.summary.get("repo_tasks"), "report": job_report(run)}
        )

    @extend_schema(request=ImportSerializer, responses={201: RunSerializer})
    @action(detail=False, methods=["post"], url_path="import", parser_classes=[MultiPartParser, FormParser])
    def import_tasks(self, request: Request) -> Response:
        """Check the upload now (a malformed file is a 400 listing every problem), then verify every task in the
        sandbox in an import run; the verified tasks become the next version of `target_dataset`."""
        body = ImportSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        handle = body.validated_data["file"]
        dataset_file_check_size(handle.size)
        run = repo_import_launch(
            target_dataset=body.validated_data["target_dataset"],
            data=handle.read(),
            filename=handle.name or "upload",
            notes=body.validated_data["notes"],
            keep_valid=body.validated_data["keep_valid"],
            user=request_user(request),
        )
        return Response(RunSerializer(run).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=GenerateSerializer, responses={201: RunSerializer})
    @action(detail=False, methods=["post"], parser_classes=[JSONParser])
    def generate(self, request: Request) -> Response:
        """Generate repository tasks from vendored libraries (repair: a procedural mutation the library's tests
        catch; implement: a removed function body) in a Ray job; every kept task is verified in the sandbox and the
        kept ones become the next version of `target_dataset`. The run's page lists kept and dropped by reason."""
        body = GenerateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        run = codegen_launch(
            target_dataset=body.validated_data["target_dataset"],
            params=body.validated_data["params"],
            benchmark=body.validated_data["benchmark"],
            user=request_user(request),
        )
        return Response(RunSerializer(run).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=MineSerializer, responses={201: RunSerializer})
    @action(detail=False, methods=["post"], parser_classes=[JSONParser])
    def mine(self, request: Request) -> Response:
        """Mine a git history for repository tasks in a Ray job (each commit that changes code and tests: the
        parent's tree, the commit message, its tests as hidden tests, fail-to-pass found by running them twice);
        every kept task is verified in the sandbox and becomes part of the next version of `target_dataset`, with
        its suite statistics beside CursorBench's on the run's page."""
        body = MineSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        run = repo_mine_launch(
            target_dataset=body.validated_data["target_dataset"],
            source=body.validated_data["location"],
            repo=body.validated_data["repo"],
            params=body.validated_data["params"],
            benchmark=body.validated_data["benchmark"],
            user=request_user(request),
        )
        return Response(RunSerializer(run).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses=SourceSerializer(many=True))
    @action(detail=False, methods=["get"], pagination_class=None)
    def sources(self, request: Request) -> Response:
        """The libraries the generator mutates: vendored source distributions, each with its tests."""
        found = vendored_sources()
        return Response([SourceSerializer(found[name]).data for name in sorted(found)])


router = AppRouter()  # controlplane.urls gathers every app's router into the one API root
router.register("repo-tasks", RepoTaskRunViewSet, basename="repo-tasks")
