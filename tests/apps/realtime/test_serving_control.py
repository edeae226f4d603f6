"""The serving job's control endpoints: the target it serves (a gate's deployment, a checkpoint, the base model, an
A/B split) and the verification of its clients' keys, both opened only by the serving run's own token."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.accounts.services import api_token_create
from apps.gates.models import Deployment
from apps.realtime.selectors import serve_target
from apps.realtime.services.serving import serve_split_update
from apps.runs.models import Run
from apps.runs.services import ingest_token_for
from tests.apps.realtime.session_factories import serve_run

# The control views run their queries in another thread (as the ingest view does): the rows must be committed.
pytestmark = pytest.mark.django_db(transaction=True)


def _client(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def test_the_target_follows_the_gates_deployment_and_the_ab_split(users, gate_with_deployment):
    world = gate_with_deployment
    run = serve_run(users["operator"], gate=world["gate"], base_model="")
    client = _client(ingest_token_for(run))
    url = f"/api/v1/serving/{run.pk}/target/"
    first = client.get(url)
    assert first.status_code == 200, first.content
    body = first.json()
    current = world["deployment"]
    assert body["model_name"] == "crucible-tiny" and len(body["revision"]) == 16
    assert body["arms"] == [
        {
            "name": "a",
            "weight": 1.0,
            "deployment_id": current.pk,
            "checkpoint_id": current.checkpoint_id,
            "checkpoint_uri": current.checkpoint.uri,
        }
    ]
    assert client.get(url).json()["revision"] == body["revision"]  # nothing changed, same revision

    serve_split_update(run=run, ab={"deployment": world["old_deployment"].pk, "share": 0.25})
    split = client.get(url).json()
    assert split["revision"] != body["revision"]
    assert [(a["name"], a["weight"], a["deployment_id"]) for a in split["arms"]] == [
        ("a", 0.75, current.pk),
        ("b", 0.25, world["old_deployment"].pk),
    ]

    # A new deployment of the gate: arm a serves it at the next poll, under a new revision.
    Deployment.objects.filter(pk=current.pk).update(is_current=False, ended_at=timezone.now())
    newer = Deployment.objects.create(gate=world["gate"], checkpoint=world["checkpoints"][0], created_by=users["admin"])
    swapped = client.get(url).json()
    assert swapped["arms"][0]["deployment_id"] == newer.pk and swapped["revision"] != split["revision"]


def test_the_control_endpoints_refuse_other_tokens_and_unknown_runs(users, run):
    serving = serve_run(users["operator"])
    url = f"/api/v1/serving/{serving.pk}/"
    assert APIClient().get(url + "target/").status_code == 401
    assert APIClient().post(url + "keys/verify/", {"key": "k"}, format="json").status_code == 401
    other = _client(ingest_token_for(run))  # a real run token, of another run
    assert other.get(url + "target/").status_code == 403
    assert other.post(url + "keys/verify/", {"key": "k"}, format="json").status_code == 403
    _, user_token = api_token_create(user=users["admin"], name="admin-all", scopes=["read", "serve"])
    assert _client(user_token).get(url + "target/").status_code == 403  # a user's API token opens nothing here
    own = _client(ingest_token_for(serving))
    assert own.get("/api/v1/serving/999999/target/").status_code == 404
    assert _client(ingest_token_for(run)).get(f"/api/v1/serving/{run.pk}/target/").status_code == 404  # not serve
    assert own.post(url + "target/").status_code == 405
    bad = own.post(url + "keys/verify/", {"token": "k"}, format="json")
    assert bad.status_code == 400 and "key" in bad.json()["detail"]
    assert own.post(url + "keys/verify/", b"{not json", content_type="application/json").status_code == 400


def test_keys_are_verified_by_scope_and_a_simulate_run_only_for_its_serving_run(users):
    serving = serve_run(users["operator"])
    own = _client(ingest_token_for(serving))
    url = f"/api/v1/serving/{serving.pk}/keys/verify/"

    def verify(key: str) -> dict:  # type: ignore[type-arg]
        response = own.post(url, {"key": key}, format="json")
        assert response.status_code == 200, response.content
        return response.json()  # type: ignore[no-any-return]

    token, secret = api_token_create(user=users["operator"], name="editor", scopes=["serve"])
    assert verify(secret) == {"valid": True, "token_id": token.pk, "user": users["operator"].username}
    _, no_scope = api_token_create(user=users["operator"], name="ci", scopes=["read", "launch"])
    assert verify(no_scope)["status"] == 403 and "serve" in verify(no_scope)["reason"]
    assert verify("crk_made-up") == {"valid": False, "status": 401, "reason": "invalid or revoked API key"}
    assert verify("sk-anything")["status"] == 401
    token.expires_at = timezone.now() - timedelta(minutes=1)
    token.save(update_fields=["expires_at"])
    assert verify(secret)["status"] == 401

    simulate = Run.objects.create(
        kind="simulate", spec={"serve_run": serving.pk}, created_by=users["operator"], ingest_nonce="n1"
    )
    assert verify(ingest_token_for(simulate)) == {"valid": True, "token_id": None, "user": users["operator"].username}
    elsewhere = Run.objects.create(
        kind="simulate", spec={"serve_run": 424242}, created_by=users["operator"], ingest_nonce="n2"
    )
    assert verify(ingest_token_for(elsewhere))["status"] == 403
    assert verify(ingest_token_for(serving))["status"] == 401  # the serving run's own token is no client key
    Run.objects.filter(pk=simulate.pk).update(status="stopped")
    assert verify(ingest_token_for(simulate))["status"] == 401


def test_a_fixed_checkpoint_or_the_base_model_is_one_arm_and_another_base_model_is_left_out(users, tmp_path):
    from tests.factories import checkpoint_for

    checkpoint = checkpoint_for(owner=users["admin"], tmp_path=tmp_path)
    fixed = serve_run(users["operator"], checkpoint=checkpoint, base_model="")
    assert serve_target(fixed)["arms"] == [
        {
            "name": "a",
            "weight": 1.0,
            "deployment_id": None,
            "checkpoint_id": checkpoint.pk,
            "checkpoint_uri": checkpoint.uri,
        }
    ]
    base = serve_run(users["operator"])
    assert serve_target(base)["arms"] == [
        {"name": "a", "weight": 1.0, "deployment_id": None, "checkpoint_id": None, "checkpoint_uri": None}
    ]
    # The checkpoint's run now says another base model: it cannot be swapped onto these weights, so it is not served.
    Run.objects.filter(pk=checkpoint.run_id).update(spec={"config": {"base_model": "smollm2-135m-instruct"}})
    assert serve_target(fixed)["arms"] == []
