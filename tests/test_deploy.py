"""Production settings pass `manage.py check --deploy`; development settings stay plain http on loopback.

Settings are read from the environment when the settings module is imported, so each configuration runs in a
subprocess of its own, with a clean environment (no DJANGO_* or CRUCIBLE_* variable leaks in from the caller's)."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client

ROOT = Path(__file__).resolve().parent.parent
CHECK_ID = re.compile(r"^\S*: \(([\w.]+)\) ", re.MULTILINE)
# README: Deployment. What an operator sets; everything else is the settings' production default.
PRODUCTION = {
    "DJANGO_DEBUG": "0",
    "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
    "DJANGO_ALLOWED_HOSTS": "crucible.example.com",
    "DJANGO_CSRF_TRUSTED_ORIGINS": "https://crucible.example.com",
    "DJANGO_SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto",
}
SECURITY_FIXED = {"security.W004", "security.W008", "security.W009", "security.W012", "security.W016"}


SHOWN = [
    "DEBUG",
    "SESSION_COOKIE_SECURE",
    "CSRF_COOKIE_SECURE",
    "SECURE_SSL_REDIRECT",
    "SECURE_HSTS_SECONDS",
    "SECURE_PROXY_SSL_HEADER",
    "WEBHOOK_ALLOWED_NETWORKS",
]
# Prints the settings in SHOWN as one JSON line, then runs `check --deploy` with the tags given as arguments.
SCRIPT = f"""
import json, sys, django
django.setup()
from django.conf import settings
from django.core.management import call_command
print("SETTINGS " + json.dumps({{name: getattr(settings, name) for name in {SHOWN!r}}}), flush=True)
if sys.argv[1:] != ["--no-check"]:
    call_command("check", "--deploy", *(f"--tag={{tag}}" for tag in sys.argv[1:]))
"""


def django_under(env: dict[str, str], *check_args: str) -> tuple[dict[str, object], list[str], str]:
    """Start Django with these environment variables only (no DJANGO_* or CRUCIBLE_WEBHOOK_* from the caller's):
    the settings it loaded, the ids `check --deploy` reported, and its output."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CRUCIBLE_WEBHOOK_"))}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *check_args],
        cwd=ROOT,
        env={**inherited, "DJANGO_SETTINGS_MODULE": "controlplane.settings", **env},
        capture_output=True,
        text=True,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output  # no error-level issue, whatever the configuration
    [line] = [line for line in done.stdout.splitlines() if line.startswith("SETTINGS ")]
    return json.loads(line.removeprefix("SETTINGS ")), CHECK_ID.findall(output), output


def test_production_settings_pass_check_deploy_with_no_warning():
    settings, ids, output = django_under(PRODUCTION)
    assert ids == [], output  # drf-spectacular's schema warnings included
    assert settings == {
        "DEBUG": False,
        "SESSION_COOKIE_SECURE": True,
        "CSRF_COOKIE_SECURE": True,
        "SECURE_SSL_REDIRECT": True,
        "SECURE_HSTS_SECONDS": 31536000,
        "SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_PROTO", "https"],
        "WEBHOOK_ALLOWED_NETWORKS": [],  # webhooks reach the public internet only
    }


def test_without_the_production_variables_check_deploy_names_what_is_missing():
    """The control: DEBUG off with the development secret over plain http is reported on every count."""
    _, ids, output = django_under({"DJANGO_DEBUG": "0", "DJANGO_HTTPS": "0"}, "security")
    assert SECURITY_FIXED <= set(ids), output


def test_development_stays_plain_http_on_loopback():
    settings, _, _ = django_under({}, "--no-check")
    assert settings == {
        "DEBUG": True,
        "SESSION_COOKIE_SECURE": False,
        "CSRF_COOKIE_SECURE": False,
        "SECURE_SSL_REDIRECT": False,
        "SECURE_HSTS_SECONDS": 0,
        "SECURE_PROXY_SSL_HEADER": None,
        "WEBHOOK_ALLOWED_NETWORKS": settings["WEBHOOK_ALLOWED_NETWORKS"],
    }
    assert "127.0.0.0/8" in settings["WEBHOOK_ALLOWED_NETWORKS"]  # type: ignore[operator]


# --- the redirect, in process ------------------------------------------------------------------------------------
@pytest.fixture
def https_on(settings):  # type: ignore[no-untyped-def]
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.SECURE_HSTS_SECONDS = 31536000
    settings.ALLOWED_HOSTS = ["crucible.example.com", "web", "localhost"]


@pytest.mark.django_db
def test_plain_http_is_redirected_but_not_behind_the_proxy_nor_for_health_checks_and_ray_reports(https_on):
    client = Client()
    page = client.get("/", HTTP_HOST="crucible.example.com")
    assert (page.status_code, page["Location"]) == (301, "https://crucible.example.com/")
    proxied = client.get("/api/v1/runs/", HTTP_HOST="crucible.example.com", HTTP_X_FORWARDED_PROTO="https")
    assert proxied.status_code in {401, 403}  # answered (not signed in): the proxy said the browser used https
    assert proxied["Strict-Transport-Security"] == "max-age=31536000"
    # The container health check and Ray jobs reporting over the private network (http://web:8000) are answered.
    health = client.get("/healthz", HTTP_HOST="localhost")
    assert health.status_code not in {301, 302} and "Strict-Transport-Security" not in health  # HSTS: https only
    ingest = client.post("/api/v1/runs/1/ingest/", b"{}", content_type="application/json", HTTP_HOST="web")
    assert ingest.status_code not in {301, 302}
    assert client.post("/api/v1/runs/", HTTP_HOST="web").status_code == 301  # the rest of the API is not exempt
