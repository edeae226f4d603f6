"""The guard every htmx page uses: logged in, and the user's role holds the capability. It lives with the app that owns
roles and capabilities, as healthchecks keeps its view guards in the app that owns auth."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

from apps.accounts.permissions import request_user


def needs(capability: str) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @login_required
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not request_user(request).can(capability):
                raise PermissionDenied(f"your role cannot do this (needs '{capability}')")
            return view(request, *args, **kwargs)

        return wrapped

    return decorator
