"""Approvals and deployments: approving or rejecting a decision, making a checkpoint current, rolling back."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from apps.accounts.models import Capability, User
from apps.accounts.permissions import require_capability
from apps.gates.models import Approval, Deployment, Gate, GateDecision, Verdict
from apps.gates.selectors import decision_payload, deployment_payload
from apps.webhooks.services import webhook_emit


def gate_decision_approve(*, decision: GateDecision, user: User, approve: bool, note: str = "") -> GateDecision:
    """Record a human's approval or rejection, once. An approval of a decision whose rules passed makes its
    checkpoint the gate's deployment."""
    require_capability(user, Capability.APPROVE, "approving or rejecting a gate decision")
    with transaction.atomic():
        locked = (
            GateDecision.objects.select_for_update(of=("self",))
            .select_related("gate", "checkpoint")
            .get(pk=decision.pk)
        )
        if locked.approval:
            by = locked.approved_by.username if locked.approved_by else "someone"
            raise ValidationError(
                {"approval": [f"decision {locked.pk} was already {locked.approval} by {by} at {locked.approved_at}"]}
            )
        if locked.verdict == Verdict.FAIL:
            raise ValidationError(
                {"approval": [f"decision {locked.pk} failed its rules; there is nothing to approve or reject"]}
            )
        if locked.verdict != Verdict.PENDING:
            raise ValidationError(
                {"approval": [f"decision {locked.pk} passed without needing approval; its gate has no approval rule"]}
            )
        locked.approval = Approval.APPROVED if approve else Approval.REJECTED
        locked.approved_by = user
        locked.approved_at = timezone.now()
        locked.approval_note = note
        locked.save(update_fields=["approval", "approved_by", "approved_at", "approval_note"])
        event = "gate.decision.approved" if approve else "gate.decision.rejected"
        webhook_emit(event=event, payload=decision_payload(locked))
        if locked.final_verdict == Verdict.PASS:
            deploy(locked, user=user, note=note or "approved")
    return locked


def deploy(decision: GateDecision, *, user: User, note: str) -> Deployment:
    """Make the decision's checkpoint current, only over the deployment its rules compared it with: a decision
    taken against an older deployment must be re-evaluated, not shipped unchecked against what is live now."""
    with transaction.atomic():
        Gate.objects.select_for_update().get(pk=decision.gate_id)  # one deployment change per gate at a time
        current = Deployment.objects.filter(gate_id=decision.gate_id, is_current=True).first()
        if current is not None and current.checkpoint_id == decision.checkpoint_id:
            return current  # already deployed: a retried check or approval changes nothing
        compared_with = decision.gate_check.baseline_deployment_id if decision.gate_check else None
        if (current.pk if current else None) != compared_with:
            raise ValidationError(
                {
                    "decision": [
                        f"the gate's deployment changed since decision {decision.pk} was taken (it compared against "
                        f"deployment {compared_with}, the current one is {current.pk if current else 'none'}); "
                        "evaluate the checkpoint again"
                    ]
                }
            )
        return _make_current(
            gate_id=decision.gate_id,
            checkpoint_id=decision.checkpoint_id,
            decision=decision,
            note=note,
            user=user,
            event="deployment.created",
        )


def _make_current(
    *,
    gate_id: int,
    checkpoint_id: int,
    decision: GateDecision | None,
    note: str,
    user: User,
    event: str,
    rolled_back_from: Deployment | None = None,
) -> Deployment:
    """End the gate's current deployment and record the new one; the caller holds the gate's row lock."""
    Deployment.objects.filter(gate_id=gate_id, is_current=True).update(is_current=False, ended_at=timezone.now())
    deployment = Deployment.objects.create(
        gate_id=gate_id,
        checkpoint_id=checkpoint_id,
        decision=decision,
        rolled_back_from=rolled_back_from,
        note=note,
        created_by=user,
    )
    webhook_emit(event=event, payload=deployment_payload(deployment))
    return deployment


def deployment_rollback(*, gate: Gate, user: User, note: str = "") -> Deployment:
    """Make the deployment before the current one current again (a new row linked to the one it replaces)."""
    require_capability(user, Capability.APPROVE, "rolling a deployment back")
    with transaction.atomic():
        Gate.objects.select_for_update().get(pk=gate.pk)
        current = Deployment.objects.filter(gate=gate, is_current=True).first()
        if current is None:
            raise ValidationError({"gate": [f"gate {gate.name!r} has no current deployment to roll back"]})
        # The last deployment of another checkpoint that was not itself rolled back: rolling back twice does not
        # bring back the checkpoint the first rollback removed.
        rolled_back = Deployment.objects.filter(gate=gate, rolled_back_from__isnull=False).values("rolled_back_from")
        previous = (
            Deployment.objects.filter(gate=gate, created_at__lt=current.created_at)
            .exclude(checkpoint_id=current.checkpoint_id)
            .exclude(pk__in=rolled_back)
            .order_by("-created_at")
            .first()
        )
        if previous is None:
            raise ValidationError(
                {
                    "gate": [
                        f"deployment {current.pk} is the first of gate {gate.name!r}; there is nothing to roll back to"
                    ]
                }
            )
        restored = _make_current(
            gate_id=gate.pk,
            checkpoint_id=previous.checkpoint_id,
            decision=previous.decision,
            note=note or f"rollback of deployment {current.pk}",
            user=user,
            event="deployment.rolled_back",
            rolled_back_from=current,
        )
    return restored
