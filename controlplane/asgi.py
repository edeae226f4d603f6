import gc
import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
django_asgi_app = get_asgi_application()

# Serves /static/ from the app and STATICFILES_DIRS (vendored htmx, uPlot) with DEBUG on or off (the handler serves
# whatever DEBUG says; `make run` runs with it off, tests/test_make_run.py); a proxy can take over in production.
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.urls import path  # noqa: E402

from apps.runs.consumers import RunConsumer  # noqa: E402

websocket_urlpatterns = [path("ws/runs/<int:run_id>/", RunConsumer.as_asgi())]

UNDECODABLE = (
    b'{"detail": "the request could not be read: its path, query string, headers or form body are not valid UTF-8"}'
)


class JsonBadRequest:
    """Django's ASGI handler answers a request it cannot decode (UnicodeDecodeError while building it) with a bare,
    bodiless 400 before any view runs. Under /api/ that 400 says what went wrong, as JSON, like every other error
    the API gives (the schema documents 400 as `{"detail"}`)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] != "http" or not scope.get("path", "").startswith("/api/"):
            return await self.app(scope, receive, send)
        held: dict[str, Any] = {}

        async def wrapped(message):  # type: ignore[no-untyped-def]
            if message["type"] == "http.response.start" and message["status"] == 400:
                content_type = dict(message.get("headers") or []).get(b"content-type", b"")
                if not content_type.startswith(b"application/json"):
                    held["start"] = message
                    return None
            if message["type"] == "http.response.body" and "start" in held:
                start = held.pop("start")
                if message.get("body") or message.get("more_body"):
                    await send(start)  # a 400 with a body of its own: leave it as it is
                    return await send(message)
                kept = [(k, v) for k, v in start.get("headers") or [] if k not in (b"content-type", b"content-length")]
                length = str(len(UNDECODABLE)).encode()
                headers = [*kept, (b"content-type", b"application/json"), (b"content-length", length)]
                await send({**start, "headers": headers})
                return await send({"type": "http.response.body", "body": UNDECODABLE})
            return await send(message)

        return await self.app(scope, receive, wrapped)


def leave_request_bodies_to_django() -> None:
    """Twisted, under daphne, parses every multipart/form-data POST body itself before the app sees the request
    (into `request.args`, which daphne never reads) and answers one it cannot parse (an empty multipart body, say)
    with a bare 400 with no headers, which no API client can read and the OpenAPI schema cannot describe. It also
    holds a second copy of every upload in memory while it does so. Twisted's own switch for this,
    `Request(parsePOSTFormSubmission=False)`, is turned on for daphne's requests here: Django's parsers read the
    body, and a malformed one gets the API's JSON 400 naming the field. Applied on import of this module, which
    every server entry point (`daphne`, `manage.py runserver`, the compose file and the image) loads before it
    serves a request."""
    try:
        from daphne.http_protocol import WebRequest
    except ImportError:  # another ASGI server: nothing parses bodies ahead of the app
        return
    if getattr(WebRequest, "leaves_bodies_to_app", False):
        return
    parent_init = WebRequest.__init__

    def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        kwargs.setdefault("parsePOSTFormSubmission", False)
        parent_init(self, *args, **kwargs)

    WebRequest.__init__ = __init__
    WebRequest.leaves_bodies_to_app = True


leave_request_bodies_to_django()

application = ProtocolTypeRouter(
    {
        "http": JsonBadRequest(ASGIStaticFilesHandler(django_asgi_app)),
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)


def freeze_startup_heap() -> None:
    """Move everything the server process holds after start-up (Django, every app's modules, the URL resolver,
    pydantic's schemas: about 200k objects) out of the garbage collector's reach. None of it is ever garbage, yet a
    full collection walks all of it, and requests that allocate thousands of objects (an ingest batch validates into
    a thousand models) keep setting such collections off. Measured: about half of the validation time of a
    1,000-event batch went to the collector (2.3 ms with the heap unfrozen, 1.2 ms frozen). Collected first, so no
    garbage is frozen; objects created later are collected as usual."""
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 (imports every view module now, not on the first request)
    gc.collect()
    gc.freeze()


freeze_startup_heap()
