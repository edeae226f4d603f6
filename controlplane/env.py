"""Typed helpers that read settings from the environment and fail loudly on a bad value."""

from __future__ import annotations

import os
from urllib.parse import unquote, urlparse


class SettingError(RuntimeError):
    pass


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise SettingError(f"{name}={raw!r} is not an integer; set it to a whole number or unset it") from None


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in {"1", "true", "yes", "on"}:
        return True
    if raw.lower() in {"0", "false", "no", "off"}:
        return False
    raise SettingError(f"{name}={raw!r} is not a boolean; use 1/0, true/false, yes/no or on/off")


def database_from_url(url: str) -> dict[str, object]:
    """Turn postgresql://user:pass@host:port/name?host=/socket/dir into a Django DATABASES entry."""
    parsed = urlparse(url)
    if parsed.scheme not in {"postgres", "postgresql"}:
        raise SettingError(f"DATABASE_URL={url!r}: only postgresql:// URLs are supported")
    query = dict(part.split("=", 1) for part in parsed.query.split("&") if "=" in part)
    host = unquote(parsed.hostname or "") or query.get("host", "")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parsed.path.lstrip("/")) or "crucible",
        "USER": unquote(parsed.username or ""),
        "PASSWORD": unquote(parsed.password or ""),
        "HOST": unquote(query.get("host", host)),
        "PORT": str(parsed.port or ""),
        "CONN_MAX_AGE": 60,
        "CONN_HEALTH_CHECKS": True,
    }
