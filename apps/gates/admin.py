from django.contrib import admin

from apps.benchmarks.admin import ReadOnlyAdmin
from apps.gates.models import Deployment, Gate, GateCheck, GateDecision


@admin.register(Gate)
class GateAdmin(ReadOnlyAdmin):
    list_display = ("name", "requires_approval", "eval_k", "owner", "created_at")


@admin.register(GateCheck)
class GateCheckAdmin(ReadOnlyAdmin):
    list_display = ("pk", "gate", "checkpoint", "status", "created_by", "created_at", "decided_at")
    list_filter = ("status",)


@admin.register(GateDecision)
class GateDecisionAdmin(ReadOnlyAdmin):
    list_display = ("pk", "gate", "checkpoint", "verdict", "approval", "approved_by", "created_at")
    list_filter = ("verdict", "approval")


@admin.register(Deployment)
class DeploymentAdmin(ReadOnlyAdmin):
    list_display = ("pk", "gate", "checkpoint", "is_current", "rolled_back_from", "created_by", "created_at")
    list_filter = ("is_current",)
