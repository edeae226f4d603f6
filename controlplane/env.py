"""Typed helpers that read settings from the environment and fail loudly on a bad value."""

from __future__ import annotations

import ipaddress
import os
import secrets
import tempfile
from pathlib import Path
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


def env_list(name: str, default: list[str]) -> list[str]:
    """A comma-separated list; unset means `default`, set but empty means an empty list."""
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_networks(name: str, default: list[str]) -> list[str]:
    """A comma-separated list of IP networks in CIDR form (10.0.0.0/8, fd00::/8; a bare address is a /32 or
    /128), normalised. Unset means `default`; set but empty means none."""
    networks = []
    for item in env_list(name, default):
        try:
            networks.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise SettingError(
                f"{name}: {item!r} is not an IP network; give CIDRs separated by commas, e.g. 10.0.0.0/8,fd00::/8"
            ) from None
    return networks


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


def secret_key_file(path: Path, *, create: bool) -> str:
    """The secret key kept in `path`. With `create`, a missing file is made once with a new random secret (mode
    0600, written in full before it appears under its name, so processes starting together all read the same one);
    without it, a missing or empty file is an error that names the file."""
    if create and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".secret_key.")  # mode 0600
        try:
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_urlsafe(50) + "\n")
            try:
                os.link(tmp, path)  # atomic, and never replaces a secret another process made first
            except FileExistsError:
                pass
        finally:
            os.unlink(tmp)
    try:
        secret = path.read_text().strip()
    except OSError as exc:
        raise SettingError(f"the secret key file {path} cannot be read ({exc.strerror})") from None
    if not secret:
        raise SettingError(f"the secret key file {path} is empty; put 50+ random characters in it")
    return secret
