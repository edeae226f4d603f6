"""Django's middleware, without a thread hop per hook under ASGI.

Under ASGI, Django runs every synchronous hook of a `MiddlewareMixin` middleware (`process_request`,
`process_response`, `process_view`) through `sync_to_async(thread_sensitive=True)`: two hops to another thread per
middleware per request, about a dozen for this project's stack, and measured at 3.7 ms of CPU for a one-event
ingest request (issue 22). Most of those hooks do no I/O: they read headers and cookies, set headers, build lazy
objects. The subclasses here run those hooks inline on the event loop and keep the hop where a hook can block:

- `SessionMiddleware.process_response` hops when it will save the session to the database (the request modified
  it, or SESSION_SAVE_EVERY_REQUEST).
- `MessageMiddleware.process_response` hops when the request added or read messages (storing them can touch the
  session); otherwise it has nothing to store.
- `CsrfViewMiddleware` hops as Django's does with `CSRF_USE_SESSIONS` (its token is then in the session), and its
  `process_view` reads the request body (`request.POST`) for an unsafe method on a view that is not
  CSRF-exempt, so it hops then; for safe methods and exempt views (the REST API, ingest) it returns before reading.

Under WSGI and the test client's synchronous handler nothing changes: `__call__` is Django's.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import middleware as auth
from django.contrib.messages import middleware as messages
from django.contrib.sessions import middleware as sessions
from django.http import HttpRequest, HttpResponseBase
from django.middleware import clickjacking, common, csrf, security


class _InlineHooks:
    """`process_request` and `process_response` run inline under ASGI (they must do no I/O)."""

    get_response: Any

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        response = None
        process_request = getattr(self, "process_request", None)
        if process_request is not None:
            response = process_request(request)
        response = response or await self.get_response(request)
        process_response = getattr(self, "process_response", None)
        if process_response is not None:
            response = process_response(request, response)
        return response  # type: ignore[no-any-return]


class SecurityMiddleware(_InlineHooks, security.SecurityMiddleware):
    pass


class SessionMiddleware(sessions.SessionMiddleware):
    """The session store is built lazily (no I/O) inline; `process_response` hops only when it will save (the
    session was modified, or SESSION_SAVE_EVERY_REQUEST), otherwise it only sets headers and cookies."""

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        self.process_request(request)
        response: Any = await self.get_response(request)  # type: ignore[misc]
        if request.session.modified or settings.SESSION_SAVE_EVERY_REQUEST:
            response = await sync_to_async(self.process_response, thread_sensitive=True)(request, response)
            return response  # type: ignore[no-any-return]
        return self.process_response(request, response)


class CommonMiddleware(_InlineHooks, common.CommonMiddleware):
    pass


class CsrfViewMiddleware(_InlineHooks, csrf.CsrfViewMiddleware):
    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        if settings.CSRF_USE_SESSIONS:  # the token lives in the session: reading it can load it from the database
            return await csrf.CsrfViewMiddleware.__acall__(self, request)
        return await super().__acall__(request)

    async def process_view(  # type: ignore[override]
        self, request: HttpRequest, callback: Any, callback_args: Any, callback_kwargs: Any
    ) -> HttpResponseBase | None:
        check = super().process_view
        if getattr(callback, "csrf_exempt", False) or request.method in ("GET", "HEAD", "OPTIONS", "TRACE"):
            return check(request, callback, callback_args, callback_kwargs)  # returns before reading the body
        return await sync_to_async(check, thread_sensitive=True)(request, callback, callback_args, callback_kwargs)


class AuthenticationMiddleware(_InlineHooks, auth.AuthenticationMiddleware):
    pass


class MessageMiddleware(messages.MessageMiddleware):
    """`process_request` builds the storage (no I/O) inline; `process_response` hops only when the request added or
    read messages, as storing them can load and write the session."""

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        self.process_request(request)
        response: Any = await self.get_response(request)  # type: ignore[misc]
        storage = getattr(request, "_messages", None)
        if storage is not None and (storage.used or storage.added_new):
            response = await sync_to_async(self.process_response, thread_sensitive=True)(request, response)
        return response  # type: ignore[no-any-return]


class XFrameOptionsMiddleware(_InlineHooks, clickjacking.XFrameOptionsMiddleware):
    pass
