"""The ingest endpoint workers report to: POST /api/v1/runs/<id>/ingest/ with the run's ingest token.

An async view, so the publish to the run's Channels group reuses the server's event loop and Redis connection,
and the database work runs in a worker thread per request (several workers ingest in parallel instead of
queueing behind Django's single thread for sync views). Only `Authorization: Bearer cri_...` for this run opens it.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import DataError
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from psycopg import DataError as PsycopgDataError
from pydantic import ValidationError as PydanticError

from apps.common.errors import NUL_PROBLEM, is_nul_error
from apps.runs import services
from apps.runs.live import publish_events_async
from apps.runs.models import Run
from workers.events import EventBatch


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
