"""A service that goes away is said, not silent: /healthz names it and every page shows a banner."""

from __future__ import annotations

import pytest

from apps.web import health

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_cache():  # type: ignore[no-untyped-def]
    health._cache.clear()
    health._down_since.clear()
    yield
    health._cache.clear()
    health._down_since.clear()


def test_healthz_reports_each_service_and_stays_up_while_only_redis_is_down(client, settings):
    settings.REDIS_URL = "redis://127.0.0.1:9/0"  # nothing listens there
    settings.RAY_ADDRESS = "http://127.0.0.1:9"
    reply = client.get("/healthz?fresh=1")
    assert reply.status_code == 200
    body = reply.json()
    assert body["ok"] is True and sorted(body["degraded"]) == ["ray", "redis"]
    assert "redis://127.0.0.1:9/0" in body["services"]["redis"]["detail"]
    assert "live updates are paused" in body["services"]["redis"]["effect"]
    assert body["services"]["database"] == {"ok": True, "detail": "PostgreSQL answers"}
    assert health.down_since("redis") is not None


def test_every_page_shows_a_banner_while_redis_is_down_and_none_when_it_is_back(client, users, settings):
    from django.urls import reverse

    client.force_login(users["viewer"])
    live = settings.REDIS_URL
    settings.REDIS_URL = "redis://127.0.0.1:9/0"
    page = client.get(reverse("runs:list")).content.decode()
    assert 'id="service-redis"' in page and "live updates are paused" in page
    health._cache.clear()
    settings.REDIS_URL = live
    assert 'id="service-redis"' not in client.get(reverse("runs:list")).content.decode()
