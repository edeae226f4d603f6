from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed

from apps.accounts.models import ApiToken, hash_secret


def bearer_secret(request: Any) -> str | None:
    header = get_authorization_header(request).decode(errors="replace").split()
    if len(header) != 2 or header[0].lower() != "bearer":
        return None
    return header[1]


LAST_USED_RESOLUTION = timedelta(minutes=1)


class ApiTokenAuthentication(BaseAuthentication):
    """`Authorization: Bearer crk_...`; request.auth becomes the ApiToken so permissions can apply its scopes."""

    def authenticate(self, request: Any) -> tuple[Any, ApiToken] | None:
        secret = bearer_secret(request)
        if secret is None or not secret.startswith("crk_"):
            return None
        token = ApiToken.objects.select_related("user").filter(key_hash=hash_secret(secret)).first()
        now = timezone.now()
        if token is None or token.revoked_at is not None or not token.user.is_active:
            raise AuthenticationFailed("invalid or revoked API token; create a new one under /api/v1/tokens/")
        if token.expires_at is not None and token.expires_at <= now:
            raise AuthenticationFailed("API token expired; create a new one under /api/v1/tokens/")
        # Record use at most once a minute: a write (and its commit) on every read would double a cheap GET's cost.
        if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token

    def authenticate_header(self, request: Any) -> str:
        return "Bearer"
