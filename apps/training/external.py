"""External runs: training that runs outside Crucible (TRL, verl, a team's own loop) and reports through the SDK
(`crucible.init`). The run is a row like any other, created running and never dispatched to Ray; its reporter
sends metrics, trajectories, flags and checkpoints through the same ingest endpoint and spool as Crucible's own
workers, and its `end` event ends it (apps.runs.services.ingest). So it gets the same pages: live charts, the
trajectory viewer, the health panel, the review queue for its flags, and evals and gates on its checkpoints.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

from django.db import transaction
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.models import Capability, User
from apps.accounts.permissions import request_user
from apps.runs.models import Run, RunStatus
from apps.runs.services import ingest_token_for, publish_status_on_commit
from workers.models.registry import model_name_problems

EXTERNAL = "external"
PROJECT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
CONFIG_MAX_BYTES = 64 * 1024
CLIENT_ID = re.compile(r"[A-Za-z0-9-]{8,64}")


def external_run_create(
    *,
    created_by: User,
    project: str,
    name: str = "",
    config: dict[str, Any] | None = None,
    base_model: str = "",
    tags: list[str] | None = None,
    client_id: str = "",
) -> tuple[Run, bool]:
    """A running external run, and whether it is new. `client_id` (the SDK's, one per `init`) makes a retried
    create return the run the first attempt made instead of a second one. A bad field is a 400 naming it."""
    problems: dict[str, list[str]] = {}
    if not PROJECT.fullmatch(project or ""):
        problems["project"] = ["1-100 letters, digits, '.', '_' or '-', starting with a letter or digit"]
    config = dict(config or {})
    if len(json.dumps(config, default=str)) > CONFIG_MAX_BYTES:
        problems["config"] = [f"over {CONFIG_MAX_BYTES // 1024} KiB of JSON: log large values as metrics or files"]
    if base_model and (found := model_name_problems(base_model)):
        problems["base_model"] = found
    if client_id and not CLIENT_ID.fullmatch(client_id):
        problems["client_id"] = ["8-64 letters, digits or '-' (the SDK sends a UUID)"]
    if problems:
        raise ValidationError(problems)
    with transaction.atomic():
        if client_id:
            earlier = Run.objects.filter(kind=EXTERNAL, created_by=created_by, spec__client_id=client_id).first()
            if earlier is not None:
                return earlier, False
        run = Run.objects.create(
            kind=EXTERNAL,
            name=(name or f"{project} (external)")[:200],
            spec={
                "project": project,
                "client_id": client_id,
                # base_model where evals look for what a checkpoint was trained from (a Hub id, a path or a name)
                "config": {**config, **({"base_model": base_model} if base_model else {})},
            },
            tags=[project, *(tags or [])],
            ingest_nonce=secrets.token_hex(16),
            created_by=created_by,
            status=RunStatus.RUNNING,
            started_at=timezone.now(),
        )
        publish_status_on_commit(run)
    return run, True


class ExternalRunSerializer(serializers.Serializer):
    project = serializers.CharField(max_length=100, help_text="Groups the runs of one project (also a tag)")
    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    config = serializers.DictField(required=False, default=dict, help_text="The trainer's settings, shown as-is")
    base_model = serializers.CharField(
        max_length=500, required=False, allow_blank=True, default="", help_text="What it fine-tunes: a Hub id or path"
    )
    tags = serializers.ListField(child=serializers.CharField(max_length=100), required=False, default=list)
    client_id = serializers.CharField(max_length=64, required=False, allow_blank=True, default="")


class ExternalRunCreated(serializers.Serializer):
    id = serializers.IntegerField()
    url = serializers.CharField(help_text="The run's page")
    ingest_url = serializers.CharField(help_text="Where its reporter posts events (Bearer ingest_token)")
    files_url = serializers.CharField(help_text="Where its trajectory files are put (Bearer ingest_token)")
    ingest_token = serializers.CharField(help_text="Opens this run's ingest and nothing else")


class ExternalRunViewSet(viewsets.GenericViewSet):
    """`POST /api/v1/external-runs/`: a run trained outside Crucible (the SDK's `crucible.init`); returns its ingest
    token. Retried with the same `client_id`, it returns the same run (200) instead of a second one."""

    queryset = Run.objects.filter(kind=EXTERNAL)
    serializer_class = ExternalRunSerializer
    capability_map = {"create": Capability.LAUNCH}

    @extend_schema(request=ExternalRunSerializer, responses={201: ExternalRunCreated, 200: ExternalRunCreated})
    def create(self, request: Request) -> Response:
        body = ExternalRunSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        run, created = external_run_create(created_by=request_user(request), **body.validated_data)
        base = request.build_absolute_uri("/").rstrip("/")
        reply = {
            "id": run.pk,
            "url": f"{base}/runs/{run.pk}/",
            "ingest_url": f"{base}/api/v1/runs/{run.pk}/ingest/",
            "files_url": f"{base}/api/v1/runs/{run.pk}/ingest/files/",
            "ingest_token": ingest_token_for(run),
        }
        return Response(reply, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)
