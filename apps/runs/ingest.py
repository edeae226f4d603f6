"""The ingest endpoint workers report to: POST /api/v1/runs/<id>/ingest/ with the run's ingest token.

An async view, so the publish to the run's Channels group reuses the server's event loop and Redis connection,
and the database work runs in a worker thread per request (several workers ingest in parallel instead of
queueing behind Django's single thread for sync views). Only `Authorization: Bearer cri_...` for this run opens it.
"""

from __future__ import annotations

import re
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import DataError
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from psycopg import DataError as PsycopgDataError
from pydantic import ValidationError as PydanticError

from apps.common.errors import NUL_PROBLEM, is_nul_error
from apps.runs import kinds, services
from apps.runs.live import publish_events_async
from apps.runs.models import Run
from apps.runs.storage import storage_uri
from workers.events import EventBatch
from workers.trajectories import parse_trajectories_jsonl


def _error(status: int, detail: str, fields: dict[str, list[str]] | None = None) -> JsonResponse:
    body: dict[str, Any] = {"detail": detail}
    if fields:
        body["fields"] = fields
    response = JsonResponse(body, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="ingest"'
    return response


# run id -> ingest nonce. A nonce is set when the run is created and never changes, so a worker's batches after its
# first are authorized without a database round trip (and its health check) per request. Bounded: cleared when full.
_NONCES: dict[int, str] = {}
_NONCES_MAX = 10_000


def _run_if_token_matches(run_id: int, token: str) -> tuple[bool, bool]:
    run = Run.objects.filter(pk=run_id).only("pk", "ingest_nonce").first()
    if run is None:
        _NONCES.pop(run_id, None)
        return False, False
    if len(_NONCES) >= _NONCES_MAX:
        _NONCES.clear()
    _NONCES[run_id] = run.ingest_nonce
    return True, services.ingest_token_valid(run, token)


async def _authorize(run_id: int, token: str) -> tuple[bool, bool]:
    nonce = _NONCES.get(run_id)
    if nonce is not None and services.ingest_token_valid(Run(pk=run_id, ingest_nonce=nonce), token):
        return True, True
    # Not cached, or the token does not match the cached nonce: the database decides (a database restored from an
    # older dump can reuse a run id with a new nonce), and refreshes the cache.
    found: tuple[bool, bool] = await database_sync_to_async(_run_if_token_matches, thread_sensitive=False)(
        run_id, token
    )
    return found


@csrf_exempt  # bearer-token only: no cookie is ever read here
async def ingest_view(request: HttpRequest, run_id: int) -> JsonResponse:
    if request.method != "POST":
        return _error(405, 'POST a JSON body {"events": [...]}')
    header = request.headers.get("Authorization", "").split()
    if len(header) != 2 or header[0].lower() != "bearer":
        return _error(401, "send the run's ingest token as `Authorization: Bearer cri_...`")
    exists, allowed = await _authorize(run_id, header[1])
    if not exists:
        return _error(404, f"run {run_id} does not exist")
    if not allowed:
        return _error(403, f"this token is not run {run_id}'s ingest token")
    length = int(request.headers.get("Content-Length") or 0)
    if length > settings.INGEST_MAX_BYTES:
        return _error(
            413,
            f"batch of {length} bytes is over {settings.INGEST_MAX_BYTES} "
            "(CRUCIBLE_INGEST_MAX_BYTES); send smaller batches",
        )
    try:
        # Validate from the raw bytes: pydantic-core parses and checks in one pass (the size is bounded above).
        batch = EventBatch.model_validate_json(request.body)
    except PydanticError as exc:
        fields = {".".join(str(p) for p in err["loc"]) or "body": [err["msg"]] for err in exc.errors()[:20]}
        return _error(400, "; ".join(f"{k}: {v[0]}" for k, v in fields.items()), fields)
    if len(batch.events) > settings.INGEST_MAX_EVENTS:
        return _error(
            413,
            f"{len(batch.events)} events is over the {settings.INGEST_MAX_EVENTS}-event limit per batch "
            "(CRUCIBLE_INGEST_MAX_EVENTS); split the batch",
        )
    try:
        result = await database_sync_to_async(services.ingest_batch, thread_sensitive=False)(
            run_id=run_id, events=batch.events, publish=False
        )
    except services.RunEnded as exc:
        return _error(409, str(exc))
    except Run.DoesNotExist:  # authorized from the nonce cache, but the run is gone
        _NONCES.pop(run_id, None)
        return _error(404, f"run {run_id} does not exist")
    except ValueError as exc:  # a NaN or infinity inside a free-form field (summary, meta): nothing was stored
        return _error(400, f"events: send only finite numbers ({exc})", {"events": [str(exc)]})
    except (DataError, PsycopgDataError) as exc:  # the transaction rolled back: nothing was stored
        if is_nul_error(exc):
            return _error(400, f"events: {NUL_PROBLEM}", {"events": [f"{NUL_PROBLEM} ({exc})"]})
        problem = f"a value does not fit where it is stored ({exc}); steps, seqs and counts are 64-bit integers"
        return _error(400, f"events: {problem}", {"events": [problem]})
    if result.accepted:
        await publish_events_async(run_id, result.payloads, result.state)
    return JsonResponse({"accepted": result.accepted, "duplicates": result.duplicates, "last_seq": result.last_seq})


FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}\.jsonl")


@csrf_exempt  # bearer-token only
def ingest_file_view(request: HttpRequest, run_id: int, name: str) -> JsonResponse:
    """`PUT /api/v1/runs/<id>/ingest/files/<name>.jsonl`: a file of stored trajectories (workers.trajectories) for a
    run trained outside Crucible (kind `external`), put into the run's storage folder so its `trajectory` events
    can point at it (`storage_uri`) and the viewer and the review queue read it. Crucible's own jobs write to
    storage directly. Idempotent: the same name with the same bytes answers the same URI (a retried upload); other
    bytes under a name already taken are a 409. Every line is checked first: a bad one is a 400 naming it, and
    nothing is stored."""
    if request.method != "PUT":
        return _error(405, "PUT the JSONL file's bytes")
    header = request.headers.get("Authorization", "").split()
    if len(header) != 2 or header[0].lower() != "bearer":
        return _error(401, "send the run's ingest token as `Authorization: Bearer cri_...`")
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return _error(404, f"run {run_id} does not exist")
    if not services.ingest_token_valid(run, header[1]):
        return _error(403, f"this token is not run {run_id}'s ingest token")
    if run.kind not in kinds.external_kinds():
        return _error(409, f"run {run_id} is a {run.kind} run: its job writes its own files to storage")
    if not FILE_NAME.fullmatch(name):
        return _error(400, "name: 1-100 letters, digits, '.', '_' or '-', ending in .jsonl", {"name": ["bad name"]})
    body = request.body
    if len(body) > settings.INGEST_MAX_BYTES:
        return _error(413, f"{len(body)} bytes is over {settings.INGEST_MAX_BYTES} (CRUCIBLE_INGEST_MAX_BYTES)")
    parsed = parse_trajectories_jsonl(body, max_errors=20)
    if parsed.error_count or not parsed.trajectories:
        lines = [f"line {e.line}: {e.message}" for e in parsed.errors] or ["the file holds no trajectory"]
        return _error(400, "; ".join(lines[:5]), {"file": lines})
    stored = f"runs/{run_id}/external/{name}"
    if default_storage.exists(stored):
        with default_storage.open(stored, "rb") as handle:
            same = handle.read() == body
        if not same:
            return _error(409, f"{name} is already stored for run {run_id} with other content: use a new name")
    else:
        saved = default_storage.save(stored, ContentFile(body))
        if saved != stored:  # a concurrent upload of the same name won the race: keep one copy
            default_storage.delete(saved)
    return JsonResponse({"uri": storage_uri(stored), "trajectories": len(parsed.trajectories)})
