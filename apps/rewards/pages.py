"""Reward config pages (namespace "rewards"): the list with a form, a config's versions with an editor that
saves the next version, and the diff of two versions."""

from __future__ import annotations

import json

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path
from django.views.decorators.http import require_http_methods
from rest_framework.exceptions import ValidationError

from apps.accounts.decorators import needs
from apps.accounts.models import Capability
from apps.accounts.permissions import request_user
from apps.common.errors import validation_messages
from apps.rewards.models import RewardConfig, RewardConfigVersion
from apps.rewards.services import reward_config_create, reward_spec_diff, reward_version_create
from workers.rewards.schema import TERM_TYPES, context1_spec


@needs(Capability.READ)
@require_http_methods(["GET", "POST"])
def rewards_index(request: HttpRequest) -> HttpResponse:
    errors: list[str] = []
    spec_text = request.POST.get("spec") or json.dumps(context1_spec().model_dump(mode="json"), indent=2)
    if request.method == "POST":
        if not request_user(request).can(Capability.LAUNCH):
            raise PermissionDenied("your role cannot create reward configs")
        try:
            spec = json.loads(spec_text)
        except ValueError as exc:
            errors.append(f"spec: not valid JSON ({exc})")
        else:
            try:
                config = reward_config_create(
                    name=request.POST.get("name", "").strip(),
                    spec=spec,
                    description=request.POST.get("description", ""),
                    owner=request_user(request),
                )
            except ValidationError as exc:
                errors = validation_messages(exc)
            else:
                return redirect("rewards:detail", config_id=config.pk)
    configs = RewardConfig.objects.select_related("owner").prefetch_related("versions").order_by("name")
    return render(
        request,
        "rewards/index.html",
        {"configs": configs, "errors": errors, "spec_text": spec_text, "term_types": TERM_TYPES},
    )


@needs(Capability.READ)
@require_http_methods(["GET", "POST"])
def reward_detail(request: HttpRequest, config_id: int) -> HttpResponse:
    config = get_object_or_404(RewardConfig, pk=config_id)
    versions = list(config.versions.select_related("created_by").prefetch_related("runs").order_by("-number"))
    errors: list[str] = []
    spec_text = request.POST.get("spec") or (json.dumps(versions[0].spec, indent=2) if versions else "{}")
    if request.method == "POST":
        if not request_user(request).can(Capability.LAUNCH):
            raise PermissionDenied("your role cannot edit reward configs")
        try:
            version = reward_version_create(
                config=config,
                spec=json.loads(spec_text),
                created_by=request_user(request),
                notes=request.POST.get("notes", ""),
            )
        except ValueError as exc:
            errors.append(f"spec: not valid JSON ({exc})")
        except ValidationError as exc:
            errors = validation_messages(exc)
        else:
            messages.info(request, f"Saved as version {version.number}.")
            return redirect("rewards:detail", config_id=config.pk)
    return render(
        request,
        "rewards/detail.html",
        {"config": config, "versions": versions, "errors": errors, "spec_text": spec_text},
    )


@needs(Capability.READ)
def reward_diff(request: HttpRequest, old_id: int, new_id: int) -> HttpResponse:
    old = get_object_or_404(RewardConfigVersion.objects.select_related("config"), pk=old_id)
    new = get_object_or_404(RewardConfigVersion.objects.select_related("config"), pk=new_id)
    return render(
        request, "rewards/diff.html", {"old": old, "new": new, "changes": reward_spec_diff(old.spec, new.spec)}
    )


app_name = "rewards"
urlpatterns = [
    path("rewards/", rewards_index, name="list"),
    path("rewards/<int:config_id>/", reward_detail, name="detail"),
    path("rewards/diff/<int:old_id>/<int:new_id>/", reward_diff, name="diff"),
]
