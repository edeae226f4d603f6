from django.contrib import admin

from apps.gates.models import Deployment, Gate, GateDecision


@admin.register(Gate)
class GateAdmin(admin.ModelAdmin):
    list_display = ("name", "requires_approval", "owner", "created_at")


@admin.register(GateDecision)
class GateDecisionAdmin(admin.ModelAdmin):
    list_display = ("gate", "checkpoint", "verdict", "approval", "approved_by", "created_at")
    list_filter = ("verdict", "approval")


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    list_display = ("gate", "checkpoint", "is_current", "created_by", "created_at")
