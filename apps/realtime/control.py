"""The serving control endpoints a serving job calls, with its own ingest token (`Authorization: Bearer cri_...`),
like the ingest endpoint (apps.runs.ingest): no cookie, no API token, and not in the public API schema.

GET  /api/v1/serving/<run id>/target/        what to serve now (apps.realtime.selectors.serve_target)
POST /api/v1/serving/<run id>/keys/verify/   {"key": "<a client's bearer>"}: may it call this endpoint

401 without a bearer token, 404 for a run that does not exist (or is not a serving run), 403 for a token that is
not this run's. Async views: the replicas poll the target every few seconds and verify keys as clients arrive,
and neither waits behind Django's thread for sync views.
"""

from __future__ import annotations

import json
from typing import Any

from channels.db import database_sync_to_async
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from apps.realtime.selectors import serve_target
from apps.realtime.services.serving import SERVE, serve_key_verify
from apps.runs.models import Run
from apps.runs.services import ingest_token_valid

MAX_KEY_LENGTH = 512


def _error(status: int, detail: str) -> JsonResponse:
    response = JsonResponse({"detail": detail}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="serving"'
    return response


def _serve_run(run_id: int, token: str) -> tuple[Run | None, JsonResponse | None]:
    run = Run.objects.filter(pk=run_id).first()
    if run is None or run.kind != SERVE:
        return None, _error(404, f"serving run {run_id} does not exist")
    if not ingest_token_valid(run, token):
        return None, _error(403, f"this token is not serving run {run_id}'s own token")
    return run, None


def _bearer(request: HttpRequest) -> str | None:
    header = request.headers.get("Authorization", "").split()
    if len(header) != 2 or header[0].lower() != "bearer":
        return None
    return header[1]


def _target(run_id: int, token: str) -> JsonResponse:
    run, refused = _serve_run(run_id, token)
    if refused is not None or run is None:
        return refused or _error(404, "no run")
    return JsonResponse(serve_target(run))


def _verify(run_id: int, token: str, body: Any) -> JsonResponse:
    run, refused = _serve_run(run_id, token)
    if refused is not None or run is None:
        return refused or _error(404, "no run")
    key = body.get("key") if isinstance(body, dict) else None
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
        response = JsonResponse(
            {"detail": f'key: send {{"key": "<the client\'s bearer key>"}} (1-{MAX_KEY_LENGTH} characters)'},
            status=400,
        )
        return response
    return JsonResponse(serve_key_verify(run=run, key=key))


@csrf_exempt  # bearer-token only: no cookie is ever read here
async def target_view(request: HttpRequest, run_id: int) -> JsonResponse:
    if request.method != "GET":
        return _error(405, "GET the target")
    token = _bearer(request)
    if token is None:
        return _error(401, "send the serving run's own token as `Authorization: Bearer cri_...`")
    response: JsonResponse = await database_sync_to_async(_target, thread_sensitive=False)(run_id, token)
    return response


@csrf_exempt  # bearer-token only: no cookie is ever read here
async def keys_verify_view(request: HttpRequest, run_id: int) -> JsonResponse:
    if request.method != "POST":
        return _error(405, 'POST {"key": "..."}')
    token = _bearer(request)
    if token is None:
        return _error(401, "send the serving run's own token as `Authorization: Bearer cri_...`")
    try:
        body = json.loads(request.body or b"null")
    except (ValueError, UnicodeDecodeError):
        body = None
    response: JsonResponse = await database_sync_to_async(_verify, thread_sensitive=False)(run_id, token, body)
    return response
