"""Serializer fields several apps' APIs share, each stating in the schema the constraint the server enforces."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.common.validators import SLUG


@extend_schema_field(OpenApiTypes.OBJECT)
class JSONObjectField(serializers.JSONField):
    """A JSON object (settings, specs, parameters). In a multipart form it is the object's JSON text."""

    default_error_messages = {"not_an_object": "must be a JSON object, e.g. {{}}"}

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        if not isinstance(value, dict):
            self.fail("not_an_object")
        return value


def slug_field(help_text: str, **kwargs: Any) -> serializers.RegexField:
    """A name people type and URLs carry (apps.common.validators.SLUG): 1-100 of [-a-zA-Z0-9_]."""
    return serializers.RegexField(f"^{SLUG.pattern}$", max_length=100, help_text=help_text, **kwargs)
