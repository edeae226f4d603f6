"""The shell: health check for load balancers and the process supervisor."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from apps.web import health


def healthz(request: HttpRequest) -> JsonResponse:
    """200 while PostgreSQL answers (the web process can serve), 503 when it does not; Redis and Ray are reported
    beside it (degraded, not down: pages still work without them). `?fresh=1` skips the few-second cache."""
    fresh = request.GET.get("fresh") == "1"
    checks = {name: health.check(name, fresh=fresh) for name in health.CHECKS}
    body = {
        "ok": checks["database"].ok,
        "degraded": [name for name, c in checks.items() if not c.ok and name != "database"],
        "services": {
            name: {"ok": c.ok, "detail": c.detail, **({"effect": c.effect} if not c.ok else {})}
            for name, c in checks.items()
        },
    }
    return JsonResponse(body, status=200 if body["ok"] else 503)
