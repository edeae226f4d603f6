"""The ASGI app as daphne serves it: a request Django cannot decode gets the API's JSON error, not a bare 400."""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.testing import ApplicationCommunicator

from controlplane.asgi import application


async def _get(path: str, query_string: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query_string,
        "root_path": "",
        "headers": [(b"host", b"testserver")],
        "server": ("testserver", 80),
        "client": ("127.0.0.1", 5000),
    }
    communicator = ApplicationCommunicator(application, scope)
    await communicator.send_input({"type": "http.request", "body": b"", "more_body": False})
    start = await communicator.receive_output(10)
    body = b""
    while True:
        message = await communicator.receive_output(10)
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    return start["status"], dict(start["headers"]), body


@pytest.mark.django_db(transaction=True)
def test_an_undecodable_api_request_is_a_json_400_naming_the_problem():
    status, headers, body = asyncio.run(_get("/api/v1/runs/", b"status=\xff\xfe"))
    assert status == 400 and headers[b"content-type"] == b"application/json"
    assert "not valid UTF-8" in json.loads(body)["detail"]
    assert int(headers[b"content-length"]) == len(body)
