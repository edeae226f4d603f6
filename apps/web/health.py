"""Is each service the control plane leans on answering? PostgreSQL (everything), Redis (live updates, the task
queue) and the Ray cluster (runs). `/healthz` reports all three; every page shows a banner while one is down, so a
frozen live view says why instead of going quiet.

Checks are cached for a few seconds per process: a page view costs at most one Redis ping per interval."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import redis
from django.conf import settings
from django.db import DatabaseError, connection
from django.http import HttpRequest

CACHE_SECONDS = 5.0


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    effect: str  # what a user notices while it is down


_lock = threading.Lock()
_cache: dict[str, tuple[float, Check]] = {}
_down_since: dict[str, float] = {}


def _database() -> Check:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError as exc:
        return Check("database", False, f"PostgreSQL does not answer: {exc}".strip(), "nothing can be saved or read")
    return Check("database", True, "PostgreSQL answers", "")


def _redis() -> Check:
    try:
        redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1, socket_timeout=1).ping()
    except (redis.RedisError, OSError) as exc:
        return Check(
            "redis",
            False,
            f"Redis at {settings.REDIS_URL} does not answer ({type(exc).__name__})",
            "live updates are paused and new runs wait to be dispatched; open pages catch up when it is back",
        )
    return Check("redis", True, "Redis answers", "")


def _ray() -> Check:
    address = settings.RAY_ADDRESS
    try:
        with urllib.request.urlopen(f"{address}/api/version", timeout=1) as response:  # noqa: S310 (configured)
            ok = response.status == 200
    except urllib.error.HTTPError as exc:
        ok = exc.code in (401, 403)  # token auth on: it answers, and runs authenticate with the token
    except OSError as exc:
        return Check("ray", False, f"the Ray cluster at {address} does not answer ({exc})", "runs cannot start")
    return Check("ray", ok, "the Ray Jobs API answers" if ok else f"Ray at {address} answered badly", "")


CHECKS = {"database": _database, "redis": _redis, "ray": _ray}


def check(name: str, *, fresh: bool = False) -> Check:
    now = time.monotonic()
    with _lock:
        cached = _cache.get(name)
    if cached and not fresh and now - cached[0] < CACHE_SECONDS:
        return cached[1]
    result = CHECKS[name]()
    with _lock:
        _cache[name] = (now, result)
        if result.ok:
            _down_since.pop(name, None)
        else:
            _down_since.setdefault(name, time.time())
    return result


def down_since(name: str) -> float | None:
    with _lock:
        return _down_since.get(name)


def problems(request: HttpRequest) -> dict[str, list[Check]]:
    """Template context: `service_problems`, the services that are down (Redis only on pages: a page that rendered
    has a database, and Ray's state shows on each run)."""
    if not getattr(request, "user", None) or not request.user.is_authenticated:
        return {"service_problems": []}
    redis_check = check("redis")
    return {"service_problems": [] if redis_check.ok else [redis_check]}
