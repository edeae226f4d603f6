from __future__ import annotations

from datetime import datetime

from django.db import transaction
from rest_framework.exceptions import ValidationError

from apps.accounts.models import ApiToken, Capability, User, hash_secret, new_secret


@transaction.atomic
def api_token_create(
    *,
    user: User,
    name: str,
    scopes: list[str],
    expires_at: datetime | None = None,
    granted: frozenset[str] | None = None,
) -> tuple[ApiToken, str]:
    """Create a token; returns the row and the secret, which is never stored and never shown again."""
    valid = set(Capability.values)
    unknown = sorted(set(scopes) - valid)
    if unknown:
        raise ValidationError({"scopes": [f"unknown scope(s) {unknown}; choose from {sorted(valid)}"]})
    if not scopes:
        raise ValidationError({"scopes": ['give at least one scope, e.g. ["read"]']})
    # A token can only mint tokens within its own scopes; a session within the role.
    allowed = user.capabilities if granted is None else granted
    beyond = sorted(set(scopes) - set(allowed))
    if beyond:
        raise ValidationError({"scopes": [f"your role or token ({sorted(allowed)}) does not grant {beyond}"]})
    if ApiToken.objects.filter(user=user, name=name).exists():
        raise ValidationError({"name": [f"you already have a token named {name!r}; pick another name"]})
    secret = new_secret("crk")
    token = ApiToken.objects.create(
        user=user,
        name=name,
        prefix=secret[:10],
        key_hash=hash_secret(secret),
        scopes=sorted(set(scopes)),
        expires_at=expires_at,
    )
    return token, secret
