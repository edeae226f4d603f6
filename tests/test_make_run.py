"""`make run` runs with production settings (issue 36, section 5): DEBUG off unless DJANGO_DEBUG=1 asks, plain http
on its loopback bind, a secret generated once into var/secret_key and reused, static files served by the ASGI app,
and the app's own 404 page instead of Django's debug page."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from controlplane import devstack
from tests.asgi_request import asgi_get

ROOT = Path(__file__).resolve().parent.parent
SERVICES = {"DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/crucible", "REDIS_URL": "redis://127.0.0.1:6379/0"}
# The caller's environment without any Django or webhook setting of its own.
CLEAN = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CRUCIBLE_WEBHOOK_", "CRUCIBLE_VAR"))}


def settings_under(env: dict[str, str], *names: str) -> dict[str, object]:
    """The settings a process started with `env` (as `make run` starts web, worker and beat) reads."""
    code = (
        "import json, django; django.setup(); from django.conf import settings; "
        f"print(json.dumps({{n: getattr(settings, n) for n in {list(names)!r}}}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "controlplane.settings"},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_make_run_runs_with_debug_off_plain_http_and_a_secret_kept_under_var(tmp_path):
    env = devstack.stack_env(tmp_path, SERVICES, "http://127.0.0.1:8265", environ=CLEAN)
    assert (env["DJANGO_DEBUG"], env["DJANGO_HTTPS"]) == ("0", "0")
    secret_file = tmp_path / "secret_key"
    assert env["DJANGO_SECRET_KEY_FILE"] == str(secret_file)
    assert secret_file.stat().st_mode & 0o777 == 0o600
    secret = secret_file.read_text().strip()
    assert len(secret) >= 50

    shown = settings_under(env, "DEBUG", "SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE", "SECRET_KEY")
    assert shown == {"DEBUG": False, "SECURE_SSL_REDIRECT": False, "SESSION_COOKIE_SECURE": False, "SECRET_KEY": secret}

    # A restart (a second `make run`) reuses the secret: sessions and running jobs' ingest tokens stay valid.
    again = devstack.stack_env(tmp_path, SERVICES, "http://127.0.0.1:8265", environ=CLEAN)
    assert again["DJANGO_SECRET_KEY_FILE"] == str(secret_file) and secret_file.read_text().strip() == secret


def test_debugging_and_an_explicit_secret_are_the_callers_choice(tmp_path):
    env = devstack.django_env(tmp_path, {"DJANGO_DEBUG": "1", "DJANGO_SECRET_KEY": "s" * 50})
    assert env == {"DJANGO_DEBUG": "1", "DJANGO_HTTPS": "0"}  # the given secret is inherited as it is
    assert not (tmp_path / "secret_key").exists()
    full = devstack.stack_env(tmp_path, SERVICES, "http://127.0.0.1:8265", environ={**CLEAN, "DJANGO_DEBUG": "1"})
    assert settings_under(full, "DEBUG", "WEBHOOK_ALLOWED_NETWORKS") == {"DEBUG": True, "WEBHOOK_ALLOWED_NETWORKS": []}


# --- the ASGI app with DEBUG off ---------------------------------------------------------------------------------


def test_the_asgi_app_serves_static_files_with_debug_off(settings):
    settings.DEBUG = False
    status, headers, body = asyncio.run(asgi_get("/static/css/app.css"))
    assert status == 200 and headers[b"content-type"].startswith(b"text/css")
    assert body == (ROOT / "static" / "css" / "app.css").read_bytes()
    assert asyncio.run(asgi_get("/static/vendor/htmx.min.js"))[0] == 200
    assert asyncio.run(asgi_get("/static/no-such-file.js"))[0] == 404


def test_a_missing_page_is_the_apps_404_page(settings):
    settings.DEBUG = False
    status, headers, body = asyncio.run(asgi_get("/no-such-page/"))
    page = body.decode()
    assert status == 404 and headers[b"content-type"].startswith(b"text/html")
    assert 'id="not-found"' in page and "/no-such-page/" in page and "css/app.css" in page
    assert "URLconf" not in page  # not Django's debug page


def test_a_server_error_is_the_apps_500_page():
    from django.template.loader import render_to_string

    page = render_to_string("500.html")  # Django renders it without a request or context processors
    assert 'id="server-error"' in page and "css/app.css" in page


# --- the web process as `make run` starts it ---------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def make_run_web(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """daphne with `make run`'s environment (devstack.stack_env) and nothing else of the caller's settings."""
    var = tmp_path_factory.mktemp("make-run-var")
    services = {"DATABASE_URL": django_settings.DATABASE_URL, "REDIS_URL": django_settings.REDIS_URL}
    env = devstack.stack_env(var, services, "http://127.0.0.1:9", environ=CLEAN)
    port = _free_port()
    argv = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "controlplane.asgi:application"]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        devstack.wait_for_port("127.0.0.1", port, timeout=60)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 (loopback)
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_make_runs_web_serves_static_files_and_the_apps_404_over_plain_http(make_run_web):
    status, css = _fetch(f"{make_run_web}/static/css/app.css")
    assert status == 200 and css == (ROOT / "static" / "css" / "app.css").read_text()
    status, page = _fetch(f"{make_run_web}/no-such-page/")
    assert status == 404 and 'id="not-found"' in page
    assert "URLconf" not in page and "DEBUG = True" not in page  # Django's debug page is gone
    status, login = _fetch(f"{make_run_web}/accounts/login/")  # plain http answered, not redirected to https
    assert status == 200 and "Log in" in login
