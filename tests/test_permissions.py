"""The permission matrix: every API endpoint against every role, plus anonymous access."""

from __future__ import annotations

import uuid

import pytest
from rest_framework.test import APIClient

from apps.accounts.models import Role
from tests.factories import context1_version, trajectories_version

pytestmark = pytest.mark.django_db

READ_ENDPOINTS = [
    "/api/v1/me/",
    "/api/v1/tokens/",
    "/api/v1/datasets/",
    "/api/v1/dataset-versions/",
    "/api/v1/reward-configs/",
    "/api/v1/reward-versions/",
    "/api/v1/runs/",
    "/api/v1/benchmarks/",
    "/api/v1/benchmark-versions/",
    "/api/v1/gates/",
    "/api/v1/gate-decisions/",
    "/api/v1/gate-checks/",
    "/api/v1/evals/",
    "/api/v1/deployments/",
    "/api/v1/flags/",
    "/api/v1/review-queues/",
    "/api/v1/review-items/",
    "/api/v1/reward-drafts/",
    "/api/v1/review-actions/",
    "/api/v1/task-exclusions/",
    "/api/v1/search-indexes/",
    "/api/v1/datagen/",
    "/api/v1/schema/",
]
ADMIN_READ_ENDPOINTS = ["/api/v1/users/", "/api/v1/webhooks/", "/api/v1/webhook-deliveries/"]

# (method, path, body, roles allowed)
WRITE_ENDPOINTS = [
    ("post", "/api/v1/datasets/", {"name": "d-{role}", "kind": "tasks"}, {Role.OPERATOR, Role.ADMIN}),
    ("post", "/api/v1/reward-configs/", {"name": "r-{role}", "spec": "SPEC"}, {Role.OPERATOR, Role.ADMIN}),
    ("post", "/api/v1/runs/", "LAUNCH", {Role.OPERATOR, Role.ADMIN}),
    (
        "post",
        "/api/v1/gates/",
        {
            "name": "g-{role}",
            "benchmark_versions": "BV",
            "rules": [{"type": "threshold", "benchmark": "bench", "value": 0}],
        },
        {Role.ADMIN},
    ),
    ("post", "/api/v1/benchmarks/", {"name": "b-{role}", "environment": "coding"}, {Role.OPERATOR, Role.ADMIN}),
    ("post", "/api/v1/benchmarks/{benchmark}/versions/", {"tasks": "TASKS"}, {Role.OPERATOR, Role.ADMIN}),
    (
        "post",
        "/api/v1/evals/",
        {"benchmark_version": "BV1", "base_model": "tiny-llama-smollm2-tokenizer"},
        {Role.OPERATOR, Role.ADMIN},
    ),
    ("post", "/api/v1/gates/{gate}/evaluate/", {"checkpoint": "CK"}, {Role.OPERATOR, Role.ADMIN}),
    ("post", "/api/v1/gate-decisions/{decision}/approve/", {}, {Role.APPROVER, Role.ADMIN}),
    ("post", "/api/v1/gate-decisions/{decision}/reject/", {}, {Role.APPROVER, Role.ADMIN}),
    ("post", "/api/v1/gates/{gate}/rollback/", {}, {Role.APPROVER, Role.ADMIN}),
    ("post", "/api/v1/users/", {"username": "u-{role}", "role": "viewer"}, {Role.ADMIN}),
    ("post", "/api/v1/flags/{flag}/review/", {"label": "unclear"}, {Role.REVIEWER, Role.ADMIN}),
    ("post", "/api/v1/review-queues/", {"name": "q-{role}"}, {Role.REVIEWER, Role.ADMIN}),
    ("post", "/api/v1/review-queues/{queue}/sync/", {}, {Role.REVIEWER, Role.ADMIN}),
    ("post", "/api/v1/review-queues/{queue}/next/", {}, {Role.REVIEWER, Role.ADMIN}),
    ("post", "/api/v1/review-items/{item}/label/", "LABEL", {Role.REVIEWER, Role.ADMIN}),
    ("post", "/api/v1/flags/{confirmed_flag}/reward-draft/", {}, {Role.REVIEWER, Role.ADMIN}),
    ("post", "/api/v1/flags/{confirmed_flag}/promote/", {"benchmark": "reg-{role}"}, {Role.REVIEWER, Role.ADMIN}),
    ("post", "/api/v1/flags/{confirmed_flag}/exclude/", {}, {Role.REVIEWER, Role.ADMIN}),
    ("post", "/api/v1/reward-drafts/{draft}/accept/", {}, {Role.OPERATOR, Role.ADMIN}),
    ("post", "/api/v1/reward-drafts/{draft}/discard/", {}, {Role.OPERATOR, Role.ADMIN}),
    ("post", "/api/v1/webhooks/", {"name": "w-{role}", "url": "http://127.0.0.1:9/h", "events": ["*"]}, {Role.ADMIN}),
    ("get", "/api/v1/webhooks/{webhook}/", {}, {Role.ADMIN}),
    ("patch", "/api/v1/webhooks/{webhook}/", {"active": False}, {Role.ADMIN}),
    ("delete", "/api/v1/webhooks/{webhook}/", {}, {Role.ADMIN}),
    ("post", "/api/v1/webhooks/{webhook}/ping/", {}, {Role.ADMIN}),
    ("get", "/api/v1/webhook-deliveries/{webhook_delivery}/", {}, {Role.ADMIN}),
    ("post", "/api/v1/webhook-deliveries/{webhook_delivery}/redeliver/", {}, {Role.ADMIN}),
]


@pytest.fixture
def world(users, trajectories_jsonl, tmp_path, settings):  # type: ignore[no-untyped-def]
    from apps.review.models import Flag

    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]  # the webhooks here point at 127.0.0.1:9 (off by default)
    from apps.runs.models import Run

    owner = users["admin"]
    dataset_version = trajectories_version(owner=owner, data=trajectories_jsonl)
    reward_version = context1_version(owner=owner)
    run = Run.objects.create(kind="rescore", spec={}, created_by=owner)
    flag = Flag.objects.create(run=run, trajectory_ref="t1", detector="search_once", detector_version="1")
    from apps.gates.models import Deployment, Gate, GateDecision
    from tests.factories import checkpoint_for, coding_version

    bench_version = coding_version(owner=owner, name="bench")
    gate = Gate.objects.create(name="gate", rules=[{"type": "approval"}], owner=owner)
    gate.benchmark_versions.set([bench_version])
    first, second = (checkpoint_for(owner=owner, tmp_path=tmp_path, step=step) for step in (1, 2))
    decision = GateDecision.objects.create(gate=gate, checkpoint=second, verdict="pending", evidence={})
    Deployment.objects.create(gate=gate, checkpoint=first, created_by=owner, is_current=False)
    Deployment.objects.create(gate=gate, checkpoint=second, created_by=owner)
    from apps.webhooks.models import WebhookDelivery, WebhookEndpoint

    webhook = WebhookEndpoint.objects.create(name="hook", url="http://127.0.0.1:9/h", events=["*"], created_by=owner)
    webhook_delivery = WebhookDelivery.objects.create(
        endpoint=webhook, event="deployment.created", event_id=uuid.uuid4(), status="failed"
    )
    # A confirmed hack on a training run over a tasks dataset, a queue holding it and a reward draft from it.
    from apps.accounts.models import User
    from apps.review.models import Review, RewardDraft
    from apps.review.services import queue_create
    from apps.runs.models import TrajectorySummary
    from tests.factories import exact_answer_version, tasks_version

    rows = [{"id": "q1", "prompt": "2 + 2?", "answer": "4"}]
    train_run = Run.objects.create(
        kind="train",
        spec={"config": {"environment": "exact_answer"}},
        dataset_version=tasks_version(owner=owner, rows=rows),
        reward_version=exact_answer_version(owner=owner),
        created_by=owner,
    )
    summary = TrajectorySummary.objects.create(run=train_run, trajectory_id="t9", task_id="q1")
    confirmed_flag = Flag.objects.create(
        run=train_run, trajectory=summary, trajectory_ref="t9", detector="repetition", detector_version="1"
    )
    seed = User.objects.create_user(username="seed-reviewer", role=Role.REVIEWER)
    Review.objects.create(flag=confirmed_flag, reviewer=seed, label="confirmed")
    queue = queue_create(name="matrix", created_by=owner, run_id=train_run.pk)
    draft = RewardDraft.objects.create(
        flag=confirmed_flag,
        base_version=train_run.reward_version,
        proposed_spec={"terms": [{"type": "normalized_match"}, {"type": "turn_penalty"}]},
        reason="test",
        created_by=seed,
    )
    return {
        "dataset_version": dataset_version,
        "reward_version": reward_version,
        "flag": flag,
        "confirmed_flag": confirmed_flag,
        "queue": queue,
        "item": queue.items.get(),
        "draft": draft,
        "benchmark_version": bench_version,
        "gate": gate,
        "decision": decision,
        "checkpoint": second,
        "webhook": webhook,
        "webhook_delivery": webhook_delivery,
    }


@pytest.mark.parametrize("path", READ_ENDPOINTS + ADMIN_READ_ENDPOINTS)
def test_anonymous_requests_are_refused(path):
    assert APIClient().get(path).status_code in (401, 403)


@pytest.mark.parametrize("role", Role.values)
@pytest.mark.parametrize("path", READ_ENDPOINTS + ADMIN_READ_ENDPOINTS)
def test_reads_follow_the_role(client_for, role, path):
    expected = 200 if (path not in ADMIN_READ_ENDPOINTS or role == Role.ADMIN) else 403
    assert client_for(role).get(path).status_code == expected


@pytest.mark.parametrize("role", Role.values)
@pytest.mark.parametrize("method,path,body,allowed", WRITE_ENDPOINTS)
def test_writes_follow_the_role(client_for, users, world, role, method, path, body, allowed):
    from workers.rewards.schema import context1_spec

    if body == "LABEL":
        from apps.review.services import queue_next

        if role in allowed:  # only the lock holder labels: claim the item first
            queue_next(queue=world["queue"], reviewer=users[role])
        body = {"label": "confirmed"}
    elif body == "LAUNCH":
        body = {
            "kind": "rescore",
            "dataset_version": world["dataset_version"].pk,
            "reward_version": world["reward_version"].pk,
        }
    else:
        body = {k: (v.format(role=role) if isinstance(v, str) else v) for k, v in body.items()}
        if body.get("benchmark_versions") == "BV":
            body["benchmark_versions"] = [world["benchmark_version"].pk]
        if body.get("benchmark_version") == "BV1":
            body["benchmark_version"] = world["benchmark_version"].pk
        if body.get("checkpoint") == "CK":
            body["checkpoint"] = world["checkpoint"].pk
        if body.get("tasks") == "TASKS":
            from tests.factories import CODING_ROWS

            body["tasks"] = CODING_ROWS
        if body.get("spec") == "SPEC":
            body["spec"] = context1_spec().model_dump(mode="json")
    ids = {
        "flag": world["flag"].pk,
        "webhook": world["webhook"].pk,
        "webhook_delivery": world["webhook_delivery"].pk,
        "benchmark": world["benchmark_version"].benchmark_id,
        "gate": world["gate"].pk,
        "decision": world["decision"].pk,
        "confirmed_flag": world["confirmed_flag"].pk,
        "queue": world["queue"].pk,
        "item": world["item"].pk,
        "draft": world["draft"].pk,
    }
    response = getattr(client_for(role), method)(path.format(**ids), body, format="json")
    if role in allowed:
        assert response.status_code in (200, 201, 202, 204), response.json()
    else:
        assert response.status_code == 403, response.json()


def test_a_token_scope_narrows_the_role(users):
    from apps.accounts.services import api_token_create

    _, secret = api_token_create(user=users["admin"], name="ci-read", scopes=["read"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert client.get("/api/v1/runs/").status_code == 200
    assert client.post("/api/v1/datasets/", {"name": "x", "kind": "tasks"}, format="json").status_code == 403
    assert client.get("/api/v1/users/").status_code == 403


def test_a_token_cannot_claim_scopes_beyond_its_role(client_for):
    response = client_for("viewer").post("/api/v1/tokens/", {"name": "sneaky", "scopes": ["launch"]}, format="json")
    assert response.status_code == 403
    assert "does not grant ['launch']" in response.json()["detail"]


def test_a_revoked_or_bogus_token_is_401(client_for, users):
    client = client_for("operator")
    created = client.post("/api/v1/tokens/", {"name": "tmp", "scopes": ["read"]}, format="json").json()
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {created['token']}")
    assert other.get("/api/v1/runs/").status_code == 200
    assert client.delete(f"/api/v1/tokens/{created['id']}/").status_code == 204
    assert other.get("/api/v1/runs/").status_code == 401
    other.credentials(HTTP_AUTHORIZATION="Bearer crk_not-a-token")
    assert other.get("/api/v1/runs/").status_code == 401


@pytest.mark.parametrize("role", Role.values)
def test_pages_require_login_and_launch_pages_require_the_launch_role(client, users, role):
    assert client.get("/").status_code == 302
    client.force_login(users[role])
    assert client.get("/").status_code == 200
    assert client.get("/datasets/").status_code == 200
    expected = 200 if role in (Role.OPERATOR, Role.ADMIN) else 403
    for page in ("/runs/new/rescore/", "/runs/new/train/", "/runs/new/sft/", "/coding/import/", "/coding/generate/"):
        assert client.get(page).status_code == expected, page
    assert client.get("/coding/").status_code == 200


DETAIL_READS = [
    "/api/v1/runs/{run}/",
    "/api/v1/runs/{run}/metrics/",
    "/api/v1/runs/{run}/metrics/?name=x",
    "/api/v1/runs/{run}/events/",
    "/api/v1/runs/{run}/trajectories/",
    "/api/v1/datasets/{dataset}/versions/",
    "/api/v1/reward-configs/{reward}/versions/",
    "/api/v1/reward-versions/{reward_version}/diff/{reward_version}/",
    "/api/v1/flags/{flag}/",
]


@pytest.mark.parametrize("role", [None, *Role.values])
@pytest.mark.parametrize("path", DETAIL_READS)
def test_detail_reads_need_a_login_and_any_role(client_for, world, role, path):
    ids = {
        "run": world["flag"].run_id,
        "dataset": world["dataset_version"].dataset_id,
        "reward": world["reward_version"].config_id,
        "reward_version": world["reward_version"].pk,
        "flag": world["flag"].pk,
    }
    client = APIClient() if role is None else client_for(role)
    expected = (401, 403) if role is None else (200,)
    assert client.get(path.format(**ids)).status_code in expected


@pytest.mark.parametrize("role", Role.values)
def test_only_launchers_cancel_a_run(client_for, world, role):
    from apps.runs.models import Run

    run = Run.objects.create(kind="rescore", spec={}, created_by=world["flag"].run.created_by, ingest_nonce="n")
    response = client_for(role).post(f"/api/v1/runs/{run.pk}/cancel/")
    assert response.status_code == (202 if role in (Role.OPERATOR, Role.ADMIN) else 403)
    run.refresh_from_db()
    assert run.status == ("stopped" if role in (Role.OPERATOR, Role.ADMIN) else "pending")


def test_a_read_token_cannot_mint_a_launch_token(users):
    from apps.accounts.services import api_token_create

    _, secret = api_token_create(user=users["operator"], name="ci-read", scopes=["read"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    response = client.post("/api/v1/tokens/", {"name": "escalate", "scopes": ["launch"]}, format="json")
    assert response.status_code == 403
    assert "does not grant ['launch']" in response.json()["detail"]


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/datagen/null,null/",
        "/api/v1/datasets/null/versions/",
        "/api/v1/reward-configs/null,null/versions/",
        "/api/v1/runs/abc/",
        "/api/v1/runs/1.5/resume/",
        "/api/v1/benchmark-versions/x/tasks/",
    ],
)
def test_a_non_integer_id_is_a_404_not_a_server_error(client_for, path) -> None:
    """Ids are integers in every route (apps.common.routers): fuzzers found these raising ValueError (issue 16)."""
    client = client_for("admin")
    assert client.get(path).status_code == 404
    assert client.post(path, {}, format="json").status_code in (404, 405)


def test_the_favicon_is_public_and_exists(client):  # type: ignore[no-untyped-def]
    """Every page links /static/favicon.svg; /favicon.ico (asked for by tools that skip the link) redirects there,
    with no login (a 404 here was a console error on every page)."""
    from django.contrib.staticfiles import finders

    reply = client.get("/favicon.ico")
    assert reply.status_code == 301 and reply["Location"].endswith("/favicon.svg")
    assert finders.find("favicon.svg")
