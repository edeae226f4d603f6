"""session_turn events from a serving job become sessions and turns exactly once, with the right roll-ups."""

from __future__ import annotations

import time

import pytest
from rest_framework.test import APIClient

from apps.accounts.services import api_token_create
from apps.realtime.models import Session, SessionTurn
from apps.runs import services
from apps.runs.models import Run, RunEvent
from tests.apps.realtime.session_factories import ingest, serve_run, turn_event

pytestmark = pytest.mark.django_db


def test_turns_make_one_session_with_its_roll_ups_and_a_repeat_adds_nothing(users):
    run = serve_run(users["operator"])
    token, _ = api_token_create(user=users["operator"], name="client", scopes=["serve"])
    t0 = time.time() - 60
    events = [
        turn_event("s-1", 0, policy_version=0, created_at=t0, task_type="repair", token_id=token.pk, latency_ms=120),
        turn_event("s-1", 1, policy_version=7, created_at=t0 + 10, completion=[9, 9], latency_ms=80),
        turn_event("s-2", 0, created_at=t0 + 5, arm="b"),
    ]
    result = ingest(run, events)
    assert result.accepted == 3
    again = [{**event, "seq": event["seq"] + 1000} for event in events]  # a replayed spool: new seqs, same requests
    assert ingest(run, again).accepted == 3
    assert SessionTurn.objects.filter(serve_run=run).count() == 3
    first = Session.objects.get(serve_run=run, client_session_id="s-1")
    assert (first.num_turns, first.prompt_tokens, first.completion_tokens) == (2, 8, 5)
    assert (first.first_policy_version, first.last_policy_version) == (0, 7)
    assert first.user == users["operator"] and first.token == token and first.task_type == "repair"
    assert first.started_at.timestamp() == pytest.approx(t0) and first.last_turn_at.timestamp() == pytest.approx(
        t0 + 10
    )
    second = Session.objects.get(serve_run=run, client_session_id="s-2")
    assert second.arm == "b" and second.user is None and second.num_turns == 1
    turn = SessionTurn.objects.get(request_id="chatcmpl-s-1-1")
    assert turn.logprobs == [-0.5, -0.5] and turn.completion_token_ids == [9, 9] and turn.latency_ms == 80
    assert RunEvent.objects.filter(run=run, kind="session_turn").count() == 6  # the ledger keeps every event


def test_turns_arriving_out_of_order_still_give_the_first_and_last(users, gate_with_deployment):
    run = serve_run(users["operator"])
    deployment = gate_with_deployment["deployment"]
    t0 = time.time() - 30
    ingest(run, [turn_event("s", 2, policy_version=9, created_at=t0 + 20)])
    ingest(run, [turn_event("s", 0, policy_version=3, created_at=t0, deployment_id=deployment.pk, arm="a")])
    ingest(run, [turn_event("s", 1, policy_version=3, created_at=t0 + 10, deployment_id=999_999)])
    session = Session.objects.get(serve_run=run)
    assert (session.first_policy_version, session.last_policy_version, session.num_turns) == (3, 9, 3)
    assert session.deployment == deployment and session.arm == "a"
    assert session.started_at.timestamp() == pytest.approx(t0)
    # A deployment id the control plane does not know keeps the turn and its policy version, not the link.
    assert SessionTurn.objects.get(turn_index=1).deployment is None


def test_one_client_session_id_on_two_serving_runs_is_two_sessions(users):
    first, second = serve_run(users["operator"]), serve_run(users["operator"])
    ingest(first, [turn_event("same", 0, request_id="r-1")])
    ingest(second, [turn_event("same", 0, request_id="r-1")])
    assert Session.objects.filter(client_session_id="same").count() == 2
    assert SessionTurn.objects.count() == 2


def test_a_run_of_another_kind_makes_no_session(users, run):
    ingest(run, [turn_event("s", 0)])
    assert not Session.objects.exists() and RunEvent.objects.filter(run=run, kind="session_turn").count() == 1


@pytest.mark.django_db(transaction=True)
def test_through_the_ingest_endpoint_a_malformed_turn_is_a_400_naming_the_field(users):
    run = serve_run(users["operator"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {services.ingest_token_for(run)}")
    url = f"/api/v1/runs/{run.pk}/ingest/"
    bad = turn_event("s", 0, seq=1)
    bad["turn"]["logprobs"] = [-0.1]  # three completion tokens, one log-probability
    response = client.post(url, {"events": [bad]}, format="json")
    assert response.status_code == 400 and "events.0.session_turn.turn" in response.json()["fields"], response.json()
    good = turn_event("s", 0, seq=1)
    assert client.post(url, {"events": [good]}, format="json").json()["accepted"] == 1
    assert client.post(url, {"events": [good]}, format="json").json()["duplicates"] == 1
    assert Session.objects.get(serve_run=run).num_turns == 1
    assert Run.objects.get(pk=run.pk).status == "running"
