from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request

from apps.accounts.models import ROLE_CAPABILITIES, ApiToken, Capability, User


def request_user(request: HttpRequest | Request) -> User:
    """`request.user` as a User, for views only a signed-in user reaches: pages behind `needs` or `login_required`,
    and API views behind HasCapability (the default permission: every action needs a capability, and an anonymous
    user has none)."""
    user = request.user
    assert isinstance(user, User), "this view needs a signed-in user"
    return user


def require_capability(user: User, capability: str, what: str) -> None:
    """For services: a PermissionDenied naming what was refused and the roles that hold `capability`."""
    if not user.can(capability):
        roles = " or ".join(role for role, caps in ROLE_CAPABILITIES.items() if capability in caps)
        raise PermissionDenied(f"{what} needs the {capability} permission (role {roles})")


def request_capabilities(request: Any) -> frozenset[str]:
    user = request.user
    if not user or not user.is_authenticated:
        return frozenset()
    caps: frozenset[str] = user.capabilities
    if isinstance(request.auth, ApiToken):
        caps = caps & frozenset(request.auth.scopes)
    return caps


class HasCapability(BasePermission):
    """Default policy: reads need `read`; writes need the view's `write_capability` (default `launch`).

    A view narrows it with `required_capabilities = {"GET": ..., "POST": ...}` or per-action in `capability_map`.
    """

    message = "your role or token scope does not allow this"

    def has_permission(self, request: Any, view: Any) -> bool:
        needed = required_capability(request, view)
        if needed is None:
            return True
        return needed in request_capabilities(request)


def required_capability(request: Any, view: Any) -> str | None:
    action = getattr(view, "action", None)
    capability_map: dict[str, str | None] = getattr(view, "capability_map", {})
    if action in capability_map:
        return capability_map[action]
    if request.method in SAFE_METHODS:
        return getattr(view, "read_capability", Capability.READ)
    return getattr(view, "write_capability", Capability.LAUNCH)
