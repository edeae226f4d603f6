"""Startup checks (`manage.py check`, `migrate`, the server): every run kind has a handler and every worker event
kind has a store, so a kind added without its app's registration fails at once instead of at its first run."""

from __future__ import annotations

from typing import Any

from django.core.checks import Error, register

from apps.runs import kinds
from apps.runs.models import RunKind
from apps.runs.services.ingest import event_kinds_without_store


@register()
def run_kinds_check(app_configs: Any, **kwargs: Any) -> list[Error]:
    errors = []
    registered = {handler.kind for handler in kinds.handlers()}
    for kind in RunKind.values:
        if kind not in registered:
            errors.append(
                Error(
                    f"run kind {kind!r} has no handler",
                    hint="the app that owns it registers one with apps.runs.kinds.register() in its hooks module",
                    id="runs.E001",
                )
            )
    for kind in event_kinds_without_store():
        errors.append(
            Error(
                f"worker event kind {kind!r} has no ingest store",
                hint="the app that owns it registers one with apps.runs.services.ingest.register_event_store()",
                id="runs.E002",
            )
        )
    return errors
