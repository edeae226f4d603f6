"""Deployment-gate rules: a validated JSON schema and a pure evaluator that records why it decided.

A gate is a JSON list of rules, each an object discriminated by ``type``:

    [{"type": "threshold", "benchmark": "humaneval", "metric": "pass@1", "op": ">=", "value": 0.6},
     {"type": "no_regression", "benchmark": "humaneval", "alpha": 0.05, "slice_by": ["tag"]},
     {"type": "flag_rate", "detector": "*", "max_rate": 0.02},
     {"type": "approval"}]

`parse_rules` validates such a list (raising `GateRulesError` whose message names ``rules[i].field`` and the
fix); `evaluate_rules` applies the rules to a candidate's eval evidence and returns a `GateEvaluation` whose
verdict is "fail" if any rule fails, else "pending" while an approval rule awaits a human, else "pass". Each
`RuleOutcome` carries the exact inputs it read (values, eval ids, benchmark versions and content hashes, a hash of
the per-task scores) and its statistic, so a decision can be audited and reproduced later. That evidence, the
inputs and the outcome records (`BenchmarkEvidence`, `GateInputs`, `RuleOutcome`, `GateEvaluation`) are in
`workers.evals.gate_evidence`.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import ErrorDetails, PydanticCustomError

from workers.evals.gate_evidence import (
    BenchmarkEvidence,
    GateEvaluation,
    GateInputs,
    RuleOutcome,
    Verdict,
    evidence_record,
    json_number,
)
from workers.evals.paired import compare_paired

# --- rule schema ---------------------------------------------------------------------------------------------------


Decision = tuple[Verdict, dict[str, Any], dict[str, Any], str]
"""What a rule decides: its verdict, the inputs it read, its statistic and a message (see `RuleOutcome`)."""


class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str

    def evaluate(self, inputs: GateInputs) -> Decision:
        """Decide this rule on a candidate's evidence. Each rule type carries its own decision, so a new type is
        one class (and its entry in `RULE_CLASSES`), not another branch in `evaluate_rules`."""
        raise NotImplementedError

    def text(self) -> str:
        """The rule in words, as the gate and decision pages show it."""
        raise NotImplementedError


class ThresholdRule(_Rule):
    """The candidate's ``metric`` on ``benchmark`` must satisfy ``<metric> <op> <value>`` (e.g. pass@1 >= 0.6).

    ``value`` is in the metric's own units (pass@k metrics are rates in [0, 1])."""

    type: Literal["threshold"] = "threshold"
    benchmark: str = Field(min_length=1)
    metric: str = Field(default="pass@1", min_length=1)
    op: Literal[">=", ">", "<=", "<"] = ">="
    value: float = Field(allow_inf_nan=False)

    def text(self) -> str:
        return f"{self.metric} {self.op} {self.value:g} on {self.benchmark}"

    def evaluate(self, inputs: GateInputs) -> Decision:
        """Fails when the benchmark or metric is missing or not finite: no evidence is no pass."""
        evidence = inputs.candidate.get(self.benchmark)
        if evidence is None:
            return (
                "fail",
                {"benchmark": self.benchmark, "candidate": None},
                {},
                _missing_benchmark(self.benchmark, inputs.candidate),
            )
        record = evidence_record(evidence, self.metric)
        used = {"benchmark": self.benchmark, "candidate": record}
        value = evidence.metrics.get(self.metric)
        if value is None:
            have = ", ".join(sorted(evidence.metrics)) or "none"
            return "fail", used, {}, f"metric {self.metric!r} missing from the {self.benchmark!r} eval (has: {have})"
        statistic = {"value": json_number(value), "op": self.op, "threshold": self.value}
        label = f"{self.metric} on {self.benchmark} = {_fmt(value)}"
        if not math.isfinite(value):
            return "fail", used, statistic, f"{label} is not a finite number"
        if _OPS[self.op](float(value), self.value):
            return "pass", used, statistic, f"{label} {self.op} {_fmt(self.value)}"
        return "fail", used, statistic, f"{label}, needs {self.op} {_fmt(self.value)}"


class NoRegressionRule(_Rule):
    """The candidate must not be significantly worse than the current deployment on ``benchmark``.

    Paired per-task comparison (`workers.evals.paired.compare_paired`): a one-sided test at level ``alpha``
    overall, and Holm-corrected across the slices named in ``slice_by``. Passes when nothing is deployed."""

    type: Literal["no_regression"] = "no_regression"
    benchmark: str = Field(min_length=1)
    metric: str = Field(default="pass@1", min_length=1)
    alpha: float = 0.05
    slice_by: list[Literal["tag", "difficulty", "source"]] = Field(default_factory=list)

    def text(self) -> str:
        slices = f", and per {' and per '.join(self.slice_by)}" if self.slice_by else ""
        return (
            f"no regression of {self.metric} on {self.benchmark} against the deployment "
            f"(paired, one-sided, alpha {self.alpha:g}{slices})"
        )

    @field_validator("alpha")
    @classmethod
    def _alpha_range(cls, value: float) -> float:
        # Above 0.5 a one-sided test would flag a regression even when the data lean towards an improvement.
        if not (0.0 < value < 0.5):
            raise PydanticCustomError("alpha_range", "must be between 0 and 0.5 (got {got})", {"got": value})
        return value

    @field_validator("slice_by")
    @classmethod
    def _unique_slices(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise PydanticCustomError("duplicate_slice", "lists a slice kind twice (got {got})", {"got": value})
        return value

    def evaluate(self, inputs: GateInputs) -> Decision:
        """Fails safe whenever the comparison cannot be made against an existing deployment."""
        name = self.benchmark
        evidence = inputs.candidate.get(name)
        used: dict[str, Any] = {
            "benchmark": name,
            "candidate": None if evidence is None else evidence_record(evidence, self.metric),
            "baseline": None,
        }
        if evidence is None:
            return "fail", used, {}, _missing_benchmark(name, inputs.candidate)
        if inputs.baseline is None:
            return "pass", used, {"compared": False}, "no current deployment to compare against"
        base = inputs.baseline.get(name)
        if base is None:
            # A deployment exists but was never evaluated here: the gate cannot show the absence of a regression, so
            # it fails safe rather than waving the candidate through.
            return (
                "fail",
                used,
                {"compared": False},
                (f"the current deployment has no eval on benchmark {name!r}; evaluate it there to compare against"),
            )
        used["baseline"] = evidence_record(base, self.metric)
        if not evidence.tasks:
            return "fail", used, {"compared": False}, f"the candidate's {name!r} eval has no per-task scores to compare"
        if not base.tasks:
            return (
                "fail",
                used,
                {"compared": False},
                (f"the current deployment's {name!r} eval has no per-task scores to compare"),
            )

        notes: list[str] = []
        same_version = base.version == evidence.version and base.content_hash == evidence.content_hash
        if not same_version:
            shared = len(set(base.tasks) & set(evidence.tasks))
            notes.append(
                f"baseline ran {name} v{base.version} ({_short_hash(base.content_hash)}) and the candidate "
                f"v{evidence.version} ({_short_hash(evidence.content_hash)}); compared only the {shared} shared "
                "task ids"
            )
        try:
            comparison = compare_paired(base.tasks, evidence.tasks, alpha=self.alpha, slice_by=self.slice_by)
        except ValueError as exc:
            return "fail", used, {"compared": False}, f"cannot compare {name!r} with the current deployment: {exc}"
        statistic: dict[str, Any] = {"compared": True, "same_version": same_version, **comparison.to_dict()}
        if same_version and (comparison.unpaired_before or comparison.unpaired_after):
            notes.append(
                f"{comparison.unpaired_before} baseline-only and {comparison.unpaired_after} candidate-only task ids "
                "were left out"
            )

        o = comparison.overall
        summary = (
            f"{name} mean score {_fmt(o.before_mean)} -> {_fmt(o.after_mean)} (diff {o.diff:+.4f}, "
            f"{comparison.confidence:.0%} CI [{o.ci_low:+.4f}, {o.ci_high:+.4f}], n={o.n}, {o.test}, "
            f"p_worse={_fmt(o.p_worse)})"
        )
        flagged = [s for s in comparison.slices if s.significant_regression]
        if o.significant_regression or flagged:
            parts = []
            if o.significant_regression:
                parts.append(f"overall (p_worse={_fmt(o.p_worse)} < alpha={self.alpha})")
            parts += [
                f"{s.slice} (diff {s.diff:+.4f}, n={s.n}, Holm-adjusted p_worse={_fmt(s.p_worse_adjusted)})"
                for s in flagged
            ]
            message = f"significant regression on {name}: {'; '.join(parts)}. {summary}"
            verdict: Verdict = "fail"
        else:
            message = f"no significant regression on {name} at alpha={self.alpha}: {summary}"
            verdict = "pass"
        if notes:
            message += ". Note: " + "; ".join(notes)
        return verdict, used, statistic, message


class FlagRateRule(_Rule):
    """The share of the candidate's evaluated trajectories flagged by ``detector`` ("*" = by any detector) must
    be at most ``max_rate`` (a fraction in [0, 1])."""

    type: Literal["flag_rate"] = "flag_rate"
    detector: str = Field(default="*", min_length=1)
    max_rate: float

    @field_validator("max_rate")
    @classmethod
    def _rate_range(cls, value: float) -> float:
        if not (0.0 <= value <= 1.0):  # also rejects NaN
            raise PydanticCustomError("rate_range", "must be a fraction between 0 and 1 (got {got})", {"got": value})
        return value

    def text(self) -> str:
        who = "any detector" if self.detector == "*" else f"detector {self.detector}"
        return f"at most {self.max_rate:.0%} of the evaluated trajectories flagged by {who}"

    def evaluate(self, inputs: GateInputs) -> Decision:
        """Fails when the rate is missing or not a fraction: an unmeasured candidate is not a clean one."""
        rate = inputs.flag_rates.get(self.detector)
        used = {"detector": self.detector, "rate": None if rate is None else json_number(rate)}
        who = "any detector" if self.detector == "*" else f"detector {self.detector!r}"
        if rate is None:
            have = ", ".join(sorted(inputs.flag_rates)) or "none"
            return "fail", used, {}, f"no flag rate for {who} on the candidate's trajectories (have: {have})"
        statistic = {"rate": json_number(rate), "max_rate": self.max_rate}
        if not (0.0 <= rate <= 1.0):
            return "fail", used, statistic, f"flag rate for {who} is {rate!r}, not a fraction in [0, 1]"
        if rate <= self.max_rate:
            return "pass", used, statistic, f"{rate:.2%} of trajectories flagged by {who}, at most {self.max_rate:.2%}"
        return "fail", used, statistic, f"{rate:.2%} of trajectories flagged by {who}, above {self.max_rate:.2%}"


class ApprovalRule(_Rule):
    """A human holding the approver permission must approve the deployment; pending until they decide."""

    type: Literal["approval"] = "approval"

    def text(self) -> str:
        return "a human with the approver permission approves"

    def evaluate(self, inputs: GateInputs) -> Decision:
        """Pending until a human decides; a rejection fails the gate."""
        used = {"approval": inputs.approval}
        if inputs.approval == "approved":
            return "pass", used, {}, "approved by a human with the approver permission"
        if inputs.approval == "rejected":
            return "fail", used, {}, "rejected by a human with the approver permission"
        return "pending", used, {}, "waiting for a human with the approver permission to approve or reject"


AnyRule = ThresholdRule | NoRegressionRule | FlagRateRule | ApprovalRule
Rule = Annotated[AnyRule, Field(discriminator="type")]

RULE_CLASSES: tuple[type[_Rule], ...] = (ThresholdRule, NoRegressionRule, FlagRateRule, ApprovalRule)
RULE_TYPES: tuple[str, ...] = tuple(str(cls.model_fields["type"].default) for cls in RULE_CLASSES)
_CLASS_BY_TYPE: dict[str, type[_Rule]] = dict(zip(RULE_TYPES, RULE_CLASSES, strict=True))


class GateRules(BaseModel):
    """A gate's rule list (at least one rule)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rules: list[Rule] = Field(min_length=1)


class GateRulesError(ValueError):
    """Gate rules failed validation.

    ``errors`` is a list of ``{"field": "rules[1].alpha", "message": "rules[1].alpha: must be ..."}``; the
    exception's message joins the messages with "; ".
    """

    def __init__(self, errors: list[dict[str, str]]) -> None:
        self.errors = errors
        super().__init__("; ".join(err["message"] for err in errors) or "invalid gate rules")


def _translate(err: ErrorDetails) -> dict[str, str]:
    loc = tuple(err["loc"])
    kind = err["type"]
    ctx = err.get("ctx") or {}
    valid = ", ".join(RULE_TYPES)
    if loc == ("rules",) and kind == "too_short":
        return {"field": "rules", "message": f"a gate needs at least one rule (rule types: {valid})"}
    if not (len(loc) >= 2 and loc[0] == "rules" and isinstance(loc[1], int)):
        path = ".".join(str(p) for p in loc) or "rules"
        return {"field": path, "message": f"{path}: {err['msg']}"}

    head = f"rules[{loc[1]}]"
    rest = loc[2:]
    rule_type: str | None = None
    if rest and rest[0] in _CLASS_BY_TYPE:
        # Pydantic puts the discriminator's value in the path; the user wrote no such key.
        rule_type = str(rest[0])
        rest = rest[1:]
    if kind == "union_tag_invalid":
        return {"field": f"{head}.type", "message": f"{head}.type: unknown rule type {ctx.get('tag')!r}; use {valid}"}
    if kind == "union_tag_not_found":
        return {"field": f"{head}.type", "message": f'{head}.type: missing; add "type" set to one of {valid}'}
    if kind == "model_attributes_type" and not rest:
        return {"field": head, "message": f'{head}: must be an object such as {{"type": "approval"}}'}
    path = head + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in rest)

    if kind == "missing":
        message = "required; add it"
    elif kind == "extra_forbidden":
        allowed = ", ".join(_CLASS_BY_TYPE[rule_type].model_fields) if rule_type else ""
        message = f"not a field of {rule_type} rules; remove it (allowed: {allowed})"
    elif kind == "string_too_short":
        message = "must not be empty"
    elif kind in ("alpha_range", "rate_range", "duplicate_slice"):
        message = str(err["msg"])
    else:
        message = f"{err['msg']} (got {err['input']!r})"
    return {"field": path, "message": f"{path}: {message}"}


def rule_text(raw: object) -> str:
    """One stored rule (its JSON) in words; a rule this version cannot read is shown as its JSON."""
    cls = _CLASS_BY_TYPE.get(raw.get("type", "")) if isinstance(raw, dict) else None
    if cls is not None:
        try:
            return cls.model_validate(raw).text()
        except ValidationError:
            pass
    return json.dumps(raw, sort_keys=True, default=str)


def parse_rules(raw: object) -> list[AnyRule]:
    """Validate a gate's rules: a JSON list of rule objects (or ``{"rules": [...]}``, or JSON text of either).

    Raises `GateRulesError` naming every problem as ``rules[<index>].<field>: <what is wrong and the fix>``.
    """
    if isinstance(raw, str | bytes | bytearray):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise GateRulesError([{"field": "", "message": f"gate rules are not valid JSON: {exc}"}]) from None
    if isinstance(raw, Mapping):
        data: object = raw
    elif isinstance(raw, list | tuple):
        data = {"rules": list(raw)}
    else:
        raise GateRulesError(
            [{"field": "", "message": f"gate rules must be a JSON list of rule objects (got {type(raw).__name__})"}]
        )
    try:
        return list(GateRules.model_validate(data).rules)
    except ValidationError as exc:
        raise GateRulesError([_translate(err) for err in exc.errors(include_url=False)]) from None


# --- evaluation ----------------------------------------------------------------------------------------------------


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def _short_hash(content_hash: str) -> str:
    """First 12 hex digits of a content hash, without an "algorithm:" prefix (the full hash is in the inputs)."""
    return content_hash.rpartition(":")[2][:12]


def _missing_benchmark(benchmark: str, candidate: Mapping[str, BenchmarkEvidence]) -> str:
    have = ", ".join(sorted(candidate)) or "none"
    return f"benchmark {benchmark!r} has no eval for the candidate (evaluated: {have}); run that eval first"


_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
}


def evaluate_rules(rules: Sequence[AnyRule], inputs: GateInputs) -> GateEvaluation:
    """Apply each rule to ``inputs``; every outcome records what it read and computed (see the module docstring).

    The overall verdict is "fail" if any rule fails, else "pending" if an approval rule is still waiting, else
    "pass". Deterministic: the same rules and inputs always give the same evaluation (bootstraps use a fixed seed).
    """
    if not rules:
        raise GateRulesError([{"field": "rules", "message": "a gate needs at least one rule"}])
    outcomes: list[RuleOutcome] = []
    for index, rule in enumerate(rules):
        if not isinstance(rule, _Rule):  # pragma: no cover - guards against an unvalidated object slipping in
            raise TypeError(f"rules[{index}] is not a gate rule (got {type(rule).__name__})")
        verdict, used, statistic, message = rule.evaluate(inputs)
        outcomes.append(
            RuleOutcome(
                index=index,
                rule=rule.model_dump(mode="json"),
                verdict=verdict,
                inputs=used,
                statistic=statistic,
                message=message,
            )
        )
    verdicts = {o.verdict for o in outcomes}
    overall: Verdict = "fail" if "fail" in verdicts else "pending" if "pending" in verdicts else "pass"
    return GateEvaluation(outcomes=outcomes, verdict=overall)
