from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Max
from rest_framework.exceptions import ValidationError

from apps.accounts.models import User
from apps.common.validators import SLUG
from apps.rewards.models import RewardConfig, RewardConfigVersion
from workers.rewards.schema import RewardSpec, RewardSpecError, spec_hash, validate_reward_spec


def reward_spec_validate(spec: Any) -> RewardSpec:
    """Validate with the workers' schema; a bad spec becomes a 400 whose keys name the term and field."""
    try:
        return validate_reward_spec(spec)
    except RewardSpecError as exc:
        raise ValidationError({f"spec.{e['field']}": [e["message"]] for e in exc.errors})


@transaction.atomic
def reward_config_create(*, name: str, spec: Any, owner: User, description: str = "", notes: str = "") -> RewardConfig:
    if not SLUG.fullmatch(name or ""):
        raise ValidationError({"name": ["use 1-100 letters, digits, '-' or '_' (e.g. context1-beta2)"]})
    validated = reward_spec_validate(spec)
    if RewardConfig.objects.filter(name=name).exists():
        raise ValidationError({"name": [f"a reward config named {name!r} exists; add a version to it instead"]})
    config = RewardConfig.objects.create(name=name, description=description, owner=owner)
    _new_version(config=config, spec=validated, created_by=owner, notes=notes, parent=None)
    return config


def _new_version(
    *, config: RewardConfig, spec: RewardSpec, created_by: User, notes: str, parent: RewardConfigVersion | None
) -> RewardConfigVersion:
    number = (RewardConfigVersion.objects.filter(config=config).aggregate(n=Max("number"))["n"] or 0) + 1
    return RewardConfigVersion.objects.create(
        config=config,
        number=number,
        spec=spec.model_dump(mode="json"),
        content_hash=spec_hash(spec),
        notes=notes,
        parent=parent,
        created_by=created_by,
    )


@transaction.atomic
def reward_version_create(*, config: RewardConfig, spec: Any, created_by: User, notes: str = "") -> RewardConfigVersion:
    """Editing a reward config always makes a new version; versions never change in place."""
    validated = reward_spec_validate(spec)
    RewardConfig.objects.select_for_update().get(pk=config.pk)
    latest = RewardConfigVersion.objects.filter(config=config).order_by("-number").first()
    if latest is not None and latest.content_hash == spec_hash(validated):
        raise ValidationError({"spec": [f"this spec is identical to {latest}; change a term before saving"]})
    return _new_version(config=config, spec=validated, created_by=created_by, notes=notes, parent=latest)


def reward_spec_diff(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    """Field-level diff of two specs, terms matched by name: [{path, change: added|removed|changed, old, new}]."""
    rows: list[dict[str, Any]] = []

    def walk(a: Any, b: Any, path: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                sub = f"{path}.{key}" if path else key
                if key not in a:
                    rows.append({"path": sub, "change": "added", "old": None, "new": b[key]})
                elif key not in b:
                    rows.append({"path": sub, "change": "removed", "old": a[key], "new": None})
                else:
                    walk(a[key], b[key], sub)
        elif a != b:
            rows.append({"path": path, "change": "changed", "old": a, "new": b})

    def by_name(spec: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in spec.items() if k != "terms"}
        out["terms"] = {t.get("name") or t.get("type"): t for t in spec.get("terms", [])}
        return out

    walk(by_name(old), by_name(new), "")
    return rows
