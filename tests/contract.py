"""The API contract check, shared by tests/test_api_contract.py (a small run in the suite) and bench/api_fuzz.py (a
long one): schemathesis generates requests from the served OpenAPI schema (/api/v1/schema/) and sends them to the
Django app in process (WSGI), with one role's API token, checking every response against the schema.

What must hold (CONTRACT_CHECKS): no 5xx, no response outside its documented schema, no status code or content type
the operation does not document. The other checks run too and are counted; `positive_data_acceptance` (a request
the schema allows got a 400) still finds requests whose ids or names make sense only against the data: an id in a
body that names no row, a name that is taken, an upload whose file is not JSONL, a draft already accepted. No OpenAPI
schema can state those, so they are counted, not failed on.

One setting narrows what is generated, and one hook what is sent, each for a reason outside the API contract:
  generation.allow-x00 = false   PostgreSQL text cannot hold NUL (U+0000), and DRF's CharField rejects it with a
                                 400 before it gets there; a NUL in every text field of the schema would be noise.
  filter_case (lockout)          the fuzzing token must not revoke itself (DELETE /tokens/{its id}/): every
                                 request after it would be a 401, which is right but tests nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections

from apps.accounts.models import User
from apps.accounts.services import api_token_create

SCHEMA_PATH = "/api/v1/schema/"
CONTRACT_CHECKS = {
    "not_a_server_error": "server errors",
    "response_schema_conformance": "schema violations",
    "status_code_conformance": "undocumented status codes",
    "content_type_conformance": "undocumented content types",
}


class CountingApp:
    """The WSGI app, counting the requests it answers by status code."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app
        self.statuses: Counter[int] = Counter()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        def start(status: str, headers: list[Any], *args: Any) -> Any:
            self.statuses[int(status.split()[0])] += 1
            return start_response(status, headers, *args)

        return self.app(environ, start)


@dataclass
class Outcome:
    role: str
    requests: Counter[int] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def record(self, check: str, detail: str) -> None:
        self.failures[check] += 1
        seen = self.examples.setdefault(check, [])
        if len(seen) < 12 and detail not in seen:
            seen.append(detail)

    @property
    def contract_failures(self) -> dict[str, int]:
        return {check: self.failures[check] for check in CONTRACT_CHECKS if self.failures[check]}

    def report(self) -> str:
        lines = [f"{self.role}: {sum(self.requests.values())} requests ({_statuses(self.requests)})"]
        for check in sorted(set(self.failures) | set(CONTRACT_CHECKS)):
            lines.append(f"  {check:<32} {self.failures[check]:>5}")
            lines += [f"      {detail}" for detail in self.examples.get(check, [])]
        return "\n".join(lines)


def _statuses(counts: Counter[int]) -> str:
    return ", ".join(f"{code}: {n}" for code, n in sorted(counts.items()))


def fuzz_token(user: User) -> tuple[int, str]:
    """A fresh API token holding all of the user's capabilities."""
    token, secret = api_token_create(user=user, name="contract-fuzz", scopes=sorted(user.capabilities))
    return token.pk, secret


def auth_headers(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def contract_config(secret: str, **settings: Any) -> Any:
    """schemathesis's configuration: every check on, no NUL in generated text (module docstring), plus `settings`
    (keys as in schemathesis.toml)."""
    generation = {"allow-x00": False, **settings.pop("generation", {})}
    return schemathesis.Config.from_dict(
        {"headers": auth_headers(secret), "generation": generation, "cache": {"enabled": False}, **settings}
    )


def load_schema(app: CountingApp, secret: str, **settings: Any) -> Any:
    return schemathesis.openapi.from_wsgi(
        SCHEMA_PATH, app, config=contract_config(secret, **settings), headers=auth_headers(secret)
    )


def no_self_revoke(schema: Any, token_id: int) -> None:
    @schema.hook("filter_case")
    def keep(context: Any, case: Any) -> bool:
        own = case.method == "DELETE" and case.path == "/api/v1/tokens/{id}/"
        return not (own and (case.path_parameters or {}).get("id") == token_id)


def failed_checks(failures: Iterable[Any]) -> Iterable[tuple[str, str]]:
    for failure in failures:
        yield getattr(failure, "check_name", None) or type(failure).__name__, str(getattr(failure, "title", failure))


def wsgi_app() -> CountingApp:
    return CountingApp(WSGIHandler())


@contextmanager
def in_test_transaction() -> Iterator[None]:
    """Requests to the WSGI app leave the test's database connection open (as django.test.Client does): the end
    or the start of a request would close it, and the test's transaction with it."""
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    try:
        yield
    finally:
        for signal in (request_started, request_finished):
            signal.connect(close_old_connections)
