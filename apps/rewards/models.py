from __future__ import annotations

from django.conf import settings
from django.db import models


class RewardConfig(models.Model):
    name = models.SlugField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="reward_configs")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class RewardConfigVersion(models.Model):
    """A validated reward spec (workers.rewards.schema.RewardSpec). Immutable once any run used it."""

    config = models.ForeignKey(RewardConfig, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    spec = models.JSONField()
    content_hash = models.CharField(max_length=64, db_index=True)
    notes = models.TextField(blank=True)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["config", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["config", "number"], name="uniq_reward_version_number"),
        ]

    def __str__(self) -> str:
        return f"{self.config.name}@v{self.number}"
