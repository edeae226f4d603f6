from __future__ import annotations

import hashlib
import secrets

from django.contrib.auth.models import AbstractUser
from django.db import models


class Role(models.TextChoices):
    VIEWER = "viewer", "Viewer"
    OPERATOR = "operator", "Operator"
    REVIEWER = "reviewer", "Reviewer"
    APPROVER = "approver", "Approver"
    ADMIN = "admin", "Admin"


class Capability(models.TextChoices):
    """What an action needs. A role grants a set; an API token narrows it with its scopes."""

    READ = "read", "Read everything"
    LAUNCH = "launch", "Create datasets, reward configs and runs; cancel runs"
    REVIEW = "review", "Judge flagged trajectories"
    APPROVE = "approve", "Approve or reject gate decisions; roll deployments back"
    ADMIN = "admin", "Manage users, tokens of others, gates and deployments"
    SERVE = "serve", "Call the serving endpoint and post session feedback"


ROLE_CAPABILITIES: dict[str, frozenset[str]] = {
    Role.VIEWER: frozenset({Capability.READ}),
    Role.OPERATOR: frozenset({Capability.READ, Capability.LAUNCH, Capability.SERVE}),
    Role.REVIEWER: frozenset({Capability.READ, Capability.REVIEW}),
    Role.APPROVER: frozenset({Capability.READ, Capability.APPROVE}),
    Role.ADMIN: frozenset(
        {
            Capability.READ,
            Capability.LAUNCH,
            Capability.REVIEW,
            Capability.APPROVE,
            Capability.ADMIN,
            Capability.SERVE,
        }
    ),
}


class User(AbstractUser):
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    gpu_quota = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Most GPUs this user's runs may hold at once; empty: CRUCIBLE_GPU_QUOTA (0 there: no limit)",
    )

    @property
    def capabilities(self) -> frozenset[str]:
        if not self.is_active:
            return frozenset()
        if self.is_superuser:
            return ROLE_CAPABILITIES[Role.ADMIN]
        return ROLE_CAPABILITIES.get(self.role, frozenset())

    def can(self, capability: str) -> bool:
        return capability in self.capabilities


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_secret(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(32)}"


class ApiToken(models.Model):
    """A bearer token for CI and scripts. Only its hash is stored; the secret is shown once."""

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12, db_index=True)
    key_hash = models.CharField(max_length=64, unique=True)
    scopes = models.JSONField(default=list, help_text="Subset of read, launch, review, approve, admin, serve")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "name"], name="uniq_token_name_per_user")]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"
