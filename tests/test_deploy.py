"""Production settings pass `manage.py check --deploy`; the defaults are production settings, plain http on loopback.

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
# Prints the settings named in SHOWN (or in CRUCIBLE_TEST_SHOWN) as one JSON line, then runs `check --deploy` with
# the tags given as arguments.
SCRIPT = f"""
import json, os, sys, django
django.setup()
from django.conf import settings
from django.core.management import call_command
shown = os.environ.get("CRUCIBLE_TEST_SHOWN", "").split(",") if os.environ.get("CRUCIBLE_TEST_SHOWN") else {SHOWN!r}
print("SETTINGS " + json.dumps({{name: getattr(settings, name) for name in shown}}), flush=True)
if sys.argv[1:] != ["--no-check"]:
    call_command("check", "--deploy", *(f"--tag={{tag}}" for tag in sys.argv[1:]))
"""


def django_under(
    env: dict[str, str], *check_args: str, shown: list[str] | None = None
) -> tuple[dict[str, object], list[str], str]:
    """Start Django with these environment variables only (no DJANGO_* or CRUCIBLE_WEBHOOK_* from the caller's):
    the settings it loaded, the ids `check --deploy` reported, and its output."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CRUCIBLE_WEBHOOK_"))}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *check_args],
        cwd=ROOT,
        env={
            **inherited,
            "DJANGO_SETTINGS_MODULE": "controlplane.settings",
            "CRUCIBLE_TEST_SHOWN": ",".join(shown or []),
            **env,
        },
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
    """The control: a weak secret over plain http is reported on every count."""
    _, ids, output = django_under({"DJANGO_HTTPS": "0", "DJANGO_SECRET_KEY": "short"}, "security")
    assert SECURITY_FIXED <= set(ids), output


def test_the_defaults_are_production_settings_and_plain_http_on_loopback(tmp_path):
    """No DJANGO_* variable at all (`make run`, `manage.py`, the tests): DEBUG off, webhooks to public addresses
    only, and, for a site that answers to loopback names only, plain http and a secret generated once under the
    var folder (mode 0600) and reused by the next process."""
    settings, _, _ = django_under({"CRUCIBLE_VAR_DIR": str(tmp_path)}, "--no-check")
    assert settings == {
        "DEBUG": False,
        "SESSION_COOKIE_SECURE": False,
        "CSRF_COOKIE_SECURE": False,
        "SECURE_SSL_REDIRECT": False,
        "SECURE_HSTS_SECONDS": 0,
        "SECURE_PROXY_SSL_HEADER": None,
        "WEBHOOK_ALLOWED_NETWORKS": [],
    }
    secret_file = tmp_path / "secret_key"
    assert secret_file.stat().st_mode & 0o777 == 0o600
    secret = secret_file.read_text().strip()
    assert len(secret) >= 50
    assert django_under({"CRUCIBLE_VAR_DIR": str(tmp_path)}, "--no-check", shown=["SECRET_KEY"])[0] == {
        "SECRET_KEY": secret
    }
    given = django_under(
        {"CRUCIBLE_VAR_DIR": str(tmp_path), "DJANGO_SECRET_KEY": "g" * 50}, "--no-check", shown=["SECRET_KEY"]
    )
    assert given[0] == {"SECRET_KEY": "g" * 50}  # an explicit secret wins


def test_debugging_is_an_explicit_opt_in():
    settings, _, _ = django_under({"DJANGO_DEBUG": "1"}, "--no-check")
    assert settings["DEBUG"] is True and settings["SECURE_SSL_REDIRECT"] is False
    assert settings["WEBHOOK_ALLOWED_NETWORKS"] == []  # debugging allows no local receiver by itself


def test_a_deployment_without_a_secret_refuses_to_start_and_says_what_to_set(tmp_path):
    """A site named by a real host and no DJANGO_SECRET_KEY: no known or per-process secret, a clear error."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CRUCIBLE_WEBHOOK_"))}
    env = {
        **inherited,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "DJANGO_ALLOWED_HOSTS": "crucible.example.com",
        "CRUCIBLE_VAR_DIR": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, "--no-check"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode != 0
    assert "DJANGO_SECRET_KEY is not set" in done.stderr and "crucible.example.com" in done.stderr
    assert not (tmp_path / "secret_key").exists()
    secret_file = tmp_path / "given"
    secret_file.write_text("f" * 50 + "\n")
    with_file = django_under(
        {"DJANGO_ALLOWED_HOSTS": "crucible.example.com", "DJANGO_SECRET_KEY_FILE": str(secret_file)},
        "--no-check",
        shown=["SECRET_KEY", "SECURE_SSL_REDIRECT"],
    )[0]
    assert with_file == {"SECRET_KEY": "f" * 50, "SECURE_SSL_REDIRECT": True}  # a deployment: https by default


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
