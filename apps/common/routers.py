"""The API routers every app's api.py and controlplane.urls use."""

from __future__ import annotations

from typing import Any

from rest_framework.routers import DefaultRouter, SimpleRouter


class _IntIds:
    """Routes are Django `path()`s, and a primary key takes the `int` converter: `/datasets/null/versions/` is a 404
    from URL resolution instead of a ValueError (a 500) inside the view, and the schema says the id is an integer.
    A viewset that looks rows up by something else sets `lookup_value_converter`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, use_regex_path=False, **kwargs)  # type: ignore[call-arg]

    def get_lookup_regex(self, viewset: Any, lookup_prefix: str = "") -> str:
        lookup_field = getattr(viewset, "lookup_field", "pk")
        kwarg = getattr(viewset, "lookup_url_kwarg", None) or lookup_field
        converter = getattr(viewset, "lookup_value_converter", "int" if lookup_field in ("pk", "id") else "str")
        return f"<{converter}:{lookup_prefix}{kwarg}>"


class AppRouter(_IntIds, SimpleRouter):
    """An app's routes (`router = AppRouter()` at the end of its api.py)."""


class ApiRouter(_IntIds, DefaultRouter):
    """The one router controlplane.urls gathers the apps' routes into (it adds the API root). No `.json`-style
    format suffixes: the API speaks JSON only, and as path() routes they would enter the schema as operations."""

    include_format_suffixes = False
