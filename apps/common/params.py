"""Query parameters a list or read takes, as a serializer: the schema lists its fields (`@extend_schema(parameters=
[TheFilters])`) and the view checks them with `query_params`, so a value the schema rules out is a 400 that names
the parameter instead of being ignored."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers
from rest_framework.request import Request


def query_params(request: Request, filters: type[serializers.Serializer]) -> dict[str, Any]:
    """The request's query parameters checked by `filters`; those not given are left out (unless they have a
    default)."""
    body = filters(data=request.query_params)
    body.is_valid(raise_exception=True)
    return dict(body.validated_data)


def id_field(help_text: str, **kwargs: Any) -> serializers.IntegerField:
    """An id in a query parameter: a whole number from 1."""
    return serializers.IntegerField(min_value=1, max_value=2**63 - 1, required=False, help_text=help_text, **kwargs)
