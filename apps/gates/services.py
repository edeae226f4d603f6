"""Deployment gates: gate a checkpoint on pinned benchmark versions, decide, approve, deploy, roll back.

The flow (Composer 2's "deploy only after CursorBench", as an auditable object):
1. `gate_evaluate` starts (or reuses) one eval per pinned benchmark version for the candidate checkpoint, and for
   the current deployment's checkpoint when there is one (the baseline of the no-regression rules), and records
   a GateCheck: the handle CI polls.
2. When every eval of a check has finished (`gate_check_advance`, called when an eval run ends and by beat),
   `workers.evals.gates.evaluate_rules` decides, and an immutable GateDecision stores every rule's inputs,
   statistic and verdict. A failed eval makes the check an `error` (an infrastructure problem, not a verdict).
3. A decision that passes outright becomes the deployment at once; one that waits for approval does when a user
   with the approve permission approves it (`gate_decision_approve`); a rejection is recorded the same way.
4. `deployment_rollback` makes the previous deployment current again, as a new, linked Deployment row.
Every decision, approval and deployment is announced by a signed webhook (`apps.webhooks`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from rest_framework.exceptions import PermissionDenied, ValidationError

from apps.accounts.models import Capability, User
from apps.benchmarks.models import BenchmarkVersion, Eval
from apps.benchmarks.selectors import contamination_check, eval_metrics_for, eval_task_scores
from apps.benchmarks.services import eval_launch
from apps.common.validators import SLUG
from apps.gates.models import Approval, CheckStatus, Deployment, Gate, GateCheck, GateDecision, Verdict
from apps.review.models import Flag
from apps.runs.models import Checkpoint, RunStatus, TrajectorySummary
from apps.webhooks.services import webhook_emit
from workers.detectors.registry import detectors
from workers.evals.gates import (
    ApprovalRule,
    BenchmarkEvidence,
    GateInputs,
    GateRulesError,
    evaluate_rules,
    parse_rules,
)

FAILED_RUN = (RunStatus.FAILED, RunStatus.STOPPED)


def _emit(event: str, payload: dict[str, Any]) -> None:
    webhook_emit(event=event, payload=payload)


def gate_rules_check(raw: object, *, requires_approval: bool = False) -> list[dict[str, Any]]:
    """Validated rules as JSON (ValidationError naming `rules[i].field` and the fix)."""
    try:
        rules = parse_rules(raw)
    except GateRulesError as exc:
        raise ValidationError({"rules": [err["message"] for err in exc.errors]})
    if requires_approval and not any(isinstance(rule, ApprovalRule) for rule in rules):
        rules.append(ApprovalRule())
    return [rule.model_dump(mode="json") for rule in rules]


def _rule_benchmarks(rules: Sequence[dict[str, Any]]) -> set[str]:
    return {rule["benchmark"] for rule in rules if "benchmark" in rule}


def gate_create(
    *,
    name: str,
    rules: object,
    benchmark_versions: Sequence[BenchmarkVersion],
    owner: User,
    description: str = "",
    requires_approval: bool = True,
    eval_k: int = 1,
    max_new_tokens: int = 384,
) -> Gate:
    checked = gate_rules_check(rules, requires_approval=requires_approval)
    problems: dict[str, list[str]] = {}
    if not SLUG.fullmatch(name or ""):
        problems["name"] = ["use 1-100 letters, digits, '-' or '_'"]
    if not 1 <= eval_k <= 100:
        problems["eval_k"] = [f"attempts per task must be between 1 and 100 (got {eval_k})"]
    if not 1 <= max_new_tokens <= 32_768:
        problems["max_new_tokens"] = [f"must be between 1 and 32768 (got {max_new_tokens})"]
    if problems:
        raise ValidationError(problems)
    if not benchmark_versions:
        raise ValidationError({"benchmark_versions": ["pin at least one benchmark version for the gate's evals"]})
    _check_versions_cover_rules(checked, benchmark_versions)
    if Gate.objects.filter(name=name).exists():
        raise ValidationError({"name": [f"a gate named {name!r} exists; pick another name"]})
    with transaction.atomic():
        gate = Gate.objects.create(
            name=name,
            description=description,
            rules=checked,
            requires_approval=requires_approval,
            eval_k=eval_k,
            max_new_tokens=max_new_tokens,
            owner=owner,
        )
        gate.benchmark_versions.set(benchmark_versions)
    return gate


def _check_versions_cover_rules(rules: Sequence[dict[str, Any]], versions: Sequence[BenchmarkVersion]) -> None:
    names = [v.benchmark.name for v in versions]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ValidationError({"benchmark_versions": [f"pin one version per benchmark; {duplicated[0]!r} has more"]})
    missing = sorted(_rule_benchmarks(rules) - set(names))
    if missing:
        raise ValidationError(
            {
                "benchmark_versions": [
                    f"the rules name benchmark {missing[0]!r} but no version of it is pinned; pin one "
                    f"(pinned: {', '.join(sorted(names)) or 'none'})"
                ]
            }
        )


def current_deployment(gate: Gate) -> Deployment | None:
    return Deployment.objects.select_related("checkpoint__run").filter(gate=gate, is_current=True).first()


def gate_evaluate(
    *,
    gate: Gate,
    checkpoint: Checkpoint,
    user: User,
    benchmark_versions: Sequence[BenchmarkVersion] | None = None,
) -> GateCheck:
    """Gate `checkpoint`: start or reuse the evals, and return the check (decided at once when every eval it
    needs has already finished). `benchmark_versions` pins other versions of the gate's benchmarks."""
    rules = gate.rules
    if not rules:
        raise ValidationError({"rules": [f"gate {gate.name!r} has no rules; add at least one before evaluating"]})
    pinned = list(gate.benchmark_versions.select_related("benchmark"))
    if benchmark_versions:
        by_name = {v.benchmark.name: v for v in pinned}
        for version in benchmark_versions:
            if version.benchmark.name not in by_name:
                raise ValidationError(
                    {
                        "benchmark_versions": [
                            f"{version} is not a benchmark of gate {gate.name!r} "
                            f"(its benchmarks: {', '.join(sorted(by_name))})"
                        ]
                    }
                )
            by_name[version.benchmark.name] = version
        pinned = list(by_name.values())
    _check_versions_cover_rules(rules, pinned)
    baseline = current_deployment(gate)
    with transaction.atomic():
        Gate.objects.select_for_update().get(pk=gate.pk)  # two CI retries of one request make one check
        waiting = (
            GateCheck.objects.filter(
                gate=gate, checkpoint=checkpoint, status=CheckStatus.WAITING, baseline_deployment=baseline
            )
            .prefetch_related("benchmark_versions")
            .order_by("-created_at")
        )
        for existing in waiting:
            if {v.pk for v in existing.benchmark_versions.all()} == {v.pk for v in pinned}:
                return existing
        candidate = [_gate_eval(gate, v, checkpoint, user) for v in pinned]
        baseline_evals = []
        if baseline is not None and baseline.checkpoint_id != checkpoint.pk:
            try:
                baseline_evals = [_gate_eval(gate, v, baseline.checkpoint, user) for v in pinned]
            except ValidationError as exc:
                raise ValidationError(
                    {
                        "baseline_deployment": [
                            f"the current deployment {baseline.pk} (checkpoint {baseline.checkpoint}) cannot be "
                            f"evaluated as the baseline: {exc.detail}; roll it back or fix its checkpoint"
                        ]
                    }
                )
        check = GateCheck.objects.create(
            gate=gate, checkpoint=checkpoint, baseline_deployment=baseline, created_by=user
        )
        check.benchmark_versions.set(pinned)
        check.candidate_evals.set(candidate)
        check.baseline_evals.set(baseline_evals)
    return gate_check_advance(check_id=check.pk)


def _gate_eval(gate: Gate, version: BenchmarkVersion, checkpoint: Checkpoint, user: User) -> Eval:
    evaluation, _ = eval_launch(
        benchmark_version=version,
        checkpoint=checkpoint,
        created_by=user,
        k=gate.eval_k,
        max_new_tokens=gate.max_new_tokens,
    )
    return evaluation


def gate_checks_for_eval(*, eval_id: int) -> None:
    """Advance every waiting check that uses this eval (called when an eval run ends)."""
    waiting = GateCheck.objects.filter(status=CheckStatus.WAITING).filter(
        Q(candidate_evals=eval_id) | Q(baseline_evals=eval_id)
    )
    for check_id in waiting.values_list("pk", flat=True).distinct():
        gate_check_advance(check_id=check_id)


def gate_checks_after_eval(*, run_id: int) -> None:
    """EVAL's succeeded subscriber (apps.runs.kinds): advance the checks waiting on the eval of this run."""
    eval_id = Eval.objects.filter(run_id=run_id).values_list("pk", flat=True).first()
    if eval_id is not None:
        gate_checks_for_eval(eval_id=eval_id)


def gate_checks_advance_all() -> int:
    """Beat: advance every waiting check (a backstop for a missed eval-finished notification)."""
    ids = list(GateCheck.objects.filter(status=CheckStatus.WAITING).values_list("pk", flat=True))
    for check_id in ids:
        gate_check_advance(check_id=check_id)
    return len(ids)


def gate_check_advance(*, check_id: int) -> GateCheck:
    """Decide a waiting check whose evals have all finished; record an error if one failed. Idempotent: the row
    lock and the status check make a second call (or a concurrent one) a no-op."""
    with transaction.atomic():
        check = (
            GateCheck.objects.select_for_update(of=("self",)).select_related("gate", "checkpoint__run").get(pk=check_id)
        )
        if check.status != CheckStatus.WAITING:
            return check
        evals = list(check.candidate_evals.select_related("run", "benchmark_version__benchmark"))
        base = list(check.baseline_evals.select_related("run", "benchmark_version__benchmark"))
        broken = [e for e in evals + base if e.run.status in FAILED_RUN]
        if broken:
            first = broken[0]
            check.status = CheckStatus.ERROR
            check.error = (
                f"eval {first.pk} ({first.model_label} on {first.benchmark_version}) {first.run.status}: "
                f"{first.run.failure_reason or 'no reason recorded'}"
            )
            check.decided_at = timezone.now()
            check.save(update_fields=["status", "error", "decided_at"])
            return check
        if any(e.run.status != RunStatus.SUCCEEDED for e in evals + base):
            return check
        for evaluation in evals + base:
            if not evaluation.metrics:  # the success hook's task was lost: compute what it would have stored
                evaluation.metrics = eval_metrics_for(evaluation)
                evaluation.save(update_fields=["metrics"])
        decision = _decide(check, evals, base)
        check.status = CheckStatus.DECIDED
        check.decided_at = timezone.now()
        check.save(update_fields=["status", "decided_at"])
        if decision.final_verdict == Verdict.PASS:
            try:
                _deploy(decision, user=check.created_by, note="passed every rule; no approval required")
            except ValidationError as exc:
                check.error = f"passed, but not deployed: {exc.detail}"
                check.save(update_fields=["error"])
    return check


def _evidence(evaluation: Eval) -> BenchmarkEvidence:
    version = evaluation.benchmark_version
    return BenchmarkEvidence(
        benchmark=version.benchmark.name,
        version=version.number,
        content_hash=version.content_hash,
        eval_id=evaluation.pk,
        metrics=dict(evaluation.metrics),
        tasks=eval_task_scores(evaluation),
    )


def flag_rates(evals: Sequence[Eval]) -> dict[str, float]:
    """Detector flag rates over the evals' trajectories: flagged trajectories / trajectories, per detector and
    for any detector ("*"). Detectors that raised nothing have no entry of their own; "*" is always there."""
    run_ids = [e.run_id for e in evals]
    total = TrajectorySummary.objects.filter(run_id__in=run_ids).count()
    rates: dict[str, float] = {}
    flags = Flag.objects.filter(run_id__in=run_ids)
    # Trajectory ids repeat across eval runs (eval-<shard>-<task>-<i>): count distinct (run, trajectory) pairs.
    for detector in flags.values_list("detector", flat=True).distinct():
        flagged = flags.filter(detector=detector).values("run_id", "trajectory_ref").distinct().count()
        rates[detector] = flagged / total if total else 0.0
    any_flagged = flags.values("run_id", "trajectory_ref").distinct().count()
    rates["*"] = any_flagged / total if total else 0.0
    return rates


def _decide(check: GateCheck, evals: list[Eval], base: list[Eval]) -> GateDecision:
    rules = parse_rules(check.gate.rules)
    rates = flag_rates(evals)
    known = detectors()
    for rule in rules:
        # A ceiling on a detector that ran on these trajectories and raised nothing is a rate of 0; a name no
        # detector answers to stays missing, so its rule fails instead of passing on a typo.
        detector = getattr(rule, "detector", None)
        if detector == "*" or detector in known:
            rates.setdefault(detector, 0.0)
    inputs = GateInputs(
        candidate={e.benchmark_version.benchmark.name: _evidence(e) for e in evals},
        baseline={e.benchmark_version.benchmark.name: _evidence(e) for e in base} if base else None,
        flag_rates=rates,
    )
    result = evaluate_rules(rules, inputs)
    evidence: dict[str, Any] = {
        **result.to_dict(),
        "checkpoint": {"id": check.checkpoint_id, "run": check.checkpoint.run_id, "step": check.checkpoint.step},
        "checkpoint_uri": check.checkpoint.uri,
        "baseline_deployment": check.baseline_deployment_id,
        "candidate_evals": {e.benchmark_version.benchmark.name: e.pk for e in evals},
        "baseline_evals": {e.benchmark_version.benchmark.name: e.pk for e in base},
        "rules": check.gate.rules,
        "evaluated_at": timezone.now().isoformat(),
    }
    evidence["flag_rates"] = {"rates": rates, "trajectories": _trajectory_count(evals)}
    verdict = result.verdict
    tainted = _contamination(check, evals)
    if tainted:
        # The contamination guard: a run launched on data overlapping a gating benchmark never passes that gate.
        names = ", ".join(c["benchmark"] for c in tainted)
        evidence["outcomes"].append(
            {
                "index": len(evidence["outcomes"]),
                "rule": {"type": "contamination_guard"},
                "verdict": "fail",
                "inputs": {"run": check.checkpoint.run_id, "contamination": tainted},
                "statistic": {},
                "message": f"run {check.checkpoint.run_id} trained on data overlapping {names} (launched with "
                "allow_contamination): its scores on them mean nothing",
            }
        )
        evidence["verdict"] = verdict = Verdict.FAIL
    decision = GateDecision.objects.create(
        gate=check.gate,
        checkpoint=check.checkpoint,
        gate_check=check,
        verdict=verdict,
        evidence=evidence,
    )
    _emit("gate.decision.created", decision_payload(decision))
    return decision


def _trajectory_count(evals: Sequence[Eval]) -> int:
    return TrajectorySummary.objects.filter(run_id__in=[e.run_id for e in evals]).count()


def _contamination(check: GateCheck, evals: Sequence[Eval]) -> list[dict[str, Any]]:
    """Overlap between the checkpoint's training data and the versions this check evaluated on, checked now (the
    gate may pin versions that did not exist, or were not gated, when the run was launched), plus what the run
    was flagged with at launch."""
    pinned = [e.benchmark_version for e in evals]
    pinned_ids = {v.pk for v in pinned}
    run = check.checkpoint.run
    found = {
        c["benchmark_version"]: c for c in run.spec.get("contamination") or [] if c["benchmark_version"] in pinned_ids
    }
    if run.dataset_version is not None:
        for item in contamination_check(dataset_version=run.dataset_version, versions=pinned):
            found.setdefault(item["benchmark_version"], item)
    return list(found.values())


def decision_payload(decision: GateDecision) -> dict[str, Any]:
    return {
        "decision": decision.pk,
        "gate": decision.gate.name,
        "checkpoint": decision.checkpoint_id,
        "verdict": decision.verdict,
        "final_verdict": decision.final_verdict,
        "approval": decision.approval,
        "approved_by": decision.approved_by.username if decision.approved_by else None,
        "rules": [
            {"index": o["index"], "type": o["rule"]["type"], "verdict": o["verdict"], "message": o["message"]}
            for o in decision.evidence.get("outcomes", [])
        ],
    }


def _require(user: User, capability: str, what: str) -> None:
    if not user.can(capability):
        raise PermissionDenied(f"{what} needs the {capability} permission (role approver or admin)")


def gate_decision_approve(*, decision: GateDecision, user: User, approve: bool, note: str = "") -> GateDecision:
    """Record a human's approval or rejection, once. An approval of a decision whose rules passed makes its
    checkpoint the gate's deployment."""
    _require(user, Capability.APPROVE, "approving or rejecting a gate decision")
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
        _emit("gate.decision.approved" if approve else "gate.decision.rejected", decision_payload(locked))
        if locked.final_verdict == Verdict.PASS:
            _deploy(locked, user=user, note=note or "approved")
    return locked


def _deploy(decision: GateDecision, *, user: User, note: str) -> Deployment:
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
    _emit(event, deployment_payload(deployment))
    return deployment


def deployment_payload(deployment: Deployment) -> dict[str, Any]:
    return {
        "deployment": deployment.pk,
        "gate": deployment.gate.name,
        "checkpoint": deployment.checkpoint_id,
        "checkpoint_uri": deployment.checkpoint.uri,
        "decision": deployment.decision_id,
        "rolled_back_from": deployment.rolled_back_from_id,
        "created_by": deployment.created_by.username,
    }


def deployment_rollback(*, gate: Gate, user: User, note: str = "") -> Deployment:
    """Make the deployment before the current one current again (a new row linked to the one it replaces)."""
    _require(user, Capability.APPROVE, "rolling a deployment back")
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
