"""A real HTTP receiver on 127.0.0.1 for the webhook tests. Webhooks reach no loopback address by default; these
tests allow loopback (`local_receivers_allowed`), as CRUCIBLE_WEBHOOK_ALLOWED_NETWORKS=127.0.0.0/8,::1/128 would,
and the tests of refusals take it away again (`no_allowed_networks` in test_egress.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from apps.webhooks.models import WebhookEndpoint
from apps.webhooks.services import webhook_endpoint_create

LOOPBACK_NETWORKS = ["127.0.0.0/8", "::1/128"]


@pytest.fixture(autouse=True)
def local_receivers_allowed(settings):  # type: ignore[no-untyped-def]
    """The receiver listens on 127.0.0.1, which webhooks may reach only when the setting names loopback."""
    settings.WEBHOOK_ALLOWED_NETWORKS = LOOPBACK_NETWORKS


# --- a real receiver -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    def header(self, name: str) -> str:
        return {key.lower(): value for key, value in self.headers.items()}[name.lower()]


class Receiver:
    """A ThreadingHTTPServer that records every request and answers the statuses queued with `answer` (then 200).
    With `hold` set, it keeps each request open until `release` is set (a slow receiver)."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.answers: list[int] = []
        self.reply_body: bytes | None = None
        self.reply_headers: dict[str, str] = {}
        self.hold = False
        self.arrived = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/crucible"

    def answer(self, *statuses: int) -> None:
        with self._lock:
            self.answers.extend(statuses)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._lock:
                    receiver.requests.append(Received(self.path, dict(self.headers.items()), body))
                    status = receiver.answers.pop(0) if receiver.answers else 200
                receiver.arrived.set()
                if receiver.hold:
                    receiver.release.wait(timeout=10)
                reply = receiver.reply_body if receiver.reply_body is not None else f"answered {status}".encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(reply)))
                for name, value in receiver.reply_headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output clean

        return Handler


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    server.thread.start()
    yield server
    server.release.set()
    server.server.shutdown()
    server.server.server_close()


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    ids: list[int] = []
    monkeypatch.setattr("apps.webhooks.tasks.deliver_webhook.delay", ids.append)
    return ids


@pytest.fixture
def endpoint(users, receiver) -> WebhookEndpoint:  # type: ignore[no-untyped-def]
    return webhook_endpoint_create(created_by=users["admin"], name="ci", url=receiver.url, events=["*"])
