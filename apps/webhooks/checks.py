"""The webhook settings are integers from the environment (controlplane/env.py); this refuses the ones that parse
but cannot work, at startup (`migrate`, `check`) rather than as every delivery failing."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, register


@register()
def webhook_settings_check(app_configs: Any, **kwargs: Any) -> list[Error]:
    errors = []
    if settings.WEBHOOK_TIMEOUT < 1:
        errors.append(
            Error(
                f"CRUCIBLE_WEBHOOK_TIMEOUT={settings.WEBHOOK_TIMEOUT} must be at least 1 (seconds)",
                id="webhooks.E001",
            )
        )
    if settings.WEBHOOK_MAX_ATTEMPTS < 1:
        errors.append(
            Error(
                f"CRUCIBLE_WEBHOOK_MAX_ATTEMPTS={settings.WEBHOOK_MAX_ATTEMPTS} must be at least 1",
                id="webhooks.E002",
            )
        )
    return errors
