"""Gate pages (under /gates/, URL namespace "gates"): gates, their history, decisions with their evidence,
approval, deployments and rollback."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path
from django.views.decorators.http import require_POST
from rest_framework.exceptions import ValidationError

from apps.accounts.decorators import needs
from apps.accounts.models import Capability
from apps.accounts.permissions import request_user
from apps.benchmarks.models import BenchmarkVersion, Eval
from apps.common.errors import validation_messages
from apps.gates import selectors, services
from apps.gates.models import Deployment, Gate, GateCheck, GateDecision
from apps.runs.models import Checkpoint
from workers.evals.gates import rule_text

app_name = "gates"

EXAMPLE_RULES = [
    {"type": "threshold", "benchmark": "humaneval", "metric": "pass@1", "op": ">=", "value": 0.0},
    {"type": "no_regression", "benchmark": "humaneval", "alpha": 0.05, "slice_by": ["difficulty"]},
    {"type": "flag_rate", "detector": "*", "max_rate": 0.05},
    {"type": "approval"},
]


@needs(Capability.READ)
def gate_list(request: HttpRequest) -> HttpResponse:
    errors: list[str] = []
    rules_text = request.POST.get("rules") or json.dumps(EXAMPLE_RULES, indent=2)
    if request.method == "POST":
        if not request_user(request).can(Capability.ADMIN):
            raise PermissionDenied("creating a gate needs the admin role")
        try:
            rules = json.loads(rules_text)
        except ValueError as exc:
            errors.append(f"rules: not valid JSON ({exc})")
        else:
            ids = [int(v) for v in request.POST.getlist("benchmark_versions") if v.isdigit()]
            try:
                gate = services.gate_create(
                    name=request.POST.get("name", "").strip(),
                    description=request.POST.get("description", ""),
                    rules=rules,
                    benchmark_versions=list(BenchmarkVersion.objects.select_related("benchmark").filter(pk__in=ids)),
                    requires_approval=request.POST.get("requires_approval") == "on",
                    owner=request_user(request),
                )
            except ValidationError as exc:
                errors = validation_messages(exc)
            else:
                return redirect("gates:gate", gate_id=gate.pk)
    gates = Gate.objects.select_related("owner").prefetch_related("benchmark_versions__benchmark").order_by("name")
    current = {
        d.gate_id: d for d in Deployment.objects.filter(is_current=True).select_related("checkpoint", "created_by")
    }
    rows = [(gate, current.get(gate.pk)) for gate in gates]
    versions = BenchmarkVersion.objects.select_related("benchmark").order_by("benchmark__name", "-number")
    return render(
        request,
        "gates/index.html",
        {"rows": rows, "errors": errors, "rules_text": rules_text, "versions": versions},
    )


@needs(Capability.READ)
def gate_detail(request: HttpRequest, gate_id: int) -> HttpResponse:
    gate = get_object_or_404(Gate.objects.select_related("owner"), pk=gate_id)
    checks = (
        GateCheck.objects.filter(gate=gate)
        .select_related("checkpoint", "created_by")
        .prefetch_related("candidate_evals__run")
        .order_by("-created_at")[:50]
    )
    decided = {d.gate_check_id: d for d in GateDecision.objects.filter(gate=gate).select_related("approved_by")}
    return render(
        request,
        "gates/detail.html",
        {
            "gate": gate,
            "rules_json": json.dumps(gate.rules, indent=2),
            "rule_texts": [rule_text(rule) for rule in gate.rules],
            "versions": gate.benchmark_versions.select_related("benchmark"),
            "current": selectors.current_deployment(gate),
            "checks": [(check, decided.get(check.pk)) for check in checks],
            "deployments": Deployment.objects.filter(gate=gate).select_related("checkpoint", "created_by")[:50],
            "checkpoints": Checkpoint.objects.select_related("run").order_by("-created_at")[:50],
        },
    )


@needs(Capability.LAUNCH)
@require_POST
def gate_evaluate_view(request: HttpRequest, gate_id: int) -> HttpResponse:
    gate = get_object_or_404(Gate, pk=gate_id)
    raw = request.POST.get("checkpoint", "")
    checkpoint = Checkpoint.objects.select_related("run").filter(pk=int(raw)).first() if raw.isdigit() else None
    if checkpoint is None:
        messages.error(request, "checkpoint: pick a registered checkpoint")
        return redirect("gates:gate", gate_id=gate.pk)
    try:
        check = services.gate_evaluate(gate=gate, checkpoint=checkpoint, user=request_user(request))
    except ValidationError as exc:
        messages.error(request, "; ".join(validation_messages(exc)))
    else:
        messages.info(request, f"Gate check {check.pk}: {check.get_status_display().lower()}.")
    return redirect("gates:gate", gate_id=gate.pk)


@needs(Capability.APPROVE)
@require_POST
def gate_rollback_view(request: HttpRequest, gate_id: int) -> HttpResponse:
    gate = get_object_or_404(Gate, pk=gate_id)
    try:
        restored = services.deployment_rollback(
            gate=gate, user=request_user(request), note=request.POST.get("note", "")
        )
    except ValidationError as exc:
        messages.error(request, "; ".join(validation_messages(exc)))
    else:
        messages.info(request, f"Rolled back: checkpoint {restored.checkpoint} is the deployment again.")
    return redirect("gates:gate", gate_id=gate.pk)


@needs(Capability.READ)
def decision_detail(request: HttpRequest, decision_id: int) -> HttpResponse:
    decision = get_object_or_404(
        GateDecision.objects.select_related("gate", "checkpoint__run", "approved_by", "gate_check"), pk=decision_id
    )
    evidence = decision.evidence
    eval_ids = list((evidence.get("candidate_evals") or {}).values()) + list(
        (evidence.get("baseline_evals") or {}).values()
    )
    evals = {e.pk: e for e in Eval.objects.filter(pk__in=eval_ids).select_related("benchmark_version__benchmark")}
    return render(
        request,
        "gates/decision.html",
        {
            "decision": decision,
            "outcomes": _outcomes_with_approval(decision, evidence.get("outcomes", [])),
            "candidate_evals": [(name, evals.get(pk)) for name, pk in (evidence.get("candidate_evals") or {}).items()],
            "baseline_evals": [(name, evals.get(pk)) for name, pk in (evidence.get("baseline_evals") or {}).items()],
            "evidence_json": json.dumps(evidence, indent=2),
            "can_approve": request_user(request).can(Capability.APPROVE)
            and not decision.approval
            and decision.verdict != "fail",
        },
    )


def _outcomes_with_approval(decision: GateDecision, outcomes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stored rule outcomes as the page shows them: each rule in words, and the approval rule's row with the
    human's decision once there is one (the evidence was written before it, when that row was still pending)."""
    shown = []
    for outcome in outcomes:
        row = {
            **outcome,
            "text": rule_text(outcome.get("rule")),
        }
        rule = outcome.get("rule")
        if isinstance(rule, dict) and rule.get("type") == "approval" and decision.approval:
            approved = decision.approval == "approved"
            row["verdict"] = "pass" if approved else "fail"
            when = f" at {decision.approved_at:%Y-%m-%d %H:%M:%S}" if decision.approved_at else ""
            row["message"] = f"{'approved' if approved else 'rejected'} by {decision.approved_by}{when}"
        shown.append(row)
    return shown


@needs(Capability.APPROVE)
@require_POST
def decision_judge(request: HttpRequest, decision_id: int) -> HttpResponse:
    decision = get_object_or_404(GateDecision, pk=decision_id)
    action = request.POST.get("action")
    if action not in ("approve", "reject"):
        messages.error(request, "action: choose approve or reject")
        return redirect("gates:decision", decision_id=decision.pk)
    approve = action == "approve"
    try:
        services.gate_decision_approve(
            decision=decision,
            user=request_user(request),
            approve=approve,
            note=request.POST.get("note", ""),
        )
    except ValidationError as exc:
        messages.error(request, "; ".join(validation_messages(exc)))
    else:
        messages.info(request, "Approved: the checkpoint is now the deployment." if approve else "Rejected.")
    return redirect("gates:decision", decision_id=decision.pk)


@needs(Capability.READ)
def deployment_list(request: HttpRequest) -> HttpResponse:
    """Every deployment of every gate, newest first: what serves now, what it replaced, and rollbacks."""
    deployments = Deployment.objects.select_related(
        "gate", "checkpoint", "created_by", "decision", "rolled_back_from"
    ).order_by("-created_at")[:200]
    return render(request, "gates/deployments.html", {"deployments": deployments})


urlpatterns = [
    path("gates/", gate_list, name="list"),
    path("gates/deployments/", deployment_list, name="deployments"),
    path("gates/<int:gate_id>/", gate_detail, name="gate"),
    path("gates/<int:gate_id>/evaluate/", gate_evaluate_view, name="evaluate"),
    path("gates/<int:gate_id>/rollback/", gate_rollback_view, name="rollback"),
    path("gates/decisions/<int:decision_id>/", decision_detail, name="decision"),
    path("gates/decisions/<int:decision_id>/judge/", decision_judge, name="judge"),
]
