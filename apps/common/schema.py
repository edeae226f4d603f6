"""What the OpenAPI schema (/api/v1/schema/) says beyond drf-spectacular's defaults: the error responses an operation
can give, and the one generator that puts them on every operation (SPECTACULAR_SETTINGS["DEFAULT_GENERATOR_CLASS"]).

Every API error is JSON from apps.common.errors.json_exception_handler: `{"detail": "..."}`, plus `fields` for a
400 (each bad field and its messages). Which codes an operation can give follows from the operation itself, not from
per-view annotations:

    400  a POST, PUT or PATCH (a body that does not parse or validate, or a state the request conflicts with), or
         a read with query parameters (each one is checked: apps.common.params)
    401  any operation that needs a signed-in user: no credentials, or a bad, revoked or expired token
    403  likewise: the role or the token's scopes lack the capability (apps.accounts.permissions.HasCapability)
    404  a path with an id (no such row), or a paginated list (`?page=` past the end)

It also states, for every serializer, what DRF enforces but drf-spectacular leaves out of a request body: a related
row's id is a whole number from 1, a list that may not be empty has at least one item, and text that is trimmed may
not be only whitespace. An optional query parameter may be sent empty (`?status=`): DRF reads that as not given.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.generators import SchemaGenerator as SpectacularSchemaGenerator
from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from rest_framework import serializers


class ErrorSerializer(serializers.Serializer):
    """An error: one line that says what went wrong."""

    detail = serializers.CharField(help_text="What went wrong, in one line")

    class Meta:
        ref_name = "Error"


class ValidationErrorSerializer(serializers.Serializer):
    """A request the server did not accept: `detail` joins every message; `fields` maps each bad field (a dotted
    path for a nested one; `non_field_errors` for the request as a whole) to its messages."""

    detail = serializers.CharField(help_text="Every problem, joined in one line")
    # The API field is named `fields`; the stubs see it replace Serializer.fields, but DRF's metaclass takes declared
    # fields off the class, so at run time it does not.
    fields = serializers.DictField(  # type: ignore[assignment]
        child=serializers.JSONField(),
        required=False,
        help_text="Each bad field and its messages (absent when the body did not parse)",
    )

    class Meta:
        ref_name = "ValidationError"


SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


class AutoSchema(SpectacularAutoSchema):
    """drf-spectacular's AutoSchema, plus the error responses each operation can give (module docstring)."""

    def get_operation(
        self, path: str, path_regex: str, path_prefix: str, method: str, registry: Any
    ) -> dict[str, Any] | None:
        operation: dict[str, Any] | None = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        for code, serializer in self.error_responses(operation).items():
            operation["responses"].setdefault(
                code,
                self._get_response_for_code(serializer, code),  # type: ignore[no-untyped-call]
            )
        for parameter in operation.get("parameters", []):
            if parameter["in"] == "query" and not parameter.get("required"):
                parameter["allowEmptyValue"] = True
        return operation

    def _map_serializer_field(self, field: Any, direction: Any, bypass_extensions: bool = False) -> Any:
        schema = super()._map_serializer_field(field, direction, bypass_extensions)  # type: ignore[no-untyped-call]
        if direction != "request" or not isinstance(schema, dict) or field.read_only:
            return schema
        if isinstance(field, serializers.PrimaryKeyRelatedField) and schema.get("type") == "integer":
            schema.setdefault("minimum", 1)
        if isinstance(field, (serializers.ManyRelatedField, serializers.ListField)) and not field.allow_empty:
            schema.setdefault("minItems", 1)
        text = isinstance(field, serializers.CharField) and not isinstance(field, serializers.ChoiceField)
        if text and field.trim_whitespace and not field.allow_blank and "pattern" not in schema:
            schema["pattern"] = r"\S"  # DRF strips the text first: only whitespace would be blank
        return schema

    def error_responses(self, operation: dict[str, Any]) -> dict[str, type[serializers.Serializer]]:
        codes: dict[str, type[serializers.Serializer]] = {}
        paginator = self._get_paginator()  # type: ignore[no-untyped-call]
        paging = {getattr(paginator, "page_query_param", None), getattr(paginator, "page_size_query_param", None)}
        parameters = operation.get("parameters", [])
        filters = [p for p in parameters if p["in"] == "query" and p["name"] not in paging]
        if self.method not in (*SAFE_METHODS, "DELETE") or filters:
            codes["400"] = ValidationErrorSerializer
        security = operation.get("security")
        if security and {} not in security:
            codes["401"] = ErrorSerializer
            codes["403"] = ErrorSerializer
        if any(p["in"] == "path" for p in parameters) or any(p["name"] in paging for p in parameters):
            codes["404"] = ErrorSerializer
        return codes


_SCHEMA_CLASSES: dict[type, type] = {}


def _with_errors(schema_class: type) -> type:
    """`schema_class` (drf-spectacular's AutoSchema, or the subclass an @extend_schema made of it) with the error
    responses mixed in."""
    if issubclass(schema_class, AutoSchema):
        return schema_class
    if schema_class not in _SCHEMA_CLASSES:
        _SCHEMA_CLASSES[schema_class] = type(schema_class.__name__, (AutoSchema, schema_class), {})
    return _SCHEMA_CLASSES[schema_class]


class SchemaGenerator(SpectacularSchemaGenerator):
    """Gives every view the AutoSchema above. REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"] stays drf-spectacular's, so
    the generator swaps the class in per view (an @extend_schema'd action keeps its overrides: they are a subclass
    of that default, and the mix puts AutoSchema's methods first)."""

    def create_view(self, callback: Any, method: str, request: Any = None) -> Any:
        view = super().create_view(callback, method, request)  # type: ignore[no-untyped-call]
        schema = view.schema
        if isinstance(schema, SpectacularAutoSchema) and not isinstance(schema, AutoSchema):
            self._set_schema_to_view(view, _with_errors(schema.__class__)())  # type: ignore[no-untyped-call]
        return view
