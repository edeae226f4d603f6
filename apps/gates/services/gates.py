"""Gates: their rules (checked against the benchmark versions they pin) and the start of a check: one eval per pinned
version for the candidate checkpoint and for the current deployment's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import transaction
from rest_framework.exceptions import ValidationError

from apps.accounts.models import User
from apps.benchmarks.models import BenchmarkVersion, Eval
from apps.benchmarks.services import eval_launch
from apps.common.validators import SLUG
from apps.gates.models import CheckStatus, Gate, GateCheck
from apps.gates.selectors import current_deployment
from apps.gates.services.checks import gate_check_advance
from apps.runs.models import Checkpoint
from workers.coding.task import is_unverified
from workers.envs.registry import ENVIRONMENTS
from workers.evals.gates import (
    ApprovalRule,
    GateRulesError,
    parse_rules,
)


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
    _check_versions_verified(benchmark_versions)
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


def _check_versions_verified(versions: Sequence[BenchmarkVersion]) -> None:
    """A gate decides deployments, so the repository tasks it scores must have been shown solvable: refuse a version
    of a repository-task benchmark holding unverified tasks (`workers.coding.task.is_unverified`)."""
    problems = []
    for version in versions:
        environment = ENVIRONMENTS.get(version.benchmark.environment)
        if environment is None or environment.dataset_kind != "repo_tasks":
            continue
        ids = [
            task_id
            for task_id, payload in version.tasks.order_by("task_id").values_list("task_id", "payload")
            if is_unverified(payload)
        ]
        if ids:
            shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
            problems.append(
                f"{version} holds {len(ids)} unverified task(s) of {version.task_count} ({shown}): nothing showed "
                "that their hidden tests can pass, so a deployment cannot be gated on them; pin a version without "
                "them (import those tasks again with a reference patch, or make a benchmark version without them)"
            )
    if problems:
        raise ValidationError({"benchmark_versions": problems})


def _pinned_versions(gate: Gate, overrides: Sequence[BenchmarkVersion] | None) -> list[BenchmarkVersion]:
    """The gate's pinned benchmark versions, with `overrides` replacing the version of their benchmark."""
    pinned = list(gate.benchmark_versions.select_related("benchmark"))
    if overrides:
        by_name = {v.benchmark.name: v for v in pinned}
        for version in overrides:
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
    return pinned


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
    pinned = _pinned_versions(gate, benchmark_versions)
    _check_versions_cover_rules(rules, pinned)
    _check_versions_verified(pinned)  # also a gate made before the check existed, and pinned overrides
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
