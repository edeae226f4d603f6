"""One GET through the ASGI application in process (no server): the status, headers and body it answers."""

from __future__ import annotations

from asgiref.testing import ApplicationCommunicator


async def asgi_get(path: str, query_string: bytes = b"") -> tuple[int, dict[bytes, bytes], bytes]:
    """GET `path` from `controlplane.asgi.application`; header names lowercased."""
    from controlplane.asgi import application

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
    return start["status"], {bytes(k).lower(): v for k, v in start["headers"]}, body
