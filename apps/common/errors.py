"""One way to turn errors into what a person reads: API responses, page messages and pydantic's field paths."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DatabaseError
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from psycopg.errors import CharacterNotInRepertoire, UntranslatableCharacter
from pydantic import ValidationError as PydanticError
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler

MAX_FIELD_ERRORS = 20
"""A pydantic error list can be long (a bad list of 1,000 items): the first 20 name the problem well enough."""


def _flatten(detail: Any, prefix: str = "") -> list[str]:
    if isinstance(detail, dict):
        out: list[str] = []
        for key, value in detail.items():
            out += _flatten(value, f"{prefix}.{key}" if prefix else str(key))
        return out
    if isinstance(detail, list):
        out = []
        for item in detail:
            out += _flatten(item, prefix)
        return out
    return [f"{prefix}: {detail}" if prefix and prefix != "non_field_errors" else str(detail)]


def validation_messages(exc: exceptions.ValidationError) -> list[str]:
    """Each message of a DRF ValidationError as one line `field.path: message` (pages show them as a list)."""
    return _flatten(exc.detail)


def pydantic_problems(exc: PydanticError, prefix: str = "") -> dict[str, list[str]]:
    """A pydantic error as {"prefix.field.path": [messages]}: the shape a DRF ValidationError takes, so a bad
    nested value is named as the API user wrote it (`config.sampling.temperature`)."""
    fields: dict[str, list[str]] = {}
    for err in exc.errors()[:MAX_FIELD_ERRORS]:
        path = ".".join(str(p) for p in (prefix, *err["loc"]) if p != "")
        fields.setdefault(path or prefix or "body", []).append(err["msg"])
    return fields


NUL_ERRORS = (CharacterNotInRepertoire, UntranslatableCharacter)
"""What PostgreSQL says to a NUL character in text (COPY text) or in jsonb (an escaped \\u0000)."""

NUL_PROBLEM = "a text field holds a NUL character (\\u0000), which PostgreSQL cannot store; remove it"


def is_nul_error(exc: BaseException) -> bool:
    """A database error raised by a NUL character in a value (psycopg's own, or Django's wrapping it)."""
    return isinstance(exc, NUL_ERRORS) or isinstance(exc.__cause__, NUL_ERRORS)


def json_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Every API error is JSON: `detail` is one readable line, `fields` maps each bad field to its messages. A NUL
    character that reached the database (a free-form JSON value; DRF's own fields refuse it before) is a 400."""
    if isinstance(exc, DatabaseError) and is_nul_error(exc):
        return Response({"detail": NUL_PROBLEM}, status=400)
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(exc.message_dict if hasattr(exc, "error_dict") else exc.messages)
    response = exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        fields = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        response.data = {"detail": "; ".join(_flatten(fields)), "fields": fields}
    elif isinstance(response.data, dict) and "detail" in response.data:
        response.data = {"detail": str(response.data["detail"])}
    return response


@csrf_exempt
def api_not_found(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
    """Any /api/ path that names no route (`/api/v1/datasets/abc/`: an id that is not a number) is a JSON 404
    like every other API error, not Django's HTML page."""
    return JsonResponse({"detail": "Not found."}, status=404)
