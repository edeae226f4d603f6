"""apps/common/middleware.py under ASGI (Django's AsyncClient runs the ASGI handler, so the inline hooks run): the
security headers, CSRF, the session and messages behave as Django's own middleware made them."""

from __future__ import annotations

import re

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient

from apps.common import middleware
from apps.review.models import ReviewQueue

pytestmark = pytest.mark.django_db(transaction=True)


def _token(html: str) -> str:
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert found is not None, "no CSRF token on the page"
    return found.group(1)


def test_djangos_classes_run_the_inline_hooks_and_keep_their_paths() -> None:
    from django.conf import settings
    from django.utils.module_loading import import_string

    classes = [import_string(path) for path in settings.MIDDLEWARE]
    assert all(path.startswith("django.") for path in settings.MIDDLEWARE)  # check --deploy looks for these paths
    assert sum(cls.__acall__ is middleware._inline for cls in classes) == len(middleware.INLINE) == 4
    assert {cls.__acall__ for cls in classes} >= {middleware._csrf, middleware._session, middleware._messages}


def test_headers_csrf_session_and_messages_under_asgi(users) -> None:  # type: ignore[no-untyped-def]
    async def flow() -> None:
        client = AsyncClient(enforce_csrf_checks=True)
        page = await client.get("/accounts/login/")
        assert page.status_code == 200
        assert page["X-Frame-Options"] == "DENY" and page["X-Content-Type-Options"] == "nosniff"
        assert page["Referrer-Policy"] == "same-origin"
        assert "csrftoken" in page.cookies
        # CommonMiddleware still redirects a path without its slash.
        assert (await client.get("/accounts/login")).status_code == 301

        credentials = {"username": users["admin"].username, "password": "pw-123456"}
        refused = await client.post("/accounts/login/", credentials)
        assert refused.status_code == 403  # no CSRF token
        token = _token(page.content.decode())
        logged_in = await client.post("/accounts/login/", {**credentials, "csrfmiddlewaretoken": token})
        assert logged_in.status_code == 302 and "sessionid" in logged_in.cookies

        home = await client.get("/review/")
        assert home.status_code == 200 and users["admin"].username in home.content.decode()
        created = await client.post(
            "/review/",
            {
                "name": "asgi-queue",
                "required_reviews": "1",
                "lock_timeout_s": "900",
                "csrfmiddlewaretoken": _token(home.content.decode()),
            },
        )
        assert created.status_code == 302
        shown = await client.get(created["Location"])
        assert "Queue asgi-queue created with 0 item(s)." in shown.content.decode()
        again = await client.get(created["Location"])
        assert "Queue asgi-queue created" not in again.content.decode()  # a message is shown once

    async_to_sync(flow)()
    assert ReviewQueue.objects.filter(name="asgi-queue").count() == 1


def test_with_the_csrf_token_in_the_session_the_csrf_hooks_hop_as_djangos_do(users, settings) -> None:  # type: ignore[no-untyped-def]
    settings.CSRF_USE_SESSIONS = True

    async def flow() -> None:
        client = AsyncClient(enforce_csrf_checks=True)
        page = await client.get("/accounts/login/")
        credentials = {"username": users["admin"].username, "password": "pw-123456"}
        assert (await client.post("/accounts/login/", credentials)).status_code == 403
        ok = await client.post(
            "/accounts/login/", {**credentials, "csrfmiddlewaretoken": _token(page.content.decode())}
        )
        assert ok.status_code == 302

    async_to_sync(flow)()
