"""Stand-ins for what the simulator talks to, on one local HTTP server in a thread: an OpenAI-compatible
`/v1/chat/completions` whose replies a test scripts (the real serving app is workers.serving), the control plane's
feedback endpoint (`/api/v1/sessions/<id>/feedback/`: 201 new, 200 duplicate event id) and its ingest endpoint
(`/api/v1/runs/<id>/ingest/`), each recording what it received."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

KEY = "cri_7_simulator"


@dataclass
class Reply:
    """A scripted completion: text and tool calls (name, arguments), or an HTTP error, or a delay first."""

    content: str | None = None
    calls: list[tuple[str, Any]] = field(default_factory=list)  # arguments: a dict, or a raw string sent as is
    status: int = 200
    error: str = ""
    delay: float = 0.0


Policy = Callable[[dict[str, Any], dict[str, str]], Reply]


def turn_of(body: dict[str, Any]) -> int:
    """How many replies the agent has given in this conversation (0 for the first request)."""
    return sum(1 for m in body["messages"] if m["role"] == "assistant")


def instruction_of(body: dict[str, Any]) -> str:
    return next(m["content"] for m in body["messages"] if m["role"] == "user")


@dataclass
class StandIn:
    policy: Policy
    key: str = KEY
    feedback_key: str = KEY
    feedback_404_first: bool = False  # the first post of each event gets a 404 (turns not ingested yet)
    port: int = 0
    requests: list[tuple[dict[str, str], dict[str, Any]]] = field(default_factory=list)
    feedback: list[tuple[str, dict[str, Any], int]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _seen: set[str] = field(default_factory=set)
    _calls: int = 0

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root}/v1"

    @property
    def feedback_url(self) -> str:
        return f"{self.root}/api/v1/"

    @property
    def ingest_url(self) -> str:
        return f"{self.root}/api/v1/runs/7/ingest/"

    def posted(self, status: int | None = None) -> list[tuple[str, dict[str, Any]]]:
        with self._lock:
            return [(sid, body) for sid, body, code in self.feedback if status is None or code == status]

    def chat(self, headers: dict[str, str], body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if headers.get("authorization") != f"Bearer {self.key}":
            return 401, {"error": {"message": "invalid API key", "type": "invalid_request_error", "code": 401}}
        with self._lock:
            self.requests.append((headers, body))
            self._calls += 1
            number = self._calls
        reply = self.policy(body, headers)
        if reply.delay:
            time.sleep(reply.delay)
        if reply.status != 200:
            return reply.status, {"error": {"message": reply.error or "scripted failure", "type": "server_error"}}
        tool_calls = [
            {
                "id": f"call_{number}_{k}",
                "type": "function",
                "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)},
            }
            for k, (name, args) in enumerate(reply.calls)
        ]
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        return 200, {
            "id": f"chatcmpl-{number}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            "policy_version": 3,
            "session_id": headers.get("x-session-id", ""),
            "system_fingerprint": "crucible-v3",
        }

    def post_feedback(self, session_id: str, headers: dict[str, str], body: dict[str, Any]) -> tuple[int, Any]:
        answer: dict[str, Any]
        if headers.get("authorization") != f"Bearer {self.feedback_key}":
            status, answer = 403, {"detail": "this token may not post feedback"}
        else:
            with self._lock:
                key = f"{session_id}/{body.get('event_id')}"
                if self.feedback_404_first and f"404:{key}" not in self._seen:
                    self._seen.add(f"404:{key}")
                    status, answer = 404, {"detail": "no such session"}
                elif key in self._seen:
                    status, answer = 200, {"duplicate": True}
                else:
                    self._seen.add(key)
                    status, answer = 201, {"duplicate": False}
        with self._lock:
            self.feedback.append((session_id, body, status))
        return status, answer


@contextmanager
def serving(standin: StandIn) -> Iterator[StandIn]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            headers = {k.lower(): v for k, v in self.headers.items()}
            feedback = re.fullmatch(r"/api/v1/sessions/([^/]+)/feedback/", self.path)
            if self.path == "/v1/chat/completions":
                status, answer = standin.chat(headers, body)
            elif feedback:
                status, answer = standin.post_feedback(feedback.group(1), headers, body)
            elif self.path == "/api/v1/runs/7/ingest/":
                with standin._lock:
                    standin.events.extend(body["events"])
                status, answer = 200, {}
            else:
                status, answer = 404, {"detail": f"no route {self.path}"}
            data = json.dumps(answer).encode()
            try:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    standin.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield standin
    finally:
        server.shutdown()
        server.server_close()
