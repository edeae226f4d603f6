"""Django's middleware, without a thread hop per hook under ASGI (installed by apps/common/hooks.py once the app
registry is ready).

Under ASGI, Django runs every synchronous hook of a `MiddlewareMixin` middleware (`process_request`,
`process_response`) through `sync_to_async(thread_sensitive=True)`: two hops to another thread per middleware per
request, about a dozen for this project's stack, measured at 3.7 ms of CPU for a one-event ingest request (issue
22). Most of those hooks do no I/O: they read headers and cookies, set headers, build lazy objects. `install()`
gives Django's own classes an async `__acall__` that runs those hooks inline on the event loop and keeps the hop
where a hook can block:

- `SessionMiddleware.process_response` hops when it will save the session to the database (the request modified
  it, or SESSION_SAVE_EVERY_REQUEST).
- `MessageMiddleware.process_response` hops when the request added or read messages (storing them can touch the
  session); otherwise it has nothing to store.
- `CsrfViewMiddleware` hops as before with CSRF_USE_SESSIONS (its token then lives in the session); its
  `process_view` (which can read a form body) keeps Django's hop.

The classes stay Django's, at their usual paths in MIDDLEWARE, so `manage.py check --deploy` sees them. `__call__`
(WSGI, the test client's synchronous handler) is untouched.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.http import HttpRequest
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware
from django.middleware.csrf import CsrfViewMiddleware
from django.middleware.security import SecurityMiddleware
from django.utils.deprecation import MiddlewareMixin

INLINE = (SecurityMiddleware, CommonMiddleware, AuthenticationMiddleware, XFrameOptionsMiddleware)
"""Middleware whose process_request and process_response do no I/O: both run inline."""


async def _inline(self: Any, request: HttpRequest) -> Any:
    response = None
    process_request = getattr(self, "process_request", None)
    if process_request is not None:
        response = process_request(request)
    response = response or await self.get_response(request)
    process_response = getattr(self, "process_response", None)
    if process_response is not None:
        response = process_response(request, response)
    return response


async def _csrf(self: Any, request: HttpRequest) -> Any:
    if settings.CSRF_USE_SESSIONS:  # the token lives in the session: reading it can load it from the database
        return await MiddlewareMixin.__acall__(self, request)
    return await _inline(self, request)


async def _session(self: Any, request: HttpRequest) -> Any:
    self.process_request(request)  # a lazy store: no I/O
    response = await self.get_response(request)
    if request.session.modified or settings.SESSION_SAVE_EVERY_REQUEST:
        return await sync_to_async(self.process_response, thread_sensitive=True)(request, response)
    return self.process_response(request, response)


async def _messages(self: Any, request: HttpRequest) -> Any:
    self.process_request(request)  # builds the storage: no I/O
    response = await self.get_response(request)
    storage = getattr(request, "_messages", None)
    if storage is not None and (storage.used or storage.added_new):
        return await sync_to_async(self.process_response, thread_sensitive=True)(request, response)
    return response


def install() -> None:
    """Give Django's middleware classes the async `__acall__` above (idempotent)."""
    for cls in INLINE:
        cls.__acall__ = _inline  # type: ignore[method-assign]
    CsrfViewMiddleware.__acall__ = _csrf  # type: ignore[method-assign]
    SessionMiddleware.__acall__ = _session  # type: ignore[method-assign]
    MessageMiddleware.__acall__ = _messages  # type: ignore[method-assign]
