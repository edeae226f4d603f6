"""Deployment gates: rules checked at creation, checks that wait for evals, immutable decisions with their
evidence, approval by an approver, deployments, rollback, webhooks, and the bad input around them."""

from __future__ import annotations

import pytest

from apps.benchmarks.models import Eval
from apps.gates.models import CheckStatus, Deployment, Gate, GateCheck, GateDecision
from apps.gates.services import gate_check_advance, gate_checks_advance_all
from tests.factories import CODING_ROWS, checkpoint_for, coding_version, finish_eval

pytestmark = pytest.mark.django_db

ALL_PASS = {row["id"]: (1, 1) for row in CODING_ROWS}


@pytest.fixture
def version(users):  # type: ignore[no-untyped-def]
    return coding_version(owner=users["admin"])


def _gate(client_for, version, rules=None, **extra):  # type: ignore[no-untyped-def]
    body = {
        "name": extra.pop("name", "ship"),
        "benchmark_versions": [version.pk],
        "rules": rules
        if rules is not None
        else [
            {"type": "threshold", "benchmark": "mini-coding", "metric": "pass@1", "value": 0.5},
            {"type": "no_regression", "benchmark": "mini-coding", "alpha": 0.05, "slice_by": ["tag"]},
            {"type": "flag_rate", "max_rate": 0.1},
        ],
        **extra,
    }
    reply = client_for("admin").post("/api/v1/gates/", body, format="json")
    assert reply.status_code == 201, reply.json()
    return Gate.objects.get(pk=reply.json()["id"])


def _evaluate(client_for, gate, checkpoint, role="operator"):  # type: ignore[no-untyped-def]
    return client_for(role).post(f"/api/v1/gates/{gate.pk}/evaluate/", {"checkpoint": checkpoint.pk}, format="json")


def _gate_checkpoint(client_for, gate, checkpoint, results):  # type: ignore[no-untyped-def]
    """Evaluate, play the candidate eval's end with `results`, return the decided check."""
    reply = _evaluate(client_for, gate, checkpoint)
    assert reply.status_code == 202, reply.json()
    check = GateCheck.objects.get(pk=reply.json()["id"])
    for evaluation in check.baseline_evals.all():
        if not evaluation.metrics:
            finish_eval(evaluation, ALL_PASS)
    (candidate,) = check.candidate_evals.all()
    finish_eval(candidate, results)
    check.refresh_from_db()
    return check


@pytest.mark.parametrize(
    ("rules", "words"),
    [
        ([], "at least one rule"),
        ([{"type": "canary"}], "rules[0].type: unknown rule type 'canary'"),
        ([{"type": "no_regression", "benchmark": "mini-coding", "alpha": 0.9}], "rules[0].alpha"),
        ([{"type": "threshold", "benchmark": "other", "value": 0.1}], "no version of it is pinned"),
    ],
)
def test_bad_gate_rules_are_refused_naming_the_rule_and_field(client_for, version, rules, words) -> None:
    body = {"name": "g", "benchmark_versions": [version.pk], "rules": rules}
    reply = client_for("admin").post("/api/v1/gates/", body, format="json")
    assert reply.status_code == 400 and words in reply.json()["detail"]
    assert not Gate.objects.exists()


def test_only_admins_create_gates_and_gates_are_not_edited(client_for, version) -> None:
    body = {"name": "g", "benchmark_versions": [version.pk], "rules": [{"type": "approval"}]}
    assert client_for("operator").post("/api/v1/gates/", body, format="json").status_code == 403
    gate = _gate(client_for, version)
    assert client_for("admin").patch(f"/api/v1/gates/{gate.pk}/", {"rules": []}, format="json").status_code == 405


def test_requires_approval_adds_an_approval_rule(client_for, version) -> None:
    gate = _gate(client_for, version)
    assert gate.rules[-1] == {"type": "approval"}
    no_human = _gate(client_for, version, name="auto", requires_approval=False)
    assert all(rule["type"] != "approval" for rule in no_human.rules)


def test_a_checkpoint_is_gated_approved_by_an_approver_and_deployed(client_for, users, version, tmp_path) -> None:
    gate = _gate(client_for, version)
    checkpoint = checkpoint_for(owner=users["operator"], tmp_path=tmp_path)
    check = _gate_checkpoint(client_for, gate, checkpoint, ALL_PASS)
    assert check.status == CheckStatus.DECIDED
    decision = GateDecision.objects.get(gate_check=check)
    assert decision.verdict == "pending" and decision.final_verdict == "pending"
    outcomes = {o["rule"]["type"]: o for o in decision.evidence["outcomes"]}
    assert (
        outcomes["threshold"]["verdict"] == "pass"
        and outcomes["threshold"]["inputs"]["candidate"]["metric_value"] == 1.0
    )
    assert outcomes["no_regression"]["message"].startswith("no current deployment")
    assert outcomes["flag_rate"]["statistic"]["rate"] == 0.0
    assert decision.evidence["candidate_evals"]["mini-coding"] == check.candidate_evals.get().pk
    assert not Deployment.objects.exists()

    # Polling the check returns the decision with its evidence.
    polled = client_for("viewer").get(f"/api/v1/gate-checks/{check.pk}/")
    assert polled.status_code == 200 and polled.json()["decision"]["id"] == decision.pk
    waiting = polled.json()["decision"]
    assert waiting["verdict"] == waiting["final_verdict"] == "pending"
    assert [(s["stage"], s["state"]) for s in waiting["stages"]] == [("checks", "pass"), ("approval", "waiting")]

    for role in ("viewer", "operator", "reviewer"):
        reply = client_for(role).post(f"/api/v1/gate-decisions/{decision.pk}/approve/", {}, format="json")
        assert reply.status_code == 403
    reply = client_for("approver").post(
        f"/api/v1/gate-decisions/{decision.pk}/approve/", {"note": "lgtm"}, format="json"
    )
    assert reply.status_code == 200, reply.json()
    assert reply.json()["final_verdict"] == "pass" and reply.json()["approved_by"] == users["approver"].username
    # One verdict (issue 39): `verdict` is the outcome, never the stored "pending" beside a final "pass".
    assert reply.json()["verdict"] == "pass" and [s["state"] for s in reply.json()["stages"]] == ["pass", "approved"]
    deployment = Deployment.objects.get(gate=gate, is_current=True)
    assert deployment.checkpoint_id == checkpoint.pk and deployment.decision_id == decision.pk

    twice = client_for("admin").post(f"/api/v1/gate-decisions/{decision.pk}/reject/", {}, format="json")
    assert twice.status_code == 400 and "already approved" in twice.json()["detail"]
    assert Deployment.objects.count() == 1


def test_a_regression_against_the_deployment_fails_and_a_failed_decision_cannot_be_approved(
    client_for, users, version, tmp_path
) -> None:
    gate = _gate(client_for, version, requires_approval=False)
    first = checkpoint_for(owner=users["operator"], tmp_path=tmp_path, step=1)
    check = _gate_checkpoint(client_for, gate, first, ALL_PASS)
    assert GateDecision.objects.get(gate_check=check).final_verdict == "pass"
    assert Deployment.objects.get(is_current=True).checkpoint_id == first.pk  # no approval needed: deployed

    second = checkpoint_for(owner=users["operator"], tmp_path=tmp_path, step=2)
    worse = {row["id"]: (1, 0 if "even" in row["tags"] else 1) for row in CODING_ROWS}
    check = _gate_checkpoint(client_for, gate, second, worse)
    assert check.baseline_evals.count() == 1 and check.baseline_deployment is not None
    decision = GateDecision.objects.get(gate_check=check)
    outcome = next(o for o in decision.evidence["outcomes"] if o["rule"]["type"] == "no_regression")
    assert decision.verdict == "fail" and outcome["verdict"] == "fail", outcome["message"]
    assert outcome["statistic"]["compared"] is True
    assert Deployment.objects.get(is_current=True).checkpoint_id == first.pk
    reply = client_for("approver").post(f"/api/v1/gate-decisions/{decision.pk}/approve/", {}, format="json")
    assert reply.status_code == 400 and "nothing to approve" in reply.json()["detail"]


def test_a_threshold_miss_fails_the_gate(client_for, users, version, tmp_path) -> None:
    gate = _gate(client_for, version)
    checkpoint = checkpoint_for(owner=users["operator"], tmp_path=tmp_path)
    check = _gate_checkpoint(client_for, gate, checkpoint, {row["id"]: (1, 0) for row in CODING_ROWS})
    decision = GateDecision.objects.get(gate_check=check)
    assert decision.verdict == "fail"
    assert [o["verdict"] for o in decision.evidence["outcomes"] if o["rule"]["type"] == "threshold"] == ["fail"]


def test_a_failed_eval_makes_the_check_an_error_not_a_verdict(client_for, users, version, tmp_path) -> None:
    gate = _gate(client_for, version)
    checkpoint = checkpoint_for(owner=users["operator"], tmp_path=tmp_path)
    check = GateCheck.objects.get(pk=_evaluate(client_for, gate, checkpoint).json()["id"])
    finish_eval(check.candidate_evals.get(), {}, status="failed")
    assert gate_checks_advance_all() == 1
    check.refresh_from_db()
    assert check.status == CheckStatus.ERROR and "failed: boom" in check.error
    assert not GateDecision.objects.exists()


def test_a_check_waits_while_evals_run_and_a_second_advance_changes_nothing(client_for, users, version, tmp_path):  # type: ignore[no-untyped-def]
    gate = _gate(client_for, version)
    checkpoint = checkpoint_for(owner=users["operator"], tmp_path=tmp_path)
    check = GateCheck.objects.get(pk=_evaluate(client_for, gate, checkpoint).json()["id"])
    assert gate_check_advance(check_id=check.pk).status == CheckStatus.WAITING
    finish_eval(check.candidate_evals.get(), ALL_PASS)
    gate_check_advance(check_id=check.pk)
    gate_check_advance(check_id=check.pk)
    assert GateDecision.objects.count() == 1


def test_evaluating_again_reuses_the_evals_and_decides_at_once(client_for, users, version, tmp_path) -> None:
    gate = _gate(client_for, version)
    checkpoint = checkpoint_for(owner=users["operator"], tmp_path=tmp_path)
    _gate_checkpoint(client_for, gate, checkpoint, ALL_PASS)
    again = _evaluate(client_for, gate, checkpoint)
    assert again.status_code == 200 and again.json()["status"] == "decided"
    assert Eval.objects.count() == 1 and GateDecision.objects.count() == 2


def test_bad_evaluate_requests_are_clear(client_for, users, version, tmp_path) -> None:
    gate = _gate(client_for, version)
    client = client_for("operator")
    url = f"/api/v1/gates/{gate.pk}/evaluate/"
    reply = client.post(url, {"checkpoint_uri": "file:///nowhere/ckpt.pt"}, format="json")
    assert reply.status_code == 400 and "no checkpoint is registered" in reply.json()["detail"]
    assert client.post(url, {}, format="json").status_code == 400
    other = coding_version(owner=users["admin"], name="other-bench")
    checkpoint = checkpoint_for(owner=users["operator"], tmp_path=tmp_path)
    reply = client.post(url, {"checkpoint": checkpoint.pk, "benchmark_versions": [other.pk]}, format="json")
    assert reply.status_code == 400 and "is not a benchmark of gate" in reply.json()["detail"]
    assert client_for("viewer").post(url, {"checkpoint": checkpoint.pk}, format="json").status_code == 403
    Gate.objects.filter(pk=gate.pk).update(rules=[])
    reply = client.post(url, {"checkpoint": checkpoint.pk}, format="json")
    assert reply.status_code == 400 and "has no rules" in reply.json()["detail"]
    assert not GateCheck.objects.exists() and not Eval.objects.exists()


def test_rollback_restores_the_previous_deployment_and_is_recorded(client_for, users, version, tmp_path) -> None:
    gate = _gate(client_for, version, requires_approval=False, rules=[{"type": "flag_rate", "max_rate": 1.0}])
    url = f"/api/v1/gates/{gate.pk}/rollback/"
    first = checkpoint_for(owner=users["operator"], tmp_path=tmp_path, step=1)
    _gate_checkpoint(client_for, gate, first, ALL_PASS)
    reply = client_for("approver").post(url, {}, format="json")
    assert reply.status_code == 400 and "nothing to roll back to" in reply.json()["detail"]
    second = checkpoint_for(owner=users["operator"], tmp_path=tmp_path, step=2)
    _gate_checkpoint(client_for, gate, second, ALL_PASS)
    assert Deployment.objects.get(is_current=True).checkpoint_id == second.pk
    assert client_for("operator").post(url, {}, format="json").status_code == 403
    reply = client_for("approver").post(url, {"note": "bad canary"}, format="json")
    assert reply.status_code == 201, reply.json()
    current = Deployment.objects.get(is_current=True)
    assert current.checkpoint_id == first.pk and current.rolled_back_from.checkpoint_id == second.pk
    assert current.note == "bad canary" and current.created_by == users["approver"]
    assert Deployment.objects.count() == 3  # history is kept: nothing rewritten
    again = client_for("approver").post(url, {}, format="json")
    assert again.status_code == 400 and "nothing to roll back to" in again.json()["detail"]  # not back to `second`


def test_decisions_and_deployments_are_announced_by_webhooks(client_for, users, version, tmp_path, settings) -> None:
    from apps.webhooks.models import WebhookDelivery
    from apps.webhooks.services import webhook_endpoint_create

    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]  # a receiver on this machine: off by default

    webhook_endpoint_create(name="ci", url="http://127.0.0.1:9/hook", events=["*"], created_by=users["admin"])
    gate = _gate(client_for, version)
    checkpoint = checkpoint_for(owner=users["operator"], tmp_path=tmp_path)
    check = _gate_checkpoint(client_for, gate, checkpoint, ALL_PASS)
    decision = GateDecision.objects.get(gate_check=check)
    client_for("approver").post(f"/api/v1/gate-decisions/{decision.pk}/approve/", {}, format="json")
    events = list(WebhookDelivery.objects.order_by("id").values_list("event", flat=True))
    assert events == ["gate.decision.created", "gate.decision.approved", "deployment.created"]
    payload = WebhookDelivery.objects.get(event="deployment.created").payload
    assert payload["checkpoint"] == checkpoint.pk and payload["gate"] == "ship"


def test_decisions_cannot_be_changed_over_the_api(client_for, users, version, tmp_path) -> None:
    gate = _gate(client_for, version)
    check = _gate_checkpoint(client_for, gate, checkpoint_for(owner=users["operator"], tmp_path=tmp_path), ALL_PASS)
    decision = GateDecision.objects.get(gate_check=check)
    for method in ("put", "patch", "delete"):
        reply = getattr(client_for("admin"), method)(f"/api/v1/gate-decisions/{decision.pk}/", {}, format="json")
        assert reply.status_code == 405


def test_a_decision_that_passed_without_approval_cannot_be_approved_or_rejected(client_for, users, version, tmp_path):  # type: ignore[no-untyped-def]
    gate = _gate(client_for, version, requires_approval=False)
    check = _gate_checkpoint(client_for, gate, checkpoint_for(owner=users["operator"], tmp_path=tmp_path), ALL_PASS)
    decision = GateDecision.objects.get(gate_check=check)
    for verb in ("approve", "reject"):
        reply = client_for("approver").post(f"/api/v1/gate-decisions/{decision.pk}/{verb}/", {}, format="json")
        assert reply.status_code == 400 and "without needing approval" in reply.json()["detail"]
    assert Deployment.objects.count() == 1


def test_a_decision_taken_against_an_older_deployment_is_not_deployed(client_for, users, version, tmp_path):  # type: ignore[no-untyped-def]
    gate = _gate(client_for, version)
    first = checkpoint_for(owner=users["operator"], tmp_path=tmp_path, step=1)
    second = checkpoint_for(owner=users["operator"], tmp_path=tmp_path, step=2)
    stale = GateDecision.objects.get(gate_check=_gate_checkpoint(client_for, gate, first, ALL_PASS))
    fresh = GateDecision.objects.get(gate_check=_gate_checkpoint(client_for, gate, second, ALL_PASS))
    assert client_for("approver").post(f"/api/v1/gate-decisions/{fresh.pk}/approve/", {}).status_code == 200
    reply = client_for("approver").post(f"/api/v1/gate-decisions/{stale.pk}/approve/", {}, format="json")
    assert reply.status_code == 400 and "evaluate the checkpoint again" in reply.json()["detail"]
    assert Deployment.objects.get(is_current=True).checkpoint_id == second.pk
    assert GateDecision.objects.get(pk=stale.pk).approval == ""  # nothing recorded


def test_flagged_eval_trajectories_fail_a_flag_rate_ceiling(client_for, users, version, tmp_path) -> None:
    from apps.review.models import Flag
    from apps.runs.models import TrajectorySummary

    rules = [
        {"type": "flag_rate", "detector": "malformed_tool_calls", "max_rate": 0.2},
        {"type": "flag_rate", "max_rate": 0.2},
        {"type": "flag_rate", "detector": "search_once_then_quit", "max_rate": 0.0},  # ran, raised nothing
        {"type": "flag_rate", "detector": "no-such-detector", "max_rate": 1.0},  # a typo: no evidence, fails
    ]
    gate = _gate(client_for, version, rules=rules, requires_approval=False)
    checkpoint = checkpoint_for(owner=users["operator"], tmp_path=tmp_path)
    check = GateCheck.objects.get(pk=_evaluate(client_for, gate, checkpoint).json()["id"])
    evaluation = check.candidate_evals.get()
    TrajectorySummary.objects.bulk_create(
        [
            TrajectorySummary(run=evaluation.run, trajectory_id=f"eval-1-{row['id']}-0", task_id=row["id"])
            for row in CODING_ROWS
        ]
    )
    for row in CODING_ROWS[:3]:  # 3 of 12 trajectories, one of them flagged by two detectors
        Flag.objects.create(
            run=evaluation.run,
            trajectory_ref=f"eval-1-{row['id']}-0",
            detector="malformed_tool_calls",
            detector_version="1",
        )
    Flag.objects.create(
        run=evaluation.run, trajectory_ref="eval-1-add-0-0", detector="length_blowup", detector_version="1"
    )
    finish_eval(evaluation, ALL_PASS)
    decision = GateDecision.objects.get(gate_check=check)
    outcomes = decision.evidence["outcomes"]
    assert [o["verdict"] for o in outcomes] == ["fail", "fail", "pass", "fail"]
    assert outcomes[0]["statistic"]["rate"] == pytest.approx(0.25) and outcomes[1]["statistic"][
        "rate"
    ] == pytest.approx(0.25)
    assert decision.evidence["flag_rates"]["trajectories"] == 12
    assert not Deployment.objects.exists()


def test_evaluating_while_a_check_waits_returns_that_check(client_for, users, version, tmp_path) -> None:
    gate = _gate(client_for, version)
    checkpoint = checkpoint_for(owner=users["operator"], tmp_path=tmp_path)
    first = _evaluate(client_for, gate, checkpoint).json()["id"]
    assert _evaluate(client_for, gate, checkpoint).json()["id"] == first
    assert GateCheck.objects.count() == 1 and Eval.objects.count() == 1


def test_missing_task_results_count_as_failures_not_as_a_smaller_benchmark(client_for, users, version, tmp_path):  # type: ignore[no-untyped-def]
    gate = _gate(client_for, version, requires_approval=False)
    checkpoint = checkpoint_for(owner=users["operator"], tmp_path=tmp_path)
    check = _gate_checkpoint(client_for, gate, checkpoint, {row["id"]: (1, 1) for row in CODING_ROWS[:4]})
    evaluation = check.candidate_evals.get()
    assert evaluation.metrics["missing_tasks"] == 8 and evaluation.metrics["pass@1"] == pytest.approx(4 / 12)
    assert GateDecision.objects.get(gate_check=check).verdict == "fail"  # pass@1 1/3 < 0.5


@pytest.mark.parametrize(
    ("extra", "field"),
    [({"eval_k": 0}, "eval_k"), ({"max_new_tokens": 10**6}, "max_new_tokens"), ({"name": ""}, "name")],
)
def test_bad_gate_settings_are_refused_at_creation(client_for, version, extra, field) -> None:
    body = {"name": "g", "benchmark_versions": [version.pk], "rules": [{"type": "approval"}], **extra}
    reply = client_for("admin").post("/api/v1/gates/", body, format="json")
    assert reply.status_code == 400 and field in reply.json()["fields"]


# --- a gate scores only repository tasks shown solvable (issue 36 section 3) ----------------------------------------

_PATCH = "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-X = 0\n+X = 1\n"


def _repo_task(task_id: str, *, unverified: bool = False) -> dict[str, object]:
    row: dict[str, object] = {
        "id": task_id,
        "instruction": "X should be 1. Fix it.",
        "repo": {"files": {"m.py": "X = 0\n"}},
        "hidden_tests": {
            "files": {"test_m.py": "from m import X\n\n\ndef test_x():\n    assert X == 1\n"},
            "fail_to_pass": ["test_m.py::test_x"],
        },
    }
    row.update({"reference_patch": None, "unverified": True} if unverified else {"reference_patch": _PATCH})
    return row


def _repo_version(users, *rows):  # type: ignore[no-untyped-def]
    from apps.benchmarks.models import Benchmark
    from apps.benchmarks.services import benchmark_create, benchmark_version_create

    benchmark = Benchmark.objects.filter(name="repo-bench").first() or benchmark_create(
        name="repo-bench", environment="coding_agent", owner=users["admin"]
    )
    made, _ = benchmark_version_create(benchmark=benchmark, tasks=list(rows), created_by=users["admin"])
    return made


def test_a_gate_refuses_a_benchmark_version_holding_unverified_repository_tasks(client_for, users) -> None:
    held = _repo_version(users, _repo_task("ok-1"), _repo_task("guess-1", unverified=True), _repo_task("ok-2"))
    body = {"name": "ship-repo", "benchmark_versions": [held.pk], "rules": [{"type": "approval"}]}
    reply = client_for("admin").post("/api/v1/gates/", body, format="json")
    assert reply.status_code == 400
    message = reply.json()["fields"]["benchmark_versions"][0]
    assert f"{held} holds 1 unverified task(s) of 3 (guess-1)" in message
    assert "reference patch" in message and "pin a version without them" in message
    assert not Gate.objects.exists()
    # A version of the same tasks, every one shown solvable, is accepted.
    clean = _repo_version(users, _repo_task("ok-1"), _repo_task("ok-2"))
    body["benchmark_versions"] = [clean.pk]
    assert client_for("admin").post("/api/v1/gates/", body, format="json").status_code == 201


def test_evaluating_a_gate_on_unverified_repository_tasks_is_refused(client_for, users, tmp_path) -> None:
    clean = _repo_version(users, _repo_task("ok-1"))
    body = {"name": "ship-repo", "benchmark_versions": [clean.pk], "rules": [{"type": "approval"}]}
    gate = Gate.objects.get(pk=client_for("admin").post("/api/v1/gates/", body, format="json").json()["id"])
    held = _repo_version(users, _repo_task("ok-1"), _repo_task("guess-1", unverified=True))
    checkpoint = checkpoint_for(owner=users["operator"], tmp_path=tmp_path)
    url = f"/api/v1/gates/{gate.pk}/evaluate/"
    reply = client_for("operator").post(
        url, {"checkpoint": checkpoint.pk, "benchmark_versions": [held.pk]}, format="json"
    )
    assert reply.status_code == 400 and "1 unverified task(s) of 2" in reply.json()["detail"]
    # A gate pinned to such a version before the check existed is refused when it is evaluated.
    gate.benchmark_versions.set([held])
    reply = client_for("operator").post(url, {"checkpoint": checkpoint.pk}, format="json")
    assert reply.status_code == 400 and "guess-1" in reply.json()["detail"]
    assert not GateCheck.objects.exists() and not Eval.objects.exists()
