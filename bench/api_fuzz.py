"""The API contract, fuzzed at length: schemathesis (every check, every phase: examples, coverage, fuzzing, and
stateful with the links it infers) against the served OpenAPI schema, as an admin and as a viewer.

    python bench/api_fuzz.py [--max-examples 20] [--seed 1] [--role admin --role viewer]

Each role gets a fresh database (`crucible_apifuzz`, with the demo data of `manage.py crucible_demo`), its own API
token and its own server (`manage.py runserver`, the ASGI server, on a free loopback port), which schemathesis
reaches over HTTP as a user would. Celery messages go to Redis database 13, flushed at the end; files to a temporary
directory. Prints, per role, the requests made (by status code) and the
failures by check; writes them to bench/results/api_fuzz.txt. Exits 1 if a contract check failed (tests/contract.py:
a 5xx, a response outside its schema, an undocumented status code or content type). Nothing here asserts on time.
The same check runs in the suite on a small budget: tests/test_api_contract.py.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PG = "postgresql://postgres@127.0.0.1:5432"
DATABASE = "crucible_apifuzz"
os.environ["DATABASE_URL"] = f"{PG}/{DATABASE}"
os.environ["REDIS_URL"] = "redis://127.0.0.1:6379/13"
os.environ["CRUCIBLE_VAR_DIR"] = tempfile.mkdtemp(prefix="crucible-apifuzz-")
atexit.register(shutil.rmtree, os.environ["CRUCIBLE_VAR_DIR"], ignore_errors=True)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

import logging  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
from collections import Counter  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402

import httpx  # noqa: E402
import psycopg  # noqa: E402


def recreate_database() -> None:
    from django.db import connections

    connections.close_all()
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DATABASE}"')


@contextmanager
def server() -> Iterator[str]:
    """`manage.py runserver` (daphne) on a free loopback port, against the fuzz database; yields its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/healthz", timeout=2)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the server did not start") from None
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def fuzz(role: str, max_examples: int, seed: int | None) -> object:
    import schemathesis
    from django.core.management import call_command
    from django.db import connections
    from schemathesis.engine import events, from_schema

    from apps.web.demo import load_demo
    from tests.contract import SCHEMA_PATH, Outcome, auth_headers, contract_config, fuzz_token, no_self_revoke

    recreate_database()
    call_command("migrate", verbosity=0)
    load_demo()
    from apps.accounts.models import User

    token_id, secret = fuzz_token(User.objects.get(username=role))
    connections.close_all()
    settings: dict[str, object] = {
        "workers": 1,
        "checks": {"enabled": True},
        "generation": {"max-examples": max_examples},
        "phases": {"stateful": {"max-steps": 12}},
    }
    if seed is not None:
        settings["seed"] = seed
    outcome = Outcome(role=role)
    statuses: Counter[int] = Counter()
    started = time.monotonic()
    with server() as url:
        config = contract_config(secret, **settings)
        schema = schemathesis.openapi.from_url(f"{url}{SCHEMA_PATH}", config=config, headers=auth_headers(secret))
        no_self_revoke(schema, token_id)
        for event in from_schema(schema).execute():
            if not isinstance(event, events.ScenarioFinished):
                _errors(event, outcome)
                continue
            for interaction in event.recorder.interactions.values():
                if interaction.response is not None:
                    statuses[interaction.response.status_code] += 1
            for case_id, checks in event.recorder.checks.items():
                case = event.recorder.cases.get(case_id)
                label = f"{case.value.method} {case.value.path}" if case is not None else event.recorder.label
                for check in checks:
                    if check.failure_info is None:
                        continue
                    interaction = event.recorder.interactions.get(case_id)
                    response = interaction.response if interaction else None
                    status: object = "-"
                    if response is not None:
                        kind = (response.headers.get("content-type") or ["?"])[0]
                        status = f"{response.status_code} {kind} {(response.content or b'')[:60]!r}"
                    failure = check.failure_info.failure
                    sent = _sent(case.value) if case is not None else ""
                    outcome.record(check.name, f"{label}{sent} -> {status}: {_first_line(failure.message)}")
    outcome.requests = statuses
    print(f"{role}: {time.monotonic() - started:.0f} s", flush=True)
    return outcome


def _errors(event: object, outcome: object) -> None:
    from schemathesis.engine import events

    if isinstance(event, events.NonFatalError):
        outcome.record("error", f"{event.label}: {event.info.message}")  # type: ignore[attr-defined]
    elif isinstance(event, events.FatalError):
        raise event.exception


def _sent(case: object) -> str:
    parts = [
        f" {name}={value!r}"[:200]
        for name in ("path_parameters", "query", "body")
        if (value := getattr(case, name, None)) not in (None, {}, [])
        and not (name == "body" and type(value).__name__ == "NotSet")
    ]
    return "".join(parts)


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line[:160]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-examples", type=int, default=20, help="generated cases per operation and phase")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--role", action="append", choices=["admin", "viewer"])
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # a 4xx is logged as a warning by Django; thousands of them are expected

    import django

    django.setup()
    import redis
    from django.conf import settings

    outcomes = [fuzz(role, args.max_examples, args.seed) for role in args.role or ["admin", "viewer"]]
    redis.Redis.from_url(settings.REDIS_URL).flushdb()
    report = "\n\n".join(o.report() for o in outcomes)  # type: ignore[attr-defined]
    print(report)
    results = ROOT / "bench" / "results" / "api_fuzz.txt"
    results.write_text(f"python bench/api_fuzz.py --max-examples {args.max_examples}\n\n{report}\n")
    return 1 if any(o.contract_failures for o in outcomes) else 0  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(main())
