"""POST /api/v1/sessions/{session_id}/feedback/: typed signals about the caller's session, once per event id,
within the window; who may post (the serve scope, a signed-in user, a simulate run's token) and every refusal."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.accounts.services import api_token_create
from apps.realtime.models import Feedback, Session
from apps.runs.models import Run
from apps.runs.services import ingest_token_for
from tests.apps.realtime.session_factories import ingest, serve_run, turn_event

pytestmark = pytest.mark.django_db


def _client(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.fixture
def served(users) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """A serving run with one session of the operator's serve token ("s-1", two turns) and one of nobody's."""
    operator = users["operator"]
    run = serve_run(operator)
    token, secret = api_token_create(user=operator, name="editor", scopes=["serve"])
    ingest(
        run,
        [
            turn_event("s-1", 0, token_id=token.pk),
            turn_event("s-1", 1, token_id=token.pk),
            turn_event("anon", 0),
        ],
    )
    return {
        "run": run,
        "secret": secret,
        "client": _client(secret),
        "session": Session.objects.get(client_session_id="s-1"),
    }


def post(client: APIClient, session_id: str, **body: Any) -> Any:
    return client.post(f"/api/v1/sessions/{session_id}/feedback/", body, format="json")


def test_feedback_is_stored_once_per_event_id_and_counted_on_the_session(served):
    client = served["client"]
    first = post(client, "s-1", event_id="e1", signal="edit_kept", turn_index=1)
    assert first.status_code == 201, first.content
    assert first.json()["duplicate"] is False and first.json()["session"] == served["session"].pk
    assert first.json()["session_id"] == "s-1" and first.json()["signal"] == "edit_kept"
    repeat = post(client, "s-1", event_id="e1", signal="edit_kept", turn_index=1)  # same event: nothing added
    assert repeat.status_code == 200 and repeat.json()["duplicate"] is True
    assert repeat.json()["signal"] == "edit_kept" and repeat.json()["id"] == first.json()["id"]
    assert post(client, "s-1", event_id="e2", signal="thumbs", value=-1).status_code == 201
    assert post(client, "s-1", event_id="e3", signal="tests_passed", value=0.75).status_code == 201
    assert post(client, "s-1", event_id="e4", signal="text", text="close, but the import is wrong").status_code == 201
    session = Session.objects.get(pk=served["session"].pk)
    assert session.feedback_counts == {"edit_kept": 1, "thumbs": 1, "tests_passed": 1, "text": 1}
    assert Feedback.objects.filter(session=session).count() == 4
    stored = Feedback.objects.get(event_id="e2")
    assert stored.value == -1.0 and stored.user == served["session"].user and stored.run is None


def test_an_event_id_repeated_with_another_signal_is_a_409_naming_both_and_changes_nothing(served):
    client = served["client"]
    assert post(client, "s-1", event_id="e1", signal="edit_kept", turn_index=1).status_code == 201
    conflict = post(client, "s-1", event_id="e1", signal="edit_reverted", turn_index=1)
    assert conflict.status_code == 409, conflict.content
    detail = conflict.json()["detail"]
    assert "'e1'" in detail and "'edit_kept'" in detail and "'edit_reverted'" in detail, detail
    other_value = post(client, "s-1", event_id="e2", signal="thumbs", value=1)
    assert other_value.status_code == 201
    flipped = post(client, "s-1", event_id="e2", signal="thumbs", value=-1)
    assert flipped.status_code == 409 and "value 1.0 stored, -1.0 posted" in flipped.json()["detail"]
    assert list(Feedback.objects.order_by("id").values_list("event_id", "signal", "value")) == [
        ("e1", "edit_kept", None),
        ("e2", "thumbs", 1.0),
    ]
    assert Session.objects.get(pk=served["session"].pk).feedback_counts == {"edit_kept": 1, "thumbs": 1}
    again = post(client, "s-1", event_id="e1", signal="edit_kept", turn_index=1)
    assert again.status_code == 200 and again.json()["duplicate"] is True


def test_feedback_about_a_turn_the_session_does_not_have_is_a_400_naming_the_field_and_its_turns(served):
    client = served["client"]
    response = post(client, "s-1", event_id="e1", signal="edit_kept", turn_index=99)
    assert response.status_code == 400, response.content
    message = str(response.json()["fields"]["turn_index"])
    assert "has 2 turns (turn_index 0 to 1)" in message and "no turn 99" in message, message
    assert response["Retry-After"] == "2"  # a turn just served is recorded a moment later
    assert post(client, "s-1", event_id="e2", signal="edit_kept", turn_index=2).status_code == 400
    assert not Feedback.objects.exists()
    assert Session.objects.get(pk=served["session"].pk).feedback_counts == {}
    assert post(client, "s-1", event_id="e3", signal="edit_kept", turn_index=1).status_code == 201
    assert post(client, "s-1", event_id="e4", signal="edit_kept").status_code == 201  # the whole session


def test_an_unknown_session_is_a_404_and_another_callers_session_is_unknown_too(served, users):
    response = post(served["client"], "never-seen", event_id="e1", signal="edit_kept")
    assert response.status_code == 404 and "never-seen" in response.json()["detail"]
    assert response["Retry-After"] == "2"
    assert post(served["client"], "anon", event_id="e1", signal="edit_kept").status_code == 404  # nobody's session
    _, admin_secret = api_token_create(user=users["admin"], name="admin-editor", scopes=["serve"])
    assert post(_client(admin_secret), "s-1", event_id="e1", signal="edit_kept").status_code == 404
    assert not Feedback.objects.exists()


def test_feedback_after_the_window_is_a_409_but_a_repeat_is_still_a_200(served, settings):
    client = served["client"]
    assert post(client, "s-1", event_id="early", signal="accepted").status_code == 201
    settings.FEEDBACK_WINDOW_HOURS = 1
    Session.objects.filter(pk=served["session"].pk).update(last_turn_at=timezone.now() - timedelta(hours=2))
    late = post(client, "s-1", event_id="late", signal="rejected")
    assert late.status_code == 409 and "CRUCIBLE_FEEDBACK_WINDOW_HOURS" in late.json()["detail"]
    assert post(client, "s-1", event_id="early", signal="accepted").status_code == 200
    assert list(Feedback.objects.values_list("event_id", flat=True)) == ["early"]


@pytest.mark.parametrize(
    "body, field, words",
    [
        ({"signal": "edit_kept"}, "event_id", "required"),
        ({"event_id": "", "signal": "edit_kept"}, "event_id", "at least 1 character"),
        ({"event_id": "x" * 201, "signal": "edit_kept"}, "event_id", "at most 200"),
        ({"event_id": "e", "signal": "liked_it"}, "signal", "edit_kept"),
        ({"event_id": "e", "signal": "thumbs"}, "value", "+1"),
        ({"event_id": "e", "signal": "thumbs", "value": 0.5}, "value", "+1"),
        ({"event_id": "e", "signal": "tests_failed", "value": 2}, "value", "[0, 1]"),
        ({"event_id": "e", "signal": "edit_kept", "value": 1}, "value", "carries no value"),
        ({"event_id": "e", "signal": "text"}, "text", "needs the text"),
        ({"event_id": "e", "signal": "edit_kept", "turn_index": -1}, "turn_index", "greater than or equal to 0"),
        ({"event_id": "e", "signal": "edit_kept", "mood": "grumpy"}, "mood", "not permitted"),
        ({"event_id": "e", "signal": "text", "text": "x" * 10_001}, "text", "at most 10000"),
    ],
)
def test_a_malformed_body_is_a_400_naming_the_field(served, body, field, words):
    response = served["client"].post("/api/v1/sessions/s-1/feedback/", body, format="json")
    assert response.status_code == 400, response.content
    fields = response.json()["fields"]
    assert field in fields and words in str(fields[field]), fields
    assert not Feedback.objects.exists()


def test_a_body_that_is_not_an_object_is_a_400(served):
    response = served["client"].post("/api/v1/sessions/s-1/feedback/", [1, 2], format="json")
    assert response.status_code == 400 and "body" in response.json()["fields"]


def test_without_the_serve_capability_it_is_a_403(served, users, client_for):
    _, read_only = api_token_create(user=users["operator"], name="ci-read", scopes=["read", "launch"])
    assert post(_client(read_only), "s-1", event_id="e", signal="edit_kept").status_code == 403
    assert post(client_for("viewer"), "s-1", event_id="e", signal="edit_kept").status_code == 403
    assert APIClient().post("/api/v1/sessions/s-1/feedback/", {}, format="json").status_code in (401, 403)
    assert post(_client("crk_not-a-token"), "s-1", event_id="e", signal="edit_kept").status_code == 401
    assert not Feedback.objects.exists()


def test_a_signed_in_user_posts_feedback_on_their_own_session(served, users):
    client = APIClient()
    client.force_authenticate(users["operator"])
    assert post(client, "s-1", event_id="from-the-page", signal="thumbs", value=1).status_code == 201


def _simulate_run(users, serve: Run) -> Run:  # type: ignore[no-untyped-def]
    """A simulate run row against `serve` (its launch is tested in test_launches)."""
    return Run.objects.create(
        kind="simulate", spec={"serve_run": serve.pk}, created_by=users["operator"], ingest_nonce="n0nce"
    )


def test_a_simulate_runs_token_posts_feedback_on_sessions_of_its_serving_run_only(served, users):
    simulate = _simulate_run(users, served["run"])
    client = _client(ingest_token_for(simulate))
    response = post(client, "anon", event_id="sim-1", signal="dissatisfied_followup")
    assert response.status_code == 201, response.content
    stored = Feedback.objects.get(event_id="sim-1")
    assert stored.run == simulate and stored.user is None
    other = serve_run(users["operator"])
    ingest(other, [turn_event("elsewhere", 0)])
    assert post(client, "elsewhere", event_id="sim-2", signal="edit_kept").status_code == 404
    # Another run's token, a bad token, a run that is not a simulate run, an ended run: refused.
    assert post(_client(ingest_token_for(served["run"])), "anon", event_id="x", signal="accepted").status_code == 401
    assert post(_client(f"cri_{simulate.pk}_bad"), "anon", event_id="x", signal="accepted").status_code == 401
    Run.objects.filter(pk=simulate.pk).update(status="succeeded")
    ended = post(client, "anon", event_id="sim-3", signal="edit_kept")
    assert ended.status_code == 401 and "ended" in ended.json()["detail"]
