"""Deciding a gate check once its evals have ended: every rule's inputs, statistic and verdict in an immutable
decision; a decision that passes outright deploys at once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from apps.benchmarks.models import Eval
from apps.benchmarks.selectors import contamination_check, eval_metrics_for, eval_task_scores
from apps.gates.models import CheckStatus, GateCheck, GateDecision, Verdict
from apps.gates.selectors import decision_payload, flag_rates
from apps.gates.services.deployments import deploy
from apps.runs.models import RunStatus, TrajectorySummary
from apps.webhooks.services import webhook_emit
from workers.detectors.registry import detectors
from workers.evals.gate_evidence import BenchmarkEvidence, GateInputs
from workers.evals.gates import (
    evaluate_rules,
    parse_rules,
)

FAILED_RUN = (RunStatus.FAILED, RunStatus.STOPPED)


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
                deploy(decision, user=check.created_by, note="passed every rule; no approval required")
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
    verdict: str = result.verdict
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
    webhook_emit(event="gate.decision.created", payload=decision_payload(decision))
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
