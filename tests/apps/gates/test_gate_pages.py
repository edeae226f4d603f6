"""Benchmark, eval and gate pages: who may see and do what, and that the evidence is on the page."""

from __future__ import annotations

import pytest
from django.utils.html import escape

from apps.accounts.models import Role
from apps.gates.models import Deployment, GateDecision
from tests.apps.gates.test_gates import ALL_PASS, _gate, _gate_checkpoint
from tests.factories import CODING_ROWS, checkpoint_for, coding_version

pytestmark = pytest.mark.django_db


@pytest.fixture
def decided(client_for, users, tmp_path):  # type: ignore[no-untyped-def]
    version = coding_version(owner=users["admin"])
    gate = _gate(client_for, version)
    checkpoint = checkpoint_for(owner=users["operator"], tmp_path=tmp_path)
    check = _gate_checkpoint(client_for, gate, checkpoint, ALL_PASS)
    return {"gate": gate, "decision": GateDecision.objects.get(gate_check=check), "check": check, "version": version}


@pytest.mark.parametrize("role", Role.values)
def test_every_role_reads_benchmarks_evals_gates_and_decisions(client, users, decided, role) -> None:
    evaluation = decided["check"].candidate_evals.get()
    pages = [
        "/benchmarks/",
        f"/benchmarks/versions/{decided['version'].pk}/",
        f"/benchmarks/evals/{evaluation.pk}/",
        f"/benchmarks/evals/{evaluation.pk}/results/",
        f"/benchmarks/evals/compare/?before={evaluation.pk}&after={evaluation.pk}",
        "/gates/",
        "/gates/deployments/",
        f"/gates/{decided['gate'].pk}/",
        f"/gates/decisions/{decided['decision'].pk}/",
    ]
    for page in pages:
        assert client.get(page).status_code == 302  # to the login page
    client.force_login(users[role])
    for page in pages:
        assert client.get(page).status_code == 200, page


def test_the_decision_page_shows_each_rule_with_its_reason_and_the_evals(client, users, decided) -> None:
    client.force_login(users["viewer"])
    html = client.get(f"/gates/decisions/{decided['decision'].pk}/").content.decode()
    for outcome in decided["decision"].evidence["outcomes"]:
        assert escape(outcome["message"]) in html
    assert f"eval {decided['check'].candidate_evals.get().pk}" in html
    assert 'id="approve"' not in html  # a viewer gets no buttons
    client.force_login(users["approver"])
    assert 'id="approve"' in client.get(f"/gates/decisions/{decided['decision'].pk}/").content.decode()


def test_an_approver_approves_in_the_browser_and_the_checkpoint_is_deployed(client, users, decided) -> None:
    url = f"/gates/decisions/{decided['decision'].pk}/judge/"
    client.force_login(users["operator"])
    assert client.post(url, {"action": "approve"}).status_code == 403
    assert not Deployment.objects.exists()
    client.force_login(users["approver"])
    reply = client.post(url, {"action": "approve", "note": "ship it"}, follow=True)
    assert reply.status_code == 200 and "Approved" in reply.content.decode()
    deployment = Deployment.objects.get(is_current=True)
    assert deployment.checkpoint_id == decided["decision"].checkpoint_id
    again = client.post(url, {"action": "reject"}, follow=True)
    assert "already approved" in again.content.decode()
    html = client.get(f"/gates/{decided['gate'].pk}/").content.decode()
    assert "Roll back" in html and "current" in html


def test_an_approved_decision_tells_one_story_and_rules_read_as_words(client, users, decided) -> None:
    """After the approval the title, the summary line and the approval rule's row agree (the stored evidence was
    written while that row was pending); rules read as sentences, never as a Python dict."""
    url = f"/gates/decisions/{decided['decision'].pk}/"
    client.force_login(users["approver"])
    before = client.get(url).content.decode()
    assert "approval: <strong>waiting</strong>" in before and "waiting for a human" in before  # stored while pending
    assert 'data-verdict="pending"' in before
    assert "verdict: <strong>pending</strong> (waiting for the approval)" in before
    client.post(f"{url}judge/", {"action": "approve"})
    html = client.get(url).content.decode()
    rules = html[html.index("<h2>Rules</h2>") : html.index("</section>", html.index("<h2>Rules</h2>"))]
    assert "waiting for a human" not in rules and f"approval: <strong>approved</strong> by {users['approver']}" in html
    # One verdict, its stages as steps: the checks passed, then the approval, then the verdict.
    stages = html[html.index('id="decision-stages"') : html.index("</ol>", html.index('id="decision-stages"'))]
    assert 'data-verdict="pass"' in stages and "automatic checks: <strong>pass</strong>" in stages
    assert "verdict: <strong>pass</strong>" in stages and "pending" not in html.split("Rules</h2>")[0]
    assert f"approved by {users['approver']}" in rules
    assert "automated verdict" not in html and "{&#x27;" not in html and "{'" not in html
    assert "a human with the approver permission approves" in html
    gate_page = client.get(f"/gates/{decided['gate'].pk}/").content.decode()
    assert "a human with the approver permission approves" in gate_page and "{&#x27;" not in gate_page


def test_an_admin_creates_a_gate_in_the_browser_and_a_bad_rule_is_shown(client, users) -> None:
    version = coding_version(owner=users["admin"], rows=CODING_ROWS[:2])
    client.force_login(users["admin"])
    bad = client.post("/gates/", {"name": "g", "rules": "[{}]", "benchmark_versions": [version.pk]})
    assert bad.status_code == 200 and "rules[0]" in bad.content.decode()
    rules = '[{"type": "threshold", "benchmark": "mini-coding", "value": 0.1}]'
    good = client.post("/gates/", {"name": "g", "rules": rules, "benchmark_versions": [version.pk]})
    assert good.status_code == 302
    client.force_login(users["operator"])
    assert client.post("/gates/", {"name": "h", "rules": rules, "benchmark_versions": [version.pk]}).status_code == 403


def test_an_eval_trajectory_page_shows_how_the_sandbox_run_ended(client, users) -> None:
    import json

    from django.core.files.base import ContentFile
    from django.core.files.storage import default_storage

    from apps.runs.models import Run, TrajectorySummary
    from apps.runs.storage import storage_uri
    from workers.benchmarks.humaneval import humaneval_rows
    from workers.envs.coding import CodingEnv
    from workers.envs.registry import make_env

    row = humaneval_rows(1)[0]
    env = make_env("coding", timeout_seconds=2.0)
    env.reset(CodingEnv.validate_task_row(row))
    env.step("```python\ndef has_close_elements(numbers, threshold):\n    return 1 / 0\n```")
    record = env.trajectory("eval-1-x")
    # The page reads only files inside this control plane's storage, where eval jobs write their shards.
    name = default_storage.save("tests/eval/trajectories-00001.jsonl", ContentFile(json.dumps(record) + "\n"))
    run = Run.objects.create(kind="eval", spec={}, created_by=users["operator"])
    TrajectorySummary.objects.create(
        run=run, trajectory_id="eval-1-x", task_id=row["id"], reward=0.0, storage_uri=storage_uri(name)
    )
    client.force_login(users["viewer"])
    html = client.get(f"/runs/{run.pk}/trajectories/eval-1-x/").content.decode()
    default_storage.delete(name)
    assert 'id="sandbox"' in html and "ZeroDivisionError" in html and "landlock" in html


def test_a_judge_post_without_an_action_changes_nothing(client, users, decided) -> None:
    client.force_login(users["approver"])
    reply = client.post(f"/gates/decisions/{decided['decision'].pk}/judge/", {}, follow=True)
    assert "choose approve or reject" in reply.content.decode()
    assert GateDecision.objects.get(pk=decided["decision"].pk).approval == ""
    client.force_login(users["operator"])
    reply = client.post(f"/gates/{decided['gate'].pk}/evaluate/", {"checkpoint": "abc"}, follow=True)
    assert reply.status_code == 200 and "pick a registered checkpoint" in reply.content.decode()


def test_the_deployments_page_lists_every_deployment_with_its_state(client, users, decided) -> None:
    client.force_login(users["approver"])
    client.post(f"/gates/decisions/{decided['decision'].pk}/judge/", {"action": "approve"})
    html = client.get("/gates/deployments/").content.decode()
    assert "current" in html and f"decision {decided['decision'].pk}" in html and decided["gate"].name in html
