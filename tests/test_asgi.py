"""The ASGI app as its servers serve it (daphne for `make run`, uvicorn with worker processes in docker-compose): a
request Django cannot decode, or a form body Twisted cannot parse, gets the API's JSON error, not a bare 400."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.asgi_request import asgi_get

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.django_db(transaction=True)
def test_an_undecodable_api_request_is_a_json_400_naming_the_problem():
    status, headers, body = asyncio.run(asgi_get("/api/v1/runs/", b"status=\xff\xfe"))
    assert status == 400 and headers[b"content-type"] == b"application/json"
    assert "not valid UTF-8" in json.loads(body)["detail"]
    assert int(headers[b"content-length"]) == len(body)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


SERVERS = {
    "daphne": ["-m", "daphne", "-b", "127.0.0.1", "-p", "{port}"],
    # docker-compose's web command: several worker processes behind one socket.
    "uvicorn-workers": [
        "-m",
        "uvicorn",
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "--workers",
        "2",
        "--no-access-log",
    ],
}


@pytest.fixture(scope="module", params=sorted(SERVERS))
def server_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A server running controlplane.asgi:application on a free loopback port, as `make run` or compose starts it."""
    port = _free_port()
    command = [sys.executable, *(a.format(port=port) for a in SERVERS[request.param]), "controlplane.asgi:application"]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, f"{request.param} did not start"
                time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _raw_post(address: str, path: str, content_type: bytes, body: bytes) -> bytes:
    host, port = address.split(":")
    request = (
        b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: " + content_type + b"\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body
    )
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(request)
        received = b""
        while chunk := conn.recv(65536):
            received += chunk
    return received


def test_a_multipart_body_twisted_cannot_parse_reaches_the_api_and_gets_its_json_answer(server_url):
    """An empty multipart body (only the closing boundary) was answered by Twisted with a bare, header-less 400
    before Django saw it; now the API answers (here: 401, no credentials) with JSON."""
    raw = _raw_post(server_url, "/api/v1/gates/0/evaluate/", b"multipart/form-data; boundary=abc", b"--abc--\r\n")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 401"), head
    assert b"content-type: application/json" in head.lower()
    assert "credentials" in json.loads(body)["detail"].lower()


def test_the_server_process_freezes_its_start_up_heap_out_of_the_collectors_reach():
    """Importing the ASGI app (what every server process does before it serves) loads every view module and then
    freezes what it holds, so a full collection under load walks only what requests allocated."""
    probe = (
        "import gc, sys; import controlplane.asgi; "
        "print(gc.get_freeze_count(), 'apps.runs.ingest' in sys.modules, gc.get_count()[0])"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    frozen, views_loaded, young = out.stdout.split()
    assert int(frozen) > 50_000  # Django and the apps: about 200k objects
    assert views_loaded == "True"
    assert int(young) < 1_000  # collected just before freezing: nothing left waiting
