"""External runs (issue 41 part 2): a run trained outside Crucible reports through the SDK (`crucible.init`), over
the same ingest path as Crucible's jobs, and gets the same rows: metrics, trajectories with their files, detector
flags, checkpoints that evals load, and an end that finishes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.test import Client
from rest_framework.test import APIClient

from apps.accounts.services import api_token_create
from apps.benchmarks.services.evals import _eval_model
from apps.review.models import Flag
from apps.runs import services
from apps.runs.models import Checkpoint, MetricPoint, Run, TrajectorySummary
from apps.runs.storage import storage_name
from apps.training.external import EXTERNAL, external_run_create

pytestmark = pytest.mark.django_db(transaction=True)

GOOD = {
    "id": "t1",
    "task_id": "q1",
    "turns": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
}


def _create(client_for, role: str = "operator", **body):  # type: ignore[no-untyped-def]
    return client_for(role).post("/api/v1/external-runs/", {"project": "trl-demo", **body}, format="json")


def _put(run: Run, name: str, body: bytes, token: str | None = None):  # type: ignore[no-untyped-def]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token or services.ingest_token_for(run)}")
    return client.put(f"/api/v1/runs/{run.pk}/ingest/files/{name}", body, content_type="application/x-ndjson")


def test_an_external_run_is_created_running_and_a_retry_returns_the_same_run(client_for, users) -> None:  # type: ignore[no-untyped-def]
    first = _create(client_for, name="grpo", config={"lr": 3e-6}, client_id="0123456789abcdef")
    assert first.status_code == 201, first.json()
    body = first.json()
    assert body["ingest_token"].startswith(f"cri_{body['id']}_") and body["ingest_url"].endswith("/ingest/")
    run = Run.objects.get(pk=body["id"])
    assert run.kind == EXTERNAL and run.status == "running" and run.started_at is not None
    assert run.spec["config"] == {"lr": 3e-6} and run.tags == ["trl-demo"]
    again = _create(client_for, name="grpo", config={"lr": 3e-6}, client_id="0123456789abcdef")
    assert again.status_code == 200 and again.json()["id"] == body["id"] and Run.objects.count() == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"project": ""}, "project"),
        ({"project": "has spaces"}, "project"),
        ({"base_model": "gpt-9"}, "base_model"),
        ({"client_id": "short"}, "client_id"),
        ({"config": {"blob": "x" * 70_000}}, "config"),
        ({"config": [1, 2]}, "config"),
    ],
)
def test_a_bad_field_is_a_400_naming_it_and_stores_nothing(client_for, body, field) -> None:  # type: ignore[no-untyped-def]
    reply = _create(client_for, **body)
    assert reply.status_code == 400 and field in reply.json()["fields"], reply.json()
    assert not Run.objects.exists()


def test_a_viewer_or_a_stranger_cannot_create_one(client_for) -> None:  # type: ignore[no-untyped-def]
    assert _create(client_for, role="viewer").status_code == 403
    assert APIClient().post("/api/v1/external-runs/", {"project": "p"}, format="json").status_code in (401, 403)
    assert not Run.objects.exists()


def test_it_is_never_dispatched_nor_reconciled_with_ray(users, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from apps.runs import tasks

    run, _ = external_run_create(created_by=users["operator"], project="p")
    dispatched: list[int] = []
    monkeypatch.setattr(tasks.dispatch_run, "delay", dispatched.append)
    Run.objects.filter(pk=run.pk).update(created_at=run.created_at.replace(year=2020))  # long past the redispatch age
    tasks.reconcile_runs()
    assert services.run_dispatch(run_id=run.pk).ray_job_id == "" and dispatched == []


def test_its_trajectory_files_are_checked_stored_once_and_refused_when_wrong(users, settings) -> None:  # type: ignore[no-untyped-def]
    run, _ = external_run_create(created_by=users["operator"], project="p")
    body = (json.dumps(GOOD) + "\n").encode()
    stored = _put(run, "step-1.jsonl", body)
    assert stored.status_code == 200 and stored.json()["trajectories"] == 1
    assert _put(run, "step-1.jsonl", body).json() == stored.json()  # a retried upload: the same file
    assert _put(run, "step-1.jsonl", body + body.replace(b"t1", b"t2")).status_code == 409
    bad = _put(run, "step-2.jsonl", body + b'{"id": "t3", "turns": "nope"}\n')
    assert bad.status_code == 400 and "line 2" in bad.json()["detail"]
    assert _put(run, ".hidden.jsonl", body).status_code == 400
    assert _put(run, "notes.txt", body).status_code == 400
    assert _put(run, "../escape.jsonl", body).status_code != 200  # no route takes a slash in the name
    assert _put(run, "step-3.jsonl", body, token="cri_1_forged").status_code == 403
    settings.INGEST_MAX_BYTES = 10
    assert _put(run, "step-4.jsonl", body).status_code == 413
    trained = Run.objects.create(kind="train", spec={}, created_by=users["operator"], ingest_nonce="n")
    assert _put(trained, "step-1.jsonl", body).status_code == 409
    from django.core.files.storage import default_storage

    name = storage_name(stored.json()["uri"])
    assert name is not None and default_storage.exists(name)
    assert not default_storage.exists(f"runs/{run.pk}/external/step-2.jsonl")


def test_the_sdk_reports_metrics_trajectories_flags_and_a_checkpoint_then_ends_the_run(
    live_server, users, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    import crucible
    from workers.models.registry import TINY_LLAMA, resolve_base_model

    _, token = api_token_create(user=users["operator"], name="sdk", scopes=["read", "launch"])
    run = crucible.init(
        "sdk-test", "my-loop", config={"lr": 1e-5}, base_model=TINY_LLAMA, url=live_server.url, token=token
    )
    run.log({"reward": 0.25, "loss": 1.5, "bad": float("nan"), "text": "skipped"}, step=1)  # type: ignore[dict-item]
    run.log({"reward": 0.5}, step=2)
    looping = " ".join(["the answer is four"] * 40)  # the repetition detector's pattern
    with pytest.raises(ValueError, match=r"trajectory 1 \('x'\): .*turns"):
        run.log_trajectories([GOOD, {"id": "x", "turns": "not a list"}], step=2)  # nothing is sent
    uri = run.log_trajectories(
        [
            {**GOOD, "reward": 1.0, "terms": {"correct": 1.0}, "completion_tokens": 1},
            {
                "id": "loop",
                "task_id": "q2",
                "messages": [{"role": "user", "content": "3+3?"}, {"role": "assistant", "content": looping}],
                "reward": 0.0,
                "terms": {"correct": 0.0},
            },
        ],
        step=2,
    )
    model = resolve_base_model(TINY_LLAMA)
    run.log_checkpoint(model, step=2, metrics={"reward": 0.5})
    with pytest.raises(ValueError, match="no config.json"):
        run.log_checkpoint(tmp_path, step=3)
    run.finish()

    row = Run.objects.get(pk=run.id)
    assert row.status == "succeeded" and row.kind == EXTERNAL, (row.status, row.failure_reason)
    assert dict(MetricPoint.objects.filter(run=row, name="reward").values_list("step", "value")) == {1: 0.25, 2: 0.5}
    assert not MetricPoint.objects.filter(run=row, name__in=["bad", "text"]).exists()
    summaries = {t.trajectory_id: t for t in TrajectorySummary.objects.filter(run=row)}
    assert set(summaries) == {"t1", "loop"} and summaries["t1"].storage_uri == uri
    assert summaries["t1"].reward == 1.0 and summaries["t1"].terms == {"correct": 1.0}
    [flag] = Flag.objects.filter(run=row)
    assert flag.detector == "repetition" and flag.trajectory_ref == "loop" and flag.trajectory_id is not None
    [checkpoint] = Checkpoint.objects.filter(run=row)
    assert checkpoint.uri == f"file://{model.resolve()}" and checkpoint.step == 2
    problems: dict[str, list[str]] = {}
    assert _eval_model(problems, checkpoint=checkpoint, base_model="") == (str(model.resolve()), None)
    assert problems == {}  # an eval loads the trainer's model directory as its base model

    # It reads like a native run: its page, its trajectory, the runs list, the API.
    browser = Client()
    browser.force_login(users["operator"])
    page = browser.get(f"/runs/{row.pk}/")
    assert page.status_code == 200 and "my-loop" in page.content.decode()
    trajectory = browser.get(f"/runs/{row.pk}/trajectories/loop/")
    assert trajectory.status_code == 200 and "the answer is four" in trajectory.content.decode()
    listing = browser.get("/?kind=external")
    assert listing.status_code == 200 and "my-loop" in listing.content.decode()
    api = APIClient()
    api.force_authenticate(users["operator"])
    assert api.get(f"/api/v1/runs/{row.pk}/").json()["kind"] == EXTERNAL


def test_a_run_that_raises_inside_the_sdk_block_fails_with_the_reason(live_server, users) -> None:  # type: ignore[no-untyped-def]
    import crucible

    _, token = api_token_create(user=users["operator"], name="sdk", scopes=["read", "launch"])
    with pytest.raises(RuntimeError):
        with crucible.init("sdk-test", url=live_server.url, token=token) as run:
            run.log({"loss": 2.0})
            raise RuntimeError("CUDA out of memory")
    row = Run.objects.get(pk=run.id)
    assert row.status == "failed" and "CUDA out of memory" in row.failure_reason
    with pytest.raises(crucible.CrucibleError, match="403"):
        crucible.init(
            "sdk-test", url=live_server.url, token=api_token_create(user=users["viewer"], name="v", scopes=["read"])[1]
        )


def test_verls_tracker_interface_reports_to_an_external_run(live_server, users, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from crucible.verl import CrucibleTracker

    _, token = api_token_create(user=users["operator"], name="verl", scopes=["read", "launch"])
    monkeypatch.setenv("CRUCIBLE_URL", live_server.url)
    monkeypatch.setenv("CRUCIBLE_TOKEN", token)
    config = {"actor_rollout_ref": {"model": {"path": "/models/qwen"}}, "trainer": {"total_epochs": 1}, "lr": 1e-6}
    tracker = CrucibleTracker("verl-demo", "ppo", config)
    tracker.log({"critic/score/mean": 0.5, "timing_s/gen": 1.5, "note": "text"}, step=1)  # as verl's Tracking calls it
    tracker.finish()
    run = Run.objects.get(pk=tracker.run.id)
    assert run.status == "succeeded" and run.spec["config"]["base_model"] == "/models/qwen" and "verl" in run.tags
    assert set(MetricPoint.objects.filter(run=run).values_list("name", flat=True)) == {
        "critic/score/mean",
        "timing_s/gen",
    }
