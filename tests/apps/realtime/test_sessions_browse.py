"""Reading sessions: the list with its filters, one session with its turns and feedback, serving runs; and the
pages (the session browser, a session as a chat, a serving run's panel), each for any role, refusing anonymous."""

from __future__ import annotations

import time

import pytest
from rest_framework.test import APIClient

from apps.accounts.models import Role
from apps.realtime.models import Session
from apps.realtime.services.sessions import feedback_create
from tests.apps.realtime.session_factories import ingest, serve_run, turn_event
from workers.session_records import FeedbackIn

pytestmark = pytest.mark.django_db


@pytest.fixture
def recorded(users, gate_with_deployment):  # type: ignore[no-untyped-def]
    run = serve_run(users["operator"])
    deployment = gate_with_deployment["deployment"]
    now = time.time()
    call = [{"id": "c1", "type": "function", "function": {"name": "run", "arguments": '{"command": "pytest -q"}'}}]
    ingest(
        run,
        [
            turn_event(
                "alpha",
                0,
                policy_version=deployment.checkpoint_id,
                deployment_id=deployment.pk,
                arm="a",
                created_at=now - 100,
                tool_calls=call,
                content="",
                task_type="repair",
            ),
            turn_event(
                "alpha",
                1,
                policy_version=deployment.checkpoint_id,
                deployment_id=deployment.pk,
                arm="a",
                created_at=now - 90,
                content="All tests pass now.",
            ),
            turn_event("beta", 0, created_at=now - 50, arm="b"),
        ],
    )
    alpha = Session.objects.get(client_session_id="alpha")
    feedback_create(session=alpha, body=FeedbackIn(event_id="e1", signal="edit_kept", turn_index=1))
    return {"run": run, "alpha": alpha, "beta": Session.objects.get(client_session_id="beta"), "deployment": deployment}


def test_the_sessions_list_filters_and_pages(client_for, recorded):
    client = client_for("viewer")
    listed = client.get("/api/v1/sessions/").json()
    assert listed["count"] == 2 and [s["session_id"] for s in listed["results"]] == ["beta", "alpha"]
    alpha = listed["results"][1]
    assert alpha["feedback_counts"] == {"edit_kept": 1} and alpha["gate"] == "rt-gate" and alpha["num_turns"] == 2

    def ids(**query):  # type: ignore[no-untyped-def]
        response = client.get("/api/v1/sessions/", query)
        assert response.status_code == 200, response.content
        return [s["session_id"] for s in response.json()["results"]]

    assert ids(has_feedback="1") == ["alpha"] and ids(has_feedback="false") == ["beta"]
    assert ids(deployment=recorded["deployment"].pk) == ["alpha"]
    assert ids(policy_version=recorded["deployment"].checkpoint_id) == ["alpha"] and ids(policy_version=0) == ["beta"]
    assert ids(serve_run=recorded["run"].pk, arm="b") == ["beta"]
    assert ids(since="2000-01-01T00:00:00Z", until="2000-01-02T00:00:00Z") == []
    assert ids(task_type="repair", session_id="alpha") == ["alpha"]
    for bad in (
        {"serve_run": "x"},
        {"has_feedback": "maybe"},
        {"since": "soon"},
        {"policy_version": -1},
        {"since": "2001-01-02T00:00:00Z", "until": "2001-01-01T00:00:00Z"},
    ):
        response = client.get("/api/v1/sessions/", bad)
        assert response.status_code == 400 and set(response.json()["fields"]) & {*bad, "until"}, (bad, response.json())


def test_a_session_reads_with_its_turns_in_order_and_its_feedback(client_for, recorded):
    response = client_for("viewer").get(f"/api/v1/sessions/{recorded['alpha'].pk}/")
    assert response.status_code == 200
    body = response.json()
    assert [t["turn_index"] for t in body["turns"]] == [0, 1]
    assert body["turns"][0]["response"]["tool_calls"][0]["function"]["name"] == "run"
    assert body["turns"][0]["logprobs"] == [-0.5, -0.5, -0.5] and body["turns"][1]["latency_ms"] == 100.0
    assert [(f["event_id"], f["signal"], f["turn_index"]) for f in body["feedback"]] == [("e1", "edit_kept", 1)]
    assert client_for("viewer").get("/api/v1/sessions/999999/").status_code == 404


def test_serving_runs_list_with_their_endpoint_and_target(client_for, recorded):
    run = recorded["run"]
    listed = client_for("viewer").get("/api/v1/serving/").json()
    assert [item["run"]["id"] for item in listed["results"]] == [run.pk]
    one = client_for("viewer").get(f"/api/v1/serving/{run.pk}/").json()
    assert one["endpoint"] == f"http://127.0.0.1:8100/serve/{run.pk}/v1" and one["sessions"] == 2
    assert one["target"]["arms"][0]["checkpoint_id"] is None
    assert client_for("viewer").get(f"/api/v1/serving/{recorded['deployment'].checkpoint.run_id}/").status_code == 404


def test_the_split_is_changed_by_a_launcher_only(client_for, recorded, gate_with_deployment):
    url = f"/api/v1/serving/{recorded['run'].pk}/split/"
    old = gate_with_deployment["old_deployment"].pk
    assert client_for("viewer").put(url, {"deployment": old, "share": 0.2}, format="json").status_code == 403
    changed = client_for("operator").put(url, {"deployment": old, "share": 0.2}, format="json")
    assert changed.status_code == 200, changed.content
    assert [(a["name"], a["weight"]) for a in changed.json()["target"]["arms"]] == [("a", 0.8), ("b", 0.2)]
    bad = client_for("operator").put(url, {"deployment": 999_999}, format="json")
    assert bad.status_code == 400 and "ab.deployment" in bad.json()["fields"]
    ended = client_for("operator").put(url, {"deployment": None}, format="json")
    assert len(ended.json()["target"]["arms"]) == 1


@pytest.mark.parametrize("role", Role.values)
def test_the_pages_show_sessions_and_serving_to_every_role(client, users, recorded, role):
    client.force_login(users[role])
    browser = client.get("/sessions/")
    assert browser.status_code == 200
    page = browser.content.decode()
    assert "alpha" in page and "beta" in page and "edit_kept" in page
    filtered = client.get("/sessions/", {"has_feedback": "0", "since": "2000-01-01"}, HTTP_HX_REQUEST="true")
    assert filtered.status_code == 200 and "beta" in filtered.content.decode()
    assert "alpha" not in filtered.content.decode() and "<html" not in filtered.content.decode()
    assert "policy_version" in client.get("/sessions/", {"policy_version": "x"}).content.decode()  # named error
    session = client.get(f"/sessions/{recorded['alpha'].pk}/").content.decode()
    assert "Turn 0" in session and "Turn 1" in session and "pytest -q" in session and "All tests pass now." in session
    assert "edit_kept" in session and "policy v" in session
    assert client.get("/sessions/999999/").status_code == 404
    panel = client.get(f"/serving/{recorded['run'].pk}/").content.decode()
    assert f"/serve/{recorded['run'].pk}/v1" in panel and 'id="ab"' in panel and "alpha" in panel
    assert ("A/B split</h2>" in panel) == (role in (Role.OPERATOR, Role.ADMIN))
    assert client.get("/serving/").status_code == 200


def test_anonymous_readers_are_refused(client, recorded):
    assert client.get("/sessions/").status_code == 302
    assert APIClient().get("/api/v1/sessions/").status_code in (401, 403)
    assert APIClient().get(f"/api/v1/serving/{recorded['run'].pk}/ab/").status_code in (401, 403)


def test_the_admin_lists_and_opens_sessions(client, recorded):
    from apps.accounts.models import User

    client.force_login(User.objects.create_superuser("root", password="pw-123456"))
    assert client.get("/admin/realtime/session/").status_code == 200
    assert client.get(f"/admin/realtime/session/{recorded['alpha'].pk}/change/").status_code == 200
    assert client.get("/admin/realtime/feedback/").status_code == 200
    assert client.get("/admin/realtime/sessionturn/").status_code == 200
