"""Installed when the app registry is ready (apps.common autodiscovers every app's `hooks` module, its own too):
Django's middleware without a thread hop per hook under ASGI (apps.common.middleware)."""

from __future__ import annotations

from apps.common.middleware import install

install()
