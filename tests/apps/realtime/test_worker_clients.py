"""The workers' own clients against the real control plane (a live server): the serving job's target poll and key
verifier (workers.serving.control) and the simulator's feedback poster (workers.simulator.feedback) speak the
same wire format as apps.realtime's endpoints."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from apps.accounts.services import api_token_create
from apps.realtime.models import Feedback
from apps.runs.models import Run
from apps.runs.services import ingest_token_for
from tests.apps.realtime.session_factories import ingest, serve_run, turn_event
from workers.serving.control import KeyVerifier, fetch_target
from workers.serving.openai_request import APIError
from workers.session_records import FeedbackIn
from workers.simulator.feedback import FeedbackFailed, FeedbackPoster, FeedbackRefused

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_serving_jobs_target_poll_and_key_verifier_understand_the_control_plane(
    live_server, users, gate_with_deployment
):
    run = serve_run(users["operator"], gate=gate_with_deployment["gate"], base_model="")
    control_url = f"{live_server.url}/api/v1/serving/{run.pk}/"
    token = ingest_token_for(run)
    with httpx.Client(timeout=10) as client:
        target = fetch_target(client, control_url, token)
        assert [arm.policy_version for arm in target.arms] == [gate_with_deployment["deployment"].checkpoint_id]
        with pytest.raises(ValueError, match="403"):
            fetch_target(client, control_url, "cri_1_nope")

    _, serve_key = api_token_create(user=users["operator"], name="editor", scopes=["serve"])
    _, read_key = api_token_create(user=users["operator"], name="reader", scopes=["read"])

    async def check() -> None:
        verifier = KeyVerifier(control_url, token, ttl=30)
        try:
            caller = await verifier.verify(f"Bearer {serve_key}")
            assert caller.user == users["operator"].username and caller.token_id is not None
            with pytest.raises(APIError) as refused:
                await verifier.verify(f"Bearer {read_key}")
            assert refused.value.status == 403
        finally:
            await verifier.aclose()

    asyncio.run(check())


def test_the_simulators_feedback_poster_gets_created_then_duplicate_and_stops_on_a_refused_token(live_server, users):
    serving = serve_run(users["operator"])
    ingest(serving, [turn_event("sim/1", 0)])  # a session id with a slash travels quoted
    simulate = Run.objects.create(
        kind="simulate", spec={"serve_run": serving.pk}, created_by=users["operator"], ingest_nonce="n"
    )
    poster = FeedbackPoster(f"{live_server.url}/api/v1/", ingest_token_for(simulate), wait_seconds=0.5)
    event = FeedbackIn(event_id="e1", signal="tests_passed", value=1.0)
    try:
        assert poster.post("sim/1", event) == "created"
        assert poster.post("sim/1", event) == "duplicate"
        with pytest.raises(FeedbackFailed, match="404"):
            poster.post("never-recorded", FeedbackIn(event_id="e2", signal="edit_kept"))
    finally:
        poster.close()
    assert Feedback.objects.get().run == simulate
    refused = FeedbackPoster(f"{live_server.url}/api/v1/", "cri_1_forged", wait_seconds=0.5)
    try:
        with pytest.raises(FeedbackRefused):
            refused.post("sim/1", FeedbackIn(event_id="e3", signal="edit_kept"))
    finally:
        refused.close()
