"""Review queues: flags queued once per trajectory, claimed under a lock, labelled by N reviewers, and confirmed
hacks flowing back into a reward draft, a regression benchmark and the training data's exclusions."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import connection, transaction
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from apps.accounts.models import Role
from apps.benchmarks.models import BenchmarkTask
from apps.review import services
from apps.review.models import (
    ActionKind,
    Flag,
    ItemStatus,
    QueueItem,
    Review,
    ReviewAction,
    RewardDraft,
    TaskExclusion,
)
from apps.runs.models import Run, TrajectorySummary
from apps.runs.storage import storage_uri
from tests.factories import exact_answer_version, tasks_version
from workers.detectors.registry import suggest_penalty
from workers.envs.registry import arithmetic_tasks

pytestmark = pytest.mark.django_db

TASKS = arithmetic_tasks(8, seed=0)
LOOP = "the answer is 11. " * 3


def _record(trajectory_id: str, task_id: str) -> dict:
    return {
        "id": trajectory_id,
        "task_id": task_id,
        "turns": [
            {"role": "user", "content": "What is 2 + 9?"},
            {"role": "assistant", "content": "Thinking. " + LOOP + "Done."},
        ],
    }


def _flag(run: Run, ref: str, *, detector: str = "repetition", severity: str = "medium", store: bool = True) -> Flag:
    """A flag on trajectory `ref` of `run`, its summary and (with `store`) its full record in storage."""
    task_id = TASKS[int(ref.rsplit("-", 1)[1]) % len(TASKS)]["id"]
    summary = TrajectorySummary.objects.filter(run=run, trajectory_id=ref).first()
    if summary is None:
        uri = ""
        if store:
            name = default_storage.save(
                f"runs/{run.pk}/trajectories/{ref}.jsonl", ContentFile(json.dumps(_record(ref, task_id)) + "\n")
            )
            uri = storage_uri(name)
        summary = TrajectorySummary.objects.create(
            run=run, trajectory_id=ref, task_id=task_id, step=1, reward=1.0, num_turns=2, storage_uri=uri
        )
    start = len("Thinking. ")
    return Flag.objects.create(
        run=run,
        trajectory=summary,
        trajectory_ref=ref,
        detector=detector,
        detector_version="1",
        severity=severity,
        step=1,
        evidence={
            "message": "62% of the assistant's 4-word phrases repeat",
            "turn": 1,
            "span": [start, start + len(LOOP)],
            "excerpt": LOOP,
            "measure": "repeated_fraction",
            "value": 0.62,
            "threshold": 0.3,
        },
    )


@pytest.fixture
def world(users):  # type: ignore[no-untyped-def]
    owner = users["operator"]
    dataset_version = tasks_version(owner=owner, rows=TASKS)
    run = Run.objects.create(
        kind="train",
        spec={"config": {"environment": "exact_answer"}},
        dataset_version=dataset_version,
        reward_version=exact_answer_version(owner=owner),
        created_by=owner,
    )
    return {"run": run, "dataset_version": dataset_version, "reviewer": users["reviewer"], "admin": users["admin"]}


def _queue(world, **overrides):  # type: ignore[no-untyped-def]
    options = {"name": "q", "created_by": world["admin"], "run_id": world["run"].pk, **overrides}
    return services.queue_create(**options)


def _confirmed(world, flag: Flag) -> Flag:  # type: ignore[no-untyped-def]
    services.review_submit(flag=flag, reviewer=world["reviewer"], label="confirmed")
    return flag


# --- queues and locks -----------------------------------------------------------------------------------------


def test_a_queue_takes_each_trajectory_once_by_its_most_severe_flag_and_honours_its_filters(world):
    run = world["run"]
    _flag(run, "traj-1", detector="repetition", severity="medium")
    severe = _flag(run, "traj-1", detector="length_blowup", severity="high")
    _flag(run, "traj-2", detector="repetition", severity="low")
    queue = _queue(world)
    assert list(queue.items.values_list("trajectory_ref", "flag_id")) == [
        ("traj-1", severe.pk),
        ("traj-2", queue.items.get(trajectory_ref="traj-2").flag_id),
    ]
    high_only = _queue(world, name="high", min_severity="high")
    assert high_only.items.count() == 1
    repetition = _queue(world, name="rep", detector="repetition")
    assert set(repetition.items.values_list("trajectory_ref", flat=True)) == {"traj-1", "traj-2"}

    _flag(run, "traj-3")
    assert services.queue_sync(queue=queue) == 1
    assert services.queue_sync(queue=queue) == 0
    assert queue.items.count() == 3


def test_a_bad_queue_is_refused_naming_the_field(world):
    with pytest.raises(ValidationError) as caught:
        _queue(world, name="bad name", detector="nope", required_reviews=0, lock_timeout_s=1)
    assert {"name", "detector", "required_reviews", "lock_timeout_s"} <= set(caught.value.detail)


def test_next_locks_an_item_and_two_reviewers_get_different_items(world, make_user):
    run = world["run"]
    _flag(run, "traj-1", severity="low")
    _flag(run, "traj-2", severity="high")
    queue = _queue(world)
    alice, bob = world["reviewer"], make_user(Role.REVIEWER, "bob")
    first = services.queue_next(queue=queue, reviewer=alice)
    assert first is not None and first.trajectory_ref == "traj-2"  # the most severe first
    assert first.locked_by == alice and first.locked_until > timezone.now()
    assert services.queue_next(queue=queue, reviewer=alice).pk == first.pk  # what you hold comes back
    second = services.queue_next(queue=queue, reviewer=bob)
    assert second is not None and second.pk != first.pk
    assert services.queue_next(queue=queue, reviewer=make_user(Role.REVIEWER, "carol")) is None


def test_an_expired_lock_is_taken_over(world, make_user):
    _flag(world["run"], "traj-1")
    queue = _queue(world, lock_timeout_s=60)
    alice, bob = world["reviewer"], make_user(Role.REVIEWER, "bob")
    item = services.queue_next(queue=queue, reviewer=alice)
    assert services.queue_next(queue=queue, reviewer=bob) is None
    QueueItem.objects.filter(pk=item.pk).update(locked_until=timezone.now() - timedelta(seconds=1))
    taken = services.queue_next(queue=queue, reviewer=bob)
    assert taken is not None and taken.pk == item.pk and taken.locked_by == bob
    with pytest.raises(ValidationError, match="locked by bob until"):
        services.item_label(item=item, reviewer=alice, label="confirmed")
    assert not Review.objects.exists()


def test_a_label_on_an_item_locked_by_someone_else_is_a_400_naming_the_holder(world, client_for, users):
    _flag(world["run"], "traj-1")
    queue = _queue(world)
    item = services.queue_next(queue=queue, reviewer=users["reviewer"])
    reply = client_for("admin").post(f"/api/v1/review-items/{item.pk}/label/", {"label": "unclear"}, format="json")
    assert reply.status_code == 400
    assert "locked by reviewer-user until" in reply.json()["detail"]
    assert not Review.objects.exists()
    unclaimed = client_for("admin").post(f"/api/v1/review-queues/{queue.pk}/next/")
    assert unclaimed.status_code == 204


def test_a_label_without_claiming_the_item_is_refused(world):
    _flag(world["run"], "traj-1")
    item = _queue(world).items.get()
    with pytest.raises(ValidationError, match="claim it with 'next'"):
        services.item_label(item=item, reviewer=world["reviewer"], label="unclear")


def test_a_double_submit_is_a_400_and_writes_one_review(world, client_for):
    _flag(world["run"], "traj-1")
    queue = _queue(world)
    claimed = client_for("reviewer").post(f"/api/v1/review-queues/{queue.pk}/next/")
    assert claimed.status_code == 200
    item_id = claimed.json()["id"]
    first = client_for("reviewer").post(f"/api/v1/review-items/{item_id}/label/", {"label": "confirmed"}, format="json")
    again = client_for("reviewer").post(f"/api/v1/review-items/{item_id}/label/", {"label": "confirmed"}, format="json")
    assert first.status_code == 201
    assert again.status_code == 400 and "already labelled" in again.json()["detail"]
    assert Review.objects.count() == 1
    item = QueueItem.objects.get(pk=item_id)
    assert item.status == ItemStatus.DONE and item.locked_by is None


def test_an_item_needs_its_n_reviewers_and_a_reviewer_never_gets_it_twice(world, make_user):
    _flag(world["run"], "traj-1")
    queue = _queue(world, required_reviews=2)
    alice, bob = world["reviewer"], make_user(Role.REVIEWER, "bob")
    item = services.queue_next(queue=queue, reviewer=alice)
    services.item_label(item=item, reviewer=alice, label="confirmed")
    item.refresh_from_db()
    assert item.status == ItemStatus.OPEN and item.locked_by is None
    assert services.queue_next(queue=queue, reviewer=alice) is None
    assert services.queue_next(queue=queue, reviewer=bob).pk == item.pk
    services.item_label(item=item, reviewer=bob, label="false_positive")
    item.refresh_from_db()
    assert item.status == ItemStatus.DONE and item.done_at is not None


def test_an_unknown_label_is_refused(world):
    _flag(world["run"], "traj-1")
    item = services.queue_next(queue=_queue(world), reviewer=world["reviewer"])
    with pytest.raises(ValidationError, match="unknown label"):
        services.item_label(item=item, reviewer=world["reviewer"], label="maybe")
    assert not Review.objects.exists()


@pytest.mark.parametrize("role", [Role.VIEWER, Role.OPERATOR, Role.APPROVER])
def test_a_role_without_review_cannot_claim_or_label(world, client_for, users, role):
    _flag(world["run"], "traj-1")
    queue = _queue(world)
    item = queue.items.get()
    assert client_for(role).post(f"/api/v1/review-queues/{queue.pk}/next/").status_code == 403
    reply = client_for(role).post(f"/api/v1/review-items/{item.pk}/label/", {"label": "unclear"}, format="json")
    assert reply.status_code == 403
    from django.test import Client

    page = Client()
    page.force_login(users[role])
    assert page.post(f"/review/items/{item.pk}/label/", {"label": "unclear"}).status_code == 403
    assert page.post(f"/review/queues/{queue.pk}/next/").status_code == 403
    item.refresh_from_db()
    assert item.locked_by is None and not Review.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_claim_skips_an_item_another_transaction_is_claiming(users, make_user):
    owner = users["operator"]
    run = Run.objects.create(kind="train", spec={}, created_by=owner)
    for n in (1, 2):
        Flag.objects.create(run=run, trajectory_ref=f"traj-{n}", detector="repetition", detector_version="1")
    queue = services.queue_create(name="race", created_by=users["admin"], run_id=run.pk)
    first_id = queue.items.order_by("id").first().pk
    got: list[int | None] = []

    def other_reviewer() -> None:
        try:
            item = services.queue_next(queue=queue, reviewer=users["reviewer"])
            got.append(item.pk if item else None)
        finally:
            connection.close()

    with transaction.atomic():
        QueueItem.objects.select_for_update().get(pk=first_id)  # a claim in flight holds this row
        thread = threading.Thread(target=other_reviewer)
        thread.start()
        thread.join(timeout=20)
    assert got and got[0] is not None and got[0] != first_id


# --- pages ------------------------------------------------------------------------------------------------------


def test_the_review_page_shows_the_trajectory_with_the_evidence_highlighted(world, client):
    flag = _flag(world["run"], "traj-1")
    queue = _queue(world)
    client.force_login(world["reviewer"])
    claimed = client.post(f"/review/queues/{queue.pk}/next/")
    item = queue.items.get()
    assert claimed.status_code == 302 and claimed["Location"] == f"/review/items/{item.pk}/"
    html = client.get(claimed["Location"]).content.decode()
    assert f'<mark class="evidence">{LOOP}</mark>' in html
    assert 'data-flagged-turn="1"' in html and "Flagged turn 1 (assistant)" in html
    assert f'hx-get="/runs/{flag.run_id}/trajectories/traj-1/"' in html  # the trajectory view, embedded
    assert "js/review.js" in html and 'data-key="1"' in html and 'id="note"' in html
    assert "62% of the assistant" in html and "repeated_fraction" in html
    embedded = client.get(f"/runs/{flag.run_id}/trajectories/traj-1/").content.decode()
    assert embedded.count('<div class="turn turn-') == 2  # what review.js outlines: turn 1 of #turns


def test_labelling_a_false_positive_on_the_page_goes_to_the_next_item(world, client):
    _flag(world["run"], "traj-1", severity="high")
    _flag(world["run"], "traj-2", severity="low")
    queue = _queue(world)
    client.force_login(world["reviewer"])
    client.post(f"/review/queues/{queue.pk}/next/")
    first = queue.items.get(trajectory_ref="traj-1")
    reply = client.post(f"/review/items/{first.pk}/label/", {"label": "false_positive"}, HTTP_HX_REQUEST="true")
    second = queue.items.get(trajectory_ref="traj-2")
    assert reply.status_code == 204 and reply["HX-Redirect"] == f"/review/items/{second.pk}/"
    second.refresh_from_db()
    assert second.locked_by == world["reviewer"]
    confirmed = client.post(f"/review/items/{second.pk}/label/", {"label": "confirmed"}, HTTP_HX_REQUEST="true")
    html = confirmed.content.decode()
    assert confirmed.status_code == 200 and "Draft a reward penalty" in html and 'hx-swap-oob="true"' in html
    again = client.post(f"/review/items/{second.pk}/label/", {"label": "confirmed"}, HTTP_HX_REQUEST="true")
    assert again.status_code == 400 and "already labelled" in again.content.decode()


def test_a_flag_whose_trajectory_was_deleted_shows_why_and_can_still_be_labelled(world, client):
    flag = _flag(world["run"], "traj-1")
    queue = _queue(world)
    TrajectorySummary.objects.filter(pk=flag.trajectory_id).delete()
    client.force_login(world["reviewer"])
    client.post(f"/review/queues/{queue.pk}/next/")
    item = queue.items.get()
    html = client.get(f"/review/items/{item.pk}/").content.decode()
    assert "is no longer stored" in html and "stored evidence" in html
    assert f'<mark class="evidence">{LOOP}</mark>' in html  # the excerpt kept with the flag
    assert "hx-get=" not in html.split('id="trajectory"')[1]
    reply = client.post(f"/review/items/{item.pk}/label/", {"label": "confirmed", "note": "loop"})
    assert reply.status_code == 302
    assert Review.objects.get().note == "loop"
    with pytest.raises(ValidationError, match="pass task_id"):
        services.task_exclude(flag=Flag.objects.get(), user=world["reviewer"])
    exclusion = services.task_exclude(flag=Flag.objects.get(), user=world["reviewer"], task_id=TASKS[1]["id"])
    assert exclusion.task_id == TASKS[1]["id"]


def test_a_summary_without_its_record_is_labelled_from_the_evidence(world, client):
    _flag(world["run"], "traj-1", store=False)
    queue = _queue(world)
    client.force_login(world["reviewer"])
    client.post(f"/review/queues/{queue.pk}/next/")
    html = client.get(f"/review/items/{queue.items.get().pk}/").content.decode()
    assert "Only the summary of trajectory traj-1 is stored" in html and LOOP in html


def test_the_queue_list_shows_progress_per_reviewer_and_each_detectors_precision(world, client, make_user):
    run = world["run"]
    bob = make_user(Role.REVIEWER, "bob")
    flags = [_flag(run, f"traj-{n}", detector="repetition") for n in range(4)]
    other = _flag(run, "traj-9", detector="length_blowup")
    _queue(world)
    for flag, label in zip(flags, ["confirmed", "confirmed", "false_positive", "unclear"], strict=True):
        Review.objects.create(flag=flag, reviewer=world["reviewer"], label=label)
    Review.objects.create(flag=flags[0], reviewer=bob, label="confirmed")
    Review.objects.create(flag=other, reviewer=bob, label="false_positive")
    from apps.review.selectors import detector_precision

    precision = {p.detector: p for p in detector_precision()}
    assert (precision["repetition"].confirmed, precision["repetition"].reviewed) == (3, 5)
    assert precision["repetition"].precision == pytest.approx(0.6)
    assert precision["length_blowup"].precision == 0.0
    client.force_login(world["reviewer"])
    html = client.get("/review/").content.decode()
    assert "reviewer-user: 4" in html and "bob: 2" in html
    assert "<td>repetition</td><td>5</td><td>3</td><td>1</td><td>1</td><td>0.60</td>" in html
    assert "<td>length_blowup</td><td>1</td><td>0</td><td>1</td><td>0</td><td>0.00</td>" in html


def test_a_reviewer_creates_a_queue_on_the_page_and_a_viewer_cannot(world, client, users):
    _flag(world["run"], "traj-1")
    client.force_login(users["viewer"])
    assert client.post("/review/", {"name": "v"}).status_code == 403
    client.force_login(world["reviewer"])
    reply = client.post("/review/", {"name": "mine", "required_reviews": "2", "lock_timeout_s": "60"})
    assert reply.status_code == 302
    bad = client.post("/review/", {"name": "mine", "required_reviews": "1", "lock_timeout_s": "60"})
    assert bad.status_code == 200 and "a queue named &#x27;mine&#x27; exists" in bad.content.decode()


# --- labels flow back -------------------------------------------------------------------------------------------


def test_suggestions_add_or_tighten_a_penalty_and_never_repeat_the_spec():
    base = {"terms": [{"type": "normalized_match"}]}
    added, reason = suggest_penalty(base, "repetition")
    assert added["terms"][1]["type"] == "turn_penalty" and "add a turn_penalty" in reason
    assert base == {"terms": [{"type": "normalized_match"}]}
    tightened, reason = suggest_penalty(added, "length_blowup")
    assert tightened["terms"][1]["start"] == 4 and tightened["terms"][1]["max_penalty"] == 0.75
    recall, reason = suggest_penalty(base, "search_once_then_quit")
    assert recall["terms"][1] == {"type": "trajectory_recall", "weight": 0.5}
    heavier, _ = suggest_penalty(recall, "search_once_then_quit")
    assert heavier["terms"][1]["weight"] == 0.75


def test_a_reward_draft_waits_for_an_operator_who_accepts_it(world, client_for):
    flag = _flag(world["run"], "traj-1")
    denied = client_for("reviewer").post(f"/api/v1/flags/{flag.pk}/reward-draft/")
    assert denied.status_code == 400 and "confirmed" in denied.json()["detail"]
    _confirmed(world, flag)
    reply = client_for("reviewer").post(f"/api/v1/flags/{flag.pk}/reward-draft/")
    assert reply.status_code == 201
    draft = RewardDraft.objects.get()
    config = world["run"].reward_version.config
    assert config.versions.count() == 1  # nothing changes until an operator accepts
    assert [t["type"] for t in draft.proposed_spec["terms"]] == ["normalized_match", "turn_penalty"]
    assert client_for("reviewer").post(f"/api/v1/reward-drafts/{draft.pk}/accept/").status_code == 403
    accepted = client_for("operator").post(f"/api/v1/reward-drafts/{draft.pk}/accept/")
    assert accepted.status_code == 200 and accepted.json()["status"] == "accepted"
    version = config.versions.order_by("-number").first()
    assert version.number == 2 and version.parent_id == world["run"].reward_version_id
    assert any(t["type"] == "turn_penalty" for t in version.spec["terms"])
    again = client_for("operator").post(f"/api/v1/reward-drafts/{draft.pk}/accept/")
    assert again.status_code == 400 and "already accepted" in again.json()["detail"]
    kinds = list(ReviewAction.objects.order_by("id").values_list("kind", "actor__username"))
    assert kinds == [(ActionKind.REWARD_DRAFT, "reviewer-user"), (ActionKind.DRAFT_ACCEPT, "operator-user")]
    assert ReviewAction.objects.get(kind=ActionKind.DRAFT_ACCEPT).reward_version == version


def test_a_discarded_draft_creates_nothing(world, users):
    flag = _confirmed(world, _flag(world["run"], "traj-1"))
    draft = services.reward_draft_create(flag=flag, created_by=world["reviewer"])
    services.reward_draft_discard(draft=draft, user=users["operator"])
    assert world["run"].reward_version.config.versions.count() == 1
    with pytest.raises(ValidationError, match="already discarded"):
        services.reward_draft_accept(draft=draft, user=users["operator"])


def test_a_confirmed_hack_becomes_a_regression_case_in_a_benchmark(world, client_for):
    flag = _confirmed(world, _flag(world["run"], "traj-1"))
    reply = client_for("reviewer").post(
        f"/api/v1/flags/{flag.pk}/promote/", {"benchmark": "regressions"}, format="json"
    )
    assert reply.status_code == 201, reply.json()
    task = BenchmarkTask.objects.get(version_id=reply.json()["benchmark_version"])
    assert task.task_id == TASKS[1]["id"] and task.provenance == "review" and "traj-1" in task.source_ref
    assert task.payload["answer"] == TASKS[1]["answer"]

    second = _confirmed(world, _flag(world["run"], "traj-2"))
    grown = services.task_promote(flag=second, benchmark_name="regressions", user=world["reviewer"])
    assert grown.number == 2 and grown.task_count == 2
    kept = BenchmarkTask.objects.get(version=grown, task_id=TASKS[1]["id"])
    assert kept.provenance == "review" and "traj-1" in kept.source_ref  # carried over with its own source
    with pytest.raises(ValidationError, match="already in regressions@v2"):
        services.task_promote(flag=second, benchmark_name="regressions", user=world["reviewer"])
    actions = ReviewAction.objects.filter(kind=ActionKind.BENCHMARK_PROMOTE)
    assert actions.count() == 2 and actions.first().benchmark_version == grown


def test_an_excluded_task_stops_a_training_launch_unless_allowed(world, client_for, users, monkeypatch):
    monkeypatch.setattr("apps.runs.tasks.dispatch_run.delay", lambda run_id: None)
    flag = _confirmed(world, _flag(world["run"], "traj-3"))
    reply = client_for("reviewer").post(f"/api/v1/flags/{flag.pk}/exclude/", {}, format="json")
    assert reply.status_code == 201, reply.json()
    exclusion = TaskExclusion.objects.get()
    assert exclusion.task_id == TASKS[3]["id"] and exclusion.dataset == world["dataset_version"].dataset
    again = client_for("reviewer").post(f"/api/v1/flags/{flag.pk}/exclude/", {}, format="json")
    assert again.status_code == 400 and "already excluded" in again.json()["detail"]
    assert ReviewAction.objects.get(kind=ActionKind.TASK_EXCLUDE).exclusion == exclusion

    config = {"base_model": "tiny-llama-smollm2-tokenizer", "steps": 2, "prompts_per_step": 2, "group_size": 2}
    body = {
        "kind": "train",
        "dataset_version": world["dataset_version"].pk,
        "reward_version": world["run"].reward_version_id,
        "config": config,
    }
    refused = client_for("operator").post("/api/v1/runs/", body, format="json")
    assert refused.status_code == 400
    assert TASKS[3]["id"] in refused.json()["detail"] and "allow_excluded" in refused.json()["detail"]
    allowed = client_for("operator").post("/api/v1/runs/", {**body, "allow_excluded": True}, format="json")
    assert allowed.status_code == 201, allowed.json()
    run = Run.objects.get(pk=allowed.json()["id"])
    assert run.spec["excluded_tasks"] == [TASKS[3]["id"]]
    from apps.runs.services import worker_spec

    assert worker_spec(run)["exclude_task_ids"] == [TASKS[3]["id"]]  # the trainer leaves them out


def test_the_flow_back_buttons_on_the_page_record_their_actions(world, client):
    flag = _confirmed(world, _flag(world["run"], "traj-1"))
    client.force_login(world["reviewer"])
    drafted = client.post(f"/review/flags/{flag.pk}/draft/", HTTP_HX_REQUEST="true")
    assert drafted.status_code == 200 and "Drafted a reward config version" in drafted.content.decode()
    excluded = client.post(f"/review/flags/{flag.pk}/exclude/", HTTP_HX_REQUEST="true")
    assert "Excluded the task from training data" in excluded.content.decode()
    twice = client.post(f"/review/flags/{flag.pk}/exclude/", HTTP_HX_REQUEST="true")
    assert twice.status_code == 400 and "already excluded" in twice.content.decode()
    assert client.post(f"/review/flags/{flag.pk}/bogus/").status_code == 404


def test_an_excluded_task_stops_an_sft_launch_as_it_stops_training(world, client_for, monkeypatch):
    """SFT trains on the same tasks, so it passes the same training-data guards (issue 13: it skipped this one)."""
    monkeypatch.setattr("apps.runs.tasks.dispatch_run.delay", lambda run_id: None)
    flag = _confirmed(world, _flag(world["run"], "traj-3"))
    assert client_for("reviewer").post(f"/api/v1/flags/{flag.pk}/exclude/", {}, format="json").status_code == 201
    model = "tiny-llama-smollm2-tokenizer"
    body = {
        "kind": "sft",
        "dataset_version": world["dataset_version"].pk,
        "reward_version": world["run"].reward_version_id,
        "config": {"environment": "exact_answer", "teacher_model": model, "base_model": model, "max_tasks": 4},
    }
    refused = client_for("operator").post("/api/v1/runs/", body, format="json")
    assert refused.status_code == 400, refused.json()
    assert TASKS[3]["id"] in refused.json()["detail"] and "allow_excluded" in refused.json()["detail"]
    assert not Run.objects.filter(kind="sft").exists()
    allowed = client_for("operator").post("/api/v1/runs/", {**body, "allow_excluded": True}, format="json")
    assert allowed.status_code == 201, allowed.json()
    from apps.runs.services import worker_spec

    run = Run.objects.get(pk=allowed.json()["id"])
    assert run.spec["excluded_tasks"] == [TASKS[3]["id"]]
    assert worker_spec(run)["exclude_task_ids"] == [TASKS[3]["id"]]  # the SFT job leaves them out
