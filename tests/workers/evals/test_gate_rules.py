"""Deployment-gate rules (workers.evals.gates): schema validation with exact messages, and rule evaluation."""

from __future__ import annotations

import json

import pydantic
import pytest

from workers.evals.gate_evidence import BenchmarkEvidence, GateInputs, RuleOutcome
from workers.evals.gates import (
    ApprovalRule,
    FlagRateRule,
    GateRulesError,
    NoRegressionRule,
    ThresholdRule,
    evaluate_rules,
    parse_rules,
)
from workers.evals.paired import TaskScore

# --- helpers -----------------------------------------------------------------------------------------------------


def _tasks(
    worse: int = 0, improved: int = 0, same_pass: int = 0, same_fail: int = 0, *, tag: str = "", prefix: str = "t"
) -> tuple[dict[str, TaskScore], dict[str, TaskScore]]:
    """(baseline tasks, candidate tasks) with the given counts of each before/after outcome."""
    pairs = [(1.0, 0.0)] * worse + [(0.0, 1.0)] * improved + [(1.0, 1.0)] * same_pass + [(0.0, 0.0)] * same_fail
    tags = (tag,) if tag else ()
    base = {f"{prefix}{i}": TaskScore(b, tags=tags) for i, (b, _) in enumerate(pairs)}
    cand = {f"{prefix}{i}": TaskScore(a, tags=tags) for i, (_, a) in enumerate(pairs)}
    return base, cand


def _evidence(
    tasks: dict[str, TaskScore],
    *,
    benchmark: str = "humaneval",
    version: int = 2,
    content_hash: str = "sha256:aaaabbbbccccdddd",
    eval_id: int | None = 17,
    metrics: dict[str, float] | None = None,
) -> BenchmarkEvidence:
    if metrics is None:
        metrics = {"pass@1": sum(t.score for t in tasks.values()) / max(1, len(tasks))}
    return BenchmarkEvidence(
        benchmark=benchmark, version=version, content_hash=content_hash, eval_id=eval_id, metrics=metrics, tasks=tasks
    )


def _one(rule: object, inputs: GateInputs) -> RuleOutcome:
    evaluation = evaluate_rules(parse_rules([rule]), inputs)
    assert len(evaluation.outcomes) == 1
    return evaluation.outcomes[0]


# --- parsing -----------------------------------------------------------------------------------------------------


def test_parse_rules_accepts_every_rule_type_with_defaults() -> None:
    raw = [
        {"type": "threshold", "benchmark": "humaneval", "value": 0.6},
        {"type": "no_regression", "benchmark": "humaneval", "slice_by": ["tag", "difficulty"]},
        {"type": "flag_rate", "max_rate": 0.02},
        {"type": "approval"},
    ]
    rules = parse_rules(raw)
    assert rules == [
        ThresholdRule(benchmark="humaneval", metric="pass@1", op=">=", value=0.6),
        NoRegressionRule(benchmark="humaneval", metric="pass@1", alpha=0.05, slice_by=["tag", "difficulty"]),
        FlagRateRule(detector="*", max_rate=0.02),
        ApprovalRule(),
    ]
    # The {"rules": [...]} wrapper and JSON text parse the same.
    assert parse_rules({"rules": raw}) == rules
    assert parse_rules(json.dumps(raw)) == rules


def test_rules_are_frozen() -> None:
    rule = parse_rules([{"type": "approval"}])[0]
    with pytest.raises(pydantic.ValidationError):
        rule.type = "threshold"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            [{"type": "approval"}, {"type": "no_regression", "benchmark": "humaneval", "alpha": 0.9}],
            "rules[1].alpha: must be between 0 and 0.5 (got 0.9)",
        ),
        (
            [{"type": "no_regression", "benchmark": "humaneval", "alpha": 0}],
            "rules[0].alpha: must be between 0 and 0.5 (got 0.0)",
        ),
        ([], "a gate needs at least one rule (rule types: threshold, no_regression, flag_rate, approval)"),
        ({"rules": []}, "a gate needs at least one rule (rule types: threshold, no_regression, flag_rate, approval)"),
        (
            [{"type": "canary"}],
            "rules[0].type: unknown rule type 'canary'; use threshold, no_regression, flag_rate, approval",
        ),
        (
            [{"benchmark": "x"}],
            'rules[0].type: missing; add "type" set to one of threshold, no_regression, flag_rate, approval',
        ),
        ([{"type": "threshold", "value": 0.5}], "rules[0].benchmark: required; add it"),
        ([{"type": "threshold", "benchmark": "", "value": 0.5}], "rules[0].benchmark: must not be empty"),
        (
            [{"type": "threshold", "benchmark": "h", "value": 0.5, "op": "=="}],
            "rules[0].op: Input should be '>=', '>', '<=' or '<' (got '==')",
        ),
        (
            [{"type": "approval", "who": "alice"}],
            "rules[0].who: not a field of approval rules; remove it (allowed: type)",
        ),
        ([{"type": "flag_rate", "max_rate": 1.5}], "rules[0].max_rate: must be a fraction between 0 and 1 (got 1.5)"),
        (
            [{"type": "no_regression", "benchmark": "h", "slice_by": ["tag", "language"]}],
            "rules[0].slice_by[1]: Input should be 'tag', 'difficulty' or 'source' (got 'language')",
        ),
        (
            [{"type": "no_regression", "benchmark": "h", "slice_by": ["tag", "tag"]}],
            "rules[0].slice_by: lists a slice kind twice (got ['tag', 'tag'])",
        ),
        (["approval"], 'rules[0]: must be an object such as {"type": "approval"}'),
        (42, "gate rules must be a JSON list of rule objects (got int)"),
    ],
)
def test_parse_rules_error_messages(raw: object, message: str) -> None:
    with pytest.raises(GateRulesError) as info:
        parse_rules(raw)
    assert str(info.value) == message
    assert isinstance(info.value, ValueError)


def test_parse_rules_lists_every_problem_with_its_field() -> None:
    with pytest.raises(GateRulesError) as info:
        parse_rules([{"type": "threshold", "benchmark": "h"}, {"type": "flag_rate", "max_rate": -1}])
    assert [e["field"] for e in info.value.errors] == ["rules[0].value", "rules[1].max_rate"]
    assert str(info.value) == (
        "rules[0].value: required; add it; rules[1].max_rate: must be a fraction between 0 and 1 (got -1.0)"
    )


# --- threshold -----------------------------------------------------------------------------------------------------


def test_threshold_rule_pass_and_fail_with_evidence() -> None:
    base, cand = _tasks(same_pass=6, same_fail=4)
    inputs = GateInputs(candidate={"humaneval": _evidence(cand, metrics={"pass@1": 0.6, "pass@10": 0.8})})
    passed = _one({"type": "threshold", "benchmark": "humaneval", "value": 0.6}, inputs)
    assert passed.verdict == "pass"
    assert passed.message == "pass@1 on humaneval = 0.6 >= 0.6"
    assert passed.statistic == {"value": 0.6, "op": ">=", "threshold": 0.6}
    record = passed.inputs["candidate"]
    assert (record["eval_id"], record["version"], record["content_hash"]) == (17, 2, "sha256:aaaabbbbccccdddd")
    assert (record["metric"], record["metric_value"], record["n_tasks"]) == ("pass@1", 0.6, 10)
    assert len(record["tasks_sha256"]) == 64
    assert passed.rule == {"type": "threshold", "benchmark": "humaneval", "metric": "pass@1", "op": ">=", "value": 0.6}

    failed = _one({"type": "threshold", "benchmark": "humaneval", "op": ">", "value": 0.6}, inputs)
    assert failed.verdict == "fail"
    assert failed.message == "pass@1 on humaneval = 0.6, needs > 0.6"
    assert _one({"type": "threshold", "benchmark": "humaneval", "metric": "pass@10", "value": 0.7}, inputs).verdict == (
        "pass"
    )
    assert _one({"type": "threshold", "benchmark": "humaneval", "op": "<", "value": 0.5}, inputs).verdict == "fail"


def test_threshold_rule_missing_metric_or_benchmark_fails_naming_it() -> None:
    _, cand = _tasks(same_pass=1)
    inputs = GateInputs(candidate={"humaneval": _evidence(cand, metrics={"pass@1": 1.0})})
    missing_metric = _one({"type": "threshold", "benchmark": "humaneval", "metric": "pass@5", "value": 0.5}, inputs)
    assert missing_metric.verdict == "fail"
    assert missing_metric.message == "metric 'pass@5' missing from the 'humaneval' eval (has: pass@1)"
    missing = _one({"type": "threshold", "benchmark": "mbpp", "value": 0.5}, inputs)
    assert missing.verdict == "fail"
    assert (
        missing.message == "benchmark 'mbpp' has no eval for the candidate (evaluated: humaneval); run that eval first"
    )
    assert missing.inputs == {"benchmark": "mbpp", "candidate": None}


def test_threshold_rule_nan_metric_fails_and_stays_json_ready() -> None:
    inputs = GateInputs(candidate={"h": _evidence({}, benchmark="h", metrics={"pass@1": float("nan")})})
    evaluation = evaluate_rules(parse_rules([{"type": "threshold", "benchmark": "h", "value": 0.1}]), inputs)
    assert evaluation.verdict == "fail"
    assert "is not a finite number" in evaluation.outcomes[0].message
    json.dumps(evaluation.to_dict(), allow_nan=False)


# --- no_regression -------------------------------------------------------------------------------------------------


def test_no_regression_without_a_deployment_passes_and_says_so() -> None:
    _, cand = _tasks(same_pass=3)
    outcome = _one(
        {"type": "no_regression", "benchmark": "humaneval"}, GateInputs(candidate={"humaneval": _evidence(cand)})
    )
    assert outcome.verdict == "pass"
    assert outcome.message == "no current deployment to compare against"
    assert outcome.statistic == {"compared": False}
    assert outcome.inputs["baseline"] is None
    assert outcome.inputs["candidate"]["eval_id"] == 17


def test_no_regression_passes_on_unchanged_scores_and_records_both_sides() -> None:
    base, cand = _tasks(worse=2, improved=2, same_pass=40, same_fail=10)
    inputs = GateInputs(
        candidate={"humaneval": _evidence(cand, eval_id=30)}, baseline={"humaneval": _evidence(base, eval_id=12)}
    )
    outcome = _one({"type": "no_regression", "benchmark": "humaneval"}, inputs)
    assert outcome.verdict == "pass"
    assert outcome.message.startswith("no significant regression on humaneval at alpha=0.05: ")
    assert (outcome.inputs["candidate"]["eval_id"], outcome.inputs["baseline"]["eval_id"]) == (30, 12)
    assert outcome.inputs["candidate"]["tasks_sha256"] != outcome.inputs["baseline"]["tasks_sha256"]
    stat = outcome.statistic
    assert stat["compared"] and stat["same_version"] and stat["binary"]
    assert stat["overall"]["test"] == "mcnemar_exact"
    assert (stat["overall"]["worse"], stat["overall"]["improved"], stat["overall"]["n"]) == (2, 2, 54)
    assert stat["overall"]["p_worse"] == pytest.approx(11 / 16)


def test_no_regression_fails_on_a_significant_regression() -> None:
    base, cand = _tasks(worse=20, improved=1, same_pass=50, same_fail=29)
    inputs = GateInputs(candidate={"humaneval": _evidence(cand)}, baseline={"humaneval": _evidence(base)})
    outcome = _one({"type": "no_regression", "benchmark": "humaneval"}, inputs)
    assert outcome.verdict == "fail"
    assert outcome.message.startswith("significant regression on humaneval: overall (p_worse=")
    assert outcome.statistic["overall"]["significant_regression"] is True
    # A stricter alpha than the evidence supports lets a weaker dip through.
    base, cand = _tasks(worse=6, improved=1, same_pass=50)
    inputs = GateInputs(candidate={"humaneval": _evidence(cand)}, baseline={"humaneval": _evidence(base)})
    assert _one({"type": "no_regression", "benchmark": "humaneval", "alpha": 0.01}, inputs).verdict == "pass"
    assert _one({"type": "no_regression", "benchmark": "humaneval", "alpha": 0.1}, inputs).verdict == "fail"


def test_no_regression_slice_regression_fails_the_gate() -> None:
    # math regresses (15 newly failing), code improves (8 newly passing): overall is not significant.
    math_b, math_c = _tasks(worse=15, same_pass=25, tag="math", prefix="m")
    code_b, code_c = _tasks(improved=8, same_pass=40, same_fail=12, tag="code", prefix="c")
    inputs = GateInputs(
        candidate={"humaneval": _evidence({**math_c, **code_c})},
        baseline={"humaneval": _evidence({**math_b, **code_b})},
    )
    assert _one({"type": "no_regression", "benchmark": "humaneval"}, inputs).verdict == "pass"
    outcome = _one({"type": "no_regression", "benchmark": "humaneval", "slice_by": ["tag"]}, inputs)
    assert outcome.verdict == "fail"
    assert outcome.message.startswith(
        "significant regression on humaneval: tag:math (diff -0.3750, n=40, Holm-adjusted"
    )
    assert "overall" not in outcome.message.split(".")[0]
    slices = {s["slice"]: s for s in outcome.statistic["slices"]}
    assert slices["tag:math"]["significant_regression"] and not slices["tag:code"]["significant_regression"]
    assert outcome.statistic["overall"]["significant_regression"] is False


def test_no_regression_across_benchmark_versions_compares_shared_tasks() -> None:
    base = {f"t{i}": TaskScore(1.0) for i in range(30)}
    cand = {f"t{i}": TaskScore(1.0) for i in range(10, 40)}  # v3 dropped t0-t9 and added t30-t39
    inputs = GateInputs(
        candidate={"humaneval": _evidence(cand, version=3, content_hash="sha256:eeeeffff00001111")},
        baseline={"humaneval": _evidence(base, version=2)},
    )
    outcome = _one({"type": "no_regression", "benchmark": "humaneval"}, inputs)
    assert outcome.verdict == "pass"
    assert outcome.message.endswith(
        "Note: baseline ran humaneval v2 (aaaabbbbcccc) and the candidate v3 (eeeeffff0000); "
        "compared only the 20 shared task ids"
    )
    stat = outcome.statistic
    assert stat["same_version"] is False
    assert (stat["overall"]["n"], stat["unpaired_before"], stat["unpaired_after"]) == (20, 10, 10)
    assert (outcome.inputs["baseline"]["version"], outcome.inputs["candidate"]["version"]) == (2, 3)


def test_no_regression_with_nothing_comparable_fails_naming_the_problem() -> None:
    base, cand = _tasks(same_pass=5)
    rule = {"type": "no_regression", "benchmark": "humaneval"}
    # Candidate never ran the benchmark.
    outcome = _one(rule, GateInputs(candidate={}, baseline={"humaneval": _evidence(base)}))
    assert outcome.verdict == "fail"
    assert (
        outcome.message == "benchmark 'humaneval' has no eval for the candidate (evaluated: none); run that eval first"
    )
    # The deployment exists but was never evaluated on this benchmark: fail safe.
    outcome = _one(rule, GateInputs(candidate={"humaneval": _evidence(cand)}, baseline={"mbpp": _evidence(base)}))
    assert outcome.verdict == "fail"
    assert "current deployment has no eval on benchmark 'humaneval'" in outcome.message
    # Disjoint task ids.
    other = {f"x{i}": TaskScore(1.0) for i in range(5)}
    outcome = _one(
        rule, GateInputs(candidate={"humaneval": _evidence(cand)}, baseline={"humaneval": _evidence(other, version=1)})
    )
    assert outcome.verdict == "fail"
    assert "share no task ids" in outcome.message
    # No per-task scores.
    outcome = _one(rule, GateInputs(candidate={"humaneval": _evidence({})}, baseline={"humaneval": _evidence(base)}))
    assert outcome.verdict == "fail"
    assert outcome.message == "the candidate's 'humaneval' eval has no per-task scores to compare"


# --- flag rate and approval ----------------------------------------------------------------------------------------


def test_flag_rate_rule() -> None:
    inputs = GateInputs(candidate={}, flag_rates={"*": 0.03, "reward_hacking": 0.01})
    any_detector = _one({"type": "flag_rate", "max_rate": 0.05}, inputs)
    assert any_detector.verdict == "pass"
    assert any_detector.message == "3.00% of trajectories flagged by any detector, at most 5.00%"
    assert any_detector.inputs == {"detector": "*", "rate": 0.03}
    assert any_detector.statistic == {"rate": 0.03, "max_rate": 0.05}
    too_many = _one({"type": "flag_rate", "max_rate": 0.02}, inputs)
    assert too_many.verdict == "fail"
    assert too_many.message == "3.00% of trajectories flagged by any detector, above 2.00%"
    assert _one({"type": "flag_rate", "detector": "reward_hacking", "max_rate": 0.01}, inputs).verdict == "pass"
    unknown = _one({"type": "flag_rate", "detector": "pii", "max_rate": 0.5}, inputs)
    assert unknown.verdict == "fail"
    assert (
        unknown.message == "no flag rate for detector 'pii' on the candidate's trajectories (have: *, reward_hacking)"
    )


@pytest.mark.parametrize(("approval", "verdict"), [("approved", "pass"), ("rejected", "fail"), ("", "pending")])
def test_approval_rule(approval: str, verdict: str) -> None:
    outcome = _one({"type": "approval"}, GateInputs(candidate={}, approval=approval))  # type: ignore[arg-type]
    assert outcome.verdict == verdict
    assert outcome.inputs == {"approval": approval}
    assert "approver permission" in outcome.message


# --- overall verdict and audit record ------------------------------------------------------------------------------


def _gate_inputs(approval: str, flag_rate: float) -> GateInputs:
    base, cand = _tasks(worse=1, improved=1, same_pass=20)
    return GateInputs(
        candidate={"humaneval": _evidence(cand, metrics={"pass@1": 0.95})},
        baseline={"humaneval": _evidence(base)},
        flag_rates={"*": flag_rate},
        approval=approval,  # type: ignore[arg-type]
    )


RULES = [
    {"type": "threshold", "benchmark": "humaneval", "value": 0.9},
    {"type": "no_regression", "benchmark": "humaneval", "slice_by": ["tag"]},
    {"type": "flag_rate", "max_rate": 0.05},
    {"type": "approval"},
]


@pytest.mark.parametrize(
    ("approval", "flag_rate", "verdict"),
    [
        ("approved", 0.01, "pass"),
        ("", 0.01, "pending"),  # everything else passed; waiting for a human
        ("", 0.5, "fail"),  # a failure beats a pending approval
        ("rejected", 0.01, "fail"),
        ("approved", 0.5, "fail"),
    ],
)
def test_overall_verdict(approval: str, flag_rate: float, verdict: str) -> None:
    evaluation = evaluate_rules(parse_rules(RULES), _gate_inputs(approval, flag_rate))
    assert evaluation.verdict == verdict
    assert [o.index for o in evaluation.outcomes] == [0, 1, 2, 3]


def test_evaluation_to_dict_is_json_ready_and_deterministic() -> None:
    rules = parse_rules(RULES)
    first = evaluate_rules(rules, _gate_inputs("approved", 0.01)).to_dict()
    second = evaluate_rules(rules, _gate_inputs("approved", 0.01)).to_dict()
    assert first == second
    data = json.loads(json.dumps(first, allow_nan=False))
    assert data["verdict"] == "pass"
    assert [o["verdict"] for o in data["outcomes"]] == ["pass", "pass", "pass", "pass"]
    assert set(data["outcomes"][1]) == {"index", "rule", "verdict", "inputs", "statistic", "message"}
    assert data["outcomes"][1]["rule"] == {
        "type": "no_regression",
        "benchmark": "humaneval",
        "metric": "pass@1",
        "alpha": 0.05,
        "slice_by": ["tag"],
    }
    assert data["outcomes"][1]["inputs"]["baseline"]["content_hash"] == "sha256:aaaabbbbccccdddd"


def test_evaluate_rules_needs_at_least_one_rule() -> None:
    with pytest.raises(GateRulesError, match="a gate needs at least one rule"):
        evaluate_rules([], GateInputs(candidate={}))


# --- each rule decides itself ------------------------------------------------------------------------------------


def test_every_rule_type_carries_its_own_evaluate() -> None:
    from workers.evals.gates import RULE_CLASSES

    for cls in RULE_CLASSES:
        assert "evaluate" in cls.__dict__, f"{cls.__name__} does not define evaluate"


def test_evaluate_rules_records_what_each_rule_decides() -> None:
    before, after = _tasks(same_pass=10, same_fail=2)
    inputs = GateInputs(
        candidate={"humaneval": _evidence(after, metrics={"pass@1": 0.7})},
        baseline={"humaneval": _evidence(before)},
        flag_rates={"*": 0.5},
        approval="",
    )
    rules = parse_rules(
        [
            {"type": "threshold", "benchmark": "humaneval", "value": 0.6},
            {"type": "no_regression", "benchmark": "humaneval"},
            {"type": "flag_rate", "max_rate": 0.1},
            {"type": "approval"},
        ]
    )
    evaluation = evaluate_rules(rules, inputs)
    for rule, outcome in zip(rules, evaluation.outcomes, strict=True):
        verdict, used, statistic, message = rule.evaluate(inputs)
        assert (outcome.verdict, outcome.inputs, outcome.statistic, outcome.message) == (
            verdict,
            used,
            statistic,
            message,
        )
    assert [o.verdict for o in evaluation.outcomes] == ["pass", "pass", "fail", "pending"]
    assert evaluation.verdict == "fail"


def test_every_rule_type_reads_as_words_and_an_unreadable_rule_as_its_json() -> None:
    from workers.evals.gates import RULE_CLASSES, rule_text

    texts = {
        "threshold": rule_text({"type": "threshold", "benchmark": "humaneval", "metric": "pass@1", "value": 0.5}),
        "no_regression": rule_text({"type": "no_regression", "benchmark": "repo", "slice_by": ["tag"]}),
        "flag_rate": rule_text({"type": "flag_rate", "max_rate": 0.1}),
        "approval": rule_text({"type": "approval"}),
    }
    assert set(texts) == {cls.model_fields["type"].default for cls in RULE_CLASSES}
    assert texts["threshold"] == "pass@1 >= 0.5 on humaneval"
    assert texts["no_regression"].startswith("no regression of pass@1 on repo") and "per tag" in texts["no_regression"]
    assert texts["flag_rate"] == "at most 10% of the evaluated trajectories flagged by any detector"
    assert texts["approval"] == "a human with the approver permission approves"
    assert rule_text({"type": "threshold", "value": "x"}) == '{"type": "threshold", "value": "x"}'
    assert rule_text("not a rule") == '"not a rule"'
