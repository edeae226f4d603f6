"""The real-time RL loop's state machine (apps.realtime.services.cycles), phase by phase, through the services.

The Ray jobs a cycle starts (session training, the gate's evals) are played here as their ends would arrive
(a succeeded run with a checkpoint, task results ingested), so every transition, failure and refusal is checked
without a cluster; tests/test_e2e.py runs one whole cycle on real services."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.accounts.models import Role
from apps.gates.models import Deployment
from apps.gates.services import gate_create
from apps.realtime.models import Cycle, CyclePhase, CycleStatus, Feedback, Loop, Session, SessionTurn
from apps.realtime.services.cycles import cycle_advance, loops_tick, session_record
from apps.realtime.services.loops import loop_create, loop_set_paused
from apps.rewards.services import reward_config_create
from apps.runs.models import Checkpoint, MetricPoint, Run, RunStatus
from apps.runs.services import ingest_batch
from tests.factories import checkpoint_for, coding_version, exact_answer_version, finish_eval
from workers.events import EVENTS_LIST
from workers.session_records import SessionRecord

pytestmark = pytest.mark.django_db

ALL_PASS = {row["id"]: (1, 1) for row in __import__("tests.factories", fromlist=["CODING_ROWS"]).CODING_ROWS}


@pytest.fixture
def world(users, tmp_path):  # type: ignore[no-untyped-def]
    admin = users["admin"]
    version = coding_version(owner=admin)
    gate = gate_create(
        name="coding",
        rules=[{"type": "threshold", "benchmark": "mini-coding", "metric": "pass@1", "value": 0.5}],
        benchmark_versions=[version],
        owner=admin,
        requires_approval=False,
    )
    deployed = checkpoint_for(owner=admin, tmp_path=tmp_path, step=1)
    deployment = Deployment.objects.create(gate=gate, checkpoint=deployed, created_by=admin, note="first")
    serve = Run.objects.create(
        kind="serve",
        status=RunStatus.RUNNING,
        spec={"gate": gate.pk, "base_model": "tiny-llama-smollm2-tokenizer", "model_name": "coding"},
        created_by=admin,
    )
    reward = reward_config_create(
        name="sessions",
        description="",
        spec={"terms": [{"type": "session_feedback"}, {"type": "broken_tool_calls", "weight": 0.1}]},
        owner=admin,
    ).versions.get()
    return {"admin": admin, "gate": gate, "deployed": deployed, "deployment": deployment, "serve": serve,
            "reward": reward, "version": version, "tmp": tmp_path}  # fmt: skip


def _loop(world, **extra):  # type: ignore[no-untyped-def]
    settings = {"min_sessions": 2, "target_sessions": 3, "settle_seconds": 0, "max_wait_seconds": 3600, **extra}
    return loop_create(
        gate=world["gate"], serve_run=world["serve"], reward_version=world["reward"], user=world["admin"], **settings
    )


def _session(world, name: str, *, policy_version: int, feedback: str | None = "edit_kept", age: float = 60.0):  # type: ignore[no-untyped-def]
    when = timezone.now() - timedelta(seconds=age)
    session = Session.objects.create(
        serve_run=world["serve"],
        client_session_id=name,
        task_type="repair",
        first_policy_version=policy_version,
        last_policy_version=policy_version,
        num_turns=2,
        started_at=when,
        last_turn_at=when,
    )
    for index in range(2):
        SessionTurn.objects.create(
            session=session,
            serve_run=world["serve"],
            turn_index=index,
            request_id=f"chatcmpl-{name}-{index}",
            messages=[{"role": "user", "content": "fix it"}],
            response={"role": "assistant", "content": "done"},
            prompt_token_ids=[1, 2, 3],
            completion_token_ids=[4, 5],
            logprobs=[-0.5, -0.25],
            policy_version=policy_version if index else 0,
            latency_ms=12.0,
            finish_reason="stop",
            created_at=when,
        )
    if feedback:
        Feedback.objects.create(session=session, event_id=f"{name}-fb", signal=feedback)
    return session


def _finish_training(
    cycle: Cycle, tmp, *, status: str = RunStatus.SUCCEEDED, checkpoint: bool = True
) -> Checkpoint | None:  # type: ignore[no-untyped-def]
    run = cycle.train_run
    Run.objects.filter(pk=run.pk).update(status=status, summary={"reward_mean": 0.5}, failure_reason="boom")
    if not checkpoint:
        return None
    path = tmp / f"{cycle.loop.gate.name}-{run.pk}.pt"
    path.write_bytes(b"checkpoint")  # control-plane code checks the file exists, never reads it
    return Checkpoint.objects.create(run=run, step=1, uri=f"file://{path}")


def _report_served(world, version: int) -> None:  # type: ignore[no-untyped-def]
    MetricPoint.objects.create(
        run=world["serve"], step=1, name="serve/policy_version/a", value=float(version), time=timezone.now()
    )


def test_a_cycle_waits_for_enough_settled_sessions_and_never_trains_on_nothing(world) -> None:
    loop = _loop(world)
    _session(world, "s1", policy_version=world["deployed"].pk)
    _session(world, "fresh", policy_version=world["deployed"].pk, age=-5)  # not settled: its last turn is "now"
    Loop.objects.filter(pk=loop.pk).update(settle_seconds=30)
    assert loops_tick() == 0
    cycle = Cycle.objects.get(loop=loop)
    assert cycle.phase == CyclePhase.COLLECT and cycle.status == CycleStatus.RUNNING
    assert cycle.reason == "waiting for sessions: 1 ready of 2"
    assert cycle.train_run is None and not Session.objects.filter(cycle__isnull=False).exists()


def test_collect_freezes_sessions_into_a_version_and_launches_training_from_the_deployment(world) -> None:
    loop = _loop(world)
    for n in range(4):
        _session(world, f"s{n}", policy_version=world["deployed"].pk, feedback="edit_kept" if n % 2 else None)
    assert cycle_advance(loop_id=loop.pk) == 1
    cycle = Cycle.objects.get(loop=loop)
    assert cycle.phase == CyclePhase.TRAIN
    assert cycle.sessions == 3 and cycle.turns == 6 and cycle.tokens == 6 * 5  # the target: the 3 oldest
    assert cycle.on_policy_share == pytest.approx(0.5)  # turn 0 of each was sampled by the base model (version 0)
    assert cycle.feedback_share == pytest.approx(1 / 3)
    assert Session.objects.filter(cycle=cycle).count() == 3
    version = cycle.dataset_version
    assert version.dataset.name == "coding-sessions" and version.row_count == 3
    rows = [SessionRecord.model_validate_json(line) for line in version.file.read().splitlines()]
    assert [len(r.turns) for r in rows] == [2, 2, 2]
    run = cycle.train_run
    assert run.kind == "sessiontrain" and run.dataset_version_id == version.pk
    job = run.spec["job"]
    assert job["checkpoint_uri"] == world["deployed"].uri and job["baseline"] == "batch_mean"
    assert job["reward"] == world["reward"].spec
    assert [p["phase"] for p in cycle.timeline] == ["collect", "train"]
    assert cycle.timeline[0]["ended_at"] is not None and cycle.timeline[1]["ended_at"] is None
    # The next cycle will not collect these again.
    assert Session.objects.filter(cycle__isnull=True).count() == 1


def test_after_max_wait_a_cycle_collects_the_minimum(world) -> None:
    loop = _loop(world, target_sessions=10, max_wait_seconds=60)
    for n in range(2):
        _session(world, f"s{n}", policy_version=world["deployed"].pk)
    loops_tick()
    cycle = Cycle.objects.get(loop=loop)
    assert cycle.phase == CyclePhase.COLLECT and "2 ready of 10" in cycle.reason
    Cycle.objects.filter(pk=cycle.pk).update(started_at=timezone.now() - timedelta(seconds=61))
    loops_tick()
    assert Cycle.objects.get(pk=cycle.pk).phase == CyclePhase.TRAIN


def _through_training(world, loop):  # type: ignore[no-untyped-def]
    for n in range(3):
        _session(world, f"s{n}", policy_version=world["deployed"].pk)
    cycle_advance(loop_id=loop.pk)
    cycle = Cycle.objects.get(loop=loop)
    checkpoint = _finish_training(cycle, world["tmp"])
    cycle_advance(loop_id=loop.pk)
    cycle.refresh_from_db()
    assert cycle.phase == CyclePhase.EVALUATE, cycle.reason
    assert cycle.checkpoint == checkpoint and cycle.reward_mean == 0.5
    return cycle


def test_a_passing_gate_deploys_and_the_cycle_ends_when_serving_reports_the_new_version(world) -> None:
    loop = _loop(world)
    cycle = _through_training(world, loop)
    check = cycle.gate_check
    assert check.baseline_deployment == world["deployment"]
    for evaluation in [*check.candidate_evals.all(), *check.baseline_evals.all()]:
        finish_eval(evaluation, ALL_PASS)
    cycle_advance(loop_id=loop.pk)
    cycle.refresh_from_db()
    assert cycle.phase == CyclePhase.DEPLOY and cycle.status == CycleStatus.RUNNING
    current = Deployment.objects.get(gate=world["gate"], is_current=True)
    assert current == cycle.deployment and current.checkpoint == cycle.checkpoint
    assert cycle.eval_deltas["mini-coding"]["delta"] == pytest.approx(0.0)
    assert "waiting for serving run" in cycle.reason
    _report_served(world, cycle.checkpoint.pk)
    cycle_advance(loop_id=loop.pk)
    cycle.refresh_from_db()
    assert cycle.status == CycleStatus.DEPLOYED and cycle.phase == CyclePhase.DONE and cycle.ended_at is not None
    assert [p["phase"] for p in cycle.timeline] == ["collect", "train", "evaluate", "deploy"]
    assert all(p["ended_at"] for p in cycle.timeline)
    # The next tick opens cycle 2 from the new deployment.
    loops_tick()
    second = Cycle.objects.get(loop=loop, number=2)
    assert second.base_deployment == current and second.phase == CyclePhase.COLLECT


def test_a_gate_that_refuses_the_checkpoint_blocks_the_cycle_and_keeps_the_deployment(world) -> None:
    loop = _loop(world)
    cycle = _through_training(world, loop)
    check = cycle.gate_check
    for evaluation in check.baseline_evals.all():
        finish_eval(evaluation, ALL_PASS)
    for evaluation in check.candidate_evals.all():
        finish_eval(evaluation, {task: (1, 0) for task in ALL_PASS})  # the degraded candidate
    cycle_advance(loop_id=loop.pk)
    cycle.refresh_from_db()
    assert cycle.status == CycleStatus.BLOCKED and cycle.phase == CyclePhase.DONE
    assert "pass@1" in cycle.reason
    assert Deployment.objects.get(gate=world["gate"], is_current=True) == world["deployment"]
    assert cycle.eval_deltas["mini-coding"]["delta"] == pytest.approx(-1.0)


@pytest.mark.parametrize(
    "ending, words",
    [({"status": RunStatus.FAILED}, "failed: boom"), ({"checkpoint": False}, "without a checkpoint")],
)
def test_a_training_failure_fails_the_cycle_with_the_reason_and_leaves_the_deployment(world, ending, words) -> None:
    loop = _loop(world)
    for n in range(3):
        _session(world, f"s{n}", policy_version=world["deployed"].pk)
    cycle_advance(loop_id=loop.pk)
    cycle = Cycle.objects.get(loop=loop)
    _finish_training(cycle, world["tmp"], **ending)
    cycle_advance(loop_id=loop.pk)
    cycle.refresh_from_db()
    assert cycle.status == CycleStatus.FAILED and words in cycle.reason
    assert Deployment.objects.get(gate=world["gate"], is_current=True) == world["deployment"]


def test_a_failed_eval_fails_the_cycle(world) -> None:
    loop = _loop(world)
    cycle = _through_training(world, loop)
    finish_eval(cycle.gate_check.candidate_evals.get(), {}, status="failed")
    cycle_advance(loop_id=loop.pk)
    cycle.refresh_from_db()
    assert cycle.status == CycleStatus.FAILED and "errored" in cycle.reason


def test_a_paused_loop_does_not_advance_and_resumes_where_it_was(world) -> None:
    loop = _loop(world)
    for n in range(3):
        _session(world, f"s{n}", policy_version=world["deployed"].pk)
    loop_set_paused(loop=loop, user=world["admin"], paused=True)
    assert loops_tick() == 0 and not Cycle.objects.exists()
    loop_set_paused(loop=loop, user=world["admin"], paused=False)
    assert loops_tick() == 1
    assert Cycle.objects.get(loop=loop).phase == CyclePhase.TRAIN


def test_a_session_becomes_its_session_v1_row(world) -> None:
    session = _session(world, "one", policy_version=7)
    record = session_record(session)
    assert record.session_id == "one" and record.serve_run_id == world["serve"].pk and record.task_type == "repair"
    assert [t.turn_index for t in record.turns] == [0, 1]
    assert record.turns[1].policy_version == 7 and record.turns[0].logprobs == [-0.5, -0.25]
    assert [f.signal for f in record.feedback] == ["edit_kept"]


# --- configuration -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "change, field",
    [
        ({"min_sessions": 0}, "min_sessions"),
        ({"min_sessions": 5, "target_sessions": 3}, "target_sessions"),
        ({"training": {"baseline": "median"}}, "training.baseline"),
        ({"training": {"epochs": 2}}, "training.epochs"),
        ({"training": {"config": {"learning_rate": -1}}}, "training.config.learning_rate"),
        ({"training": {"max_samples": 0}}, "training.max_samples"),
    ],
)
def test_bad_loop_settings_are_refused_naming_the_field(world, change, field) -> None:
    from rest_framework.exceptions import ValidationError

    with pytest.raises(ValidationError) as caught:
        _loop(world, **change)
    assert field in caught.value.detail, caught.value.detail
    assert not Loop.objects.exists()


def test_a_loop_needs_a_serve_run_of_its_gate_a_session_reward_and_is_one_per_gate(world, users) -> None:
    from rest_framework.exceptions import ValidationError

    other = Run.objects.create(kind="train", spec={}, created_by=world["admin"])
    with pytest.raises(ValidationError) as caught:
        loop_create(gate=world["gate"], serve_run=other, reward_version=world["reward"], user=world["admin"])
    assert "serve_run" in caught.value.detail
    plain = exact_answer_version(owner=world["admin"])
    with pytest.raises(ValidationError) as caught:
        loop_create(gate=world["gate"], serve_run=world["serve"], reward_version=plain, user=world["admin"])
    assert "session_feedback" in str(caught.value.detail["reward_version"])
    _loop(world)
    with pytest.raises(ValidationError) as caught:
        _loop(world)
    assert "already has a loop" in str(caught.value.detail["gate"])


def test_only_admins_configure_pause_and_resume_loops_over_the_api(world, client_for) -> None:
    body = {"gate": "coding", "serve_run": world["serve"].pk, "reward_version": world["reward"].pk,
            "min_sessions": 2, "target_sessions": 2}  # fmt: skip
    assert client_for(Role.OPERATOR).post("/api/v1/loops/", body, format="json").status_code == 403
    assert not Loop.objects.exists()
    admin = client_for(Role.ADMIN)
    created = admin.post("/api/v1/loops/", body, format="json")
    assert created.status_code == 201, created.content
    loop_id = created.json()["id"]
    assert client_for(Role.VIEWER).post(f"/api/v1/loops/{loop_id}/pause/").status_code == 403
    assert admin.post(f"/api/v1/loops/{loop_id}/pause/").json()["paused"] is True
    assert admin.post(f"/api/v1/loops/{loop_id}/resume/").json()["paused"] is False
    bad = admin.post("/api/v1/loops/", {**body, "reward_version": 10**6}, format="json")
    assert bad.status_code == 400 and "reward_version" in bad.json()["fields"]
    viewer = client_for(Role.VIEWER)
    listed = viewer.get("/api/v1/loops/").json()
    assert listed["results"][0]["gate"] == "coding" and listed["results"][0]["latest_cycle"] is None
    assert viewer.get(f"/api/v1/loops/{loop_id}/cycles/").json()["results"] == []


def test_the_loop_page_shows_cycles_with_their_timeline(world, client, users) -> None:
    loop = _loop(world)
    for n in range(3):
        _session(world, f"s{n}", policy_version=world["deployed"].pk)
    loops_tick()
    client.force_login(users["viewer"])
    page = client.get(f"/loops/{loop.pk}/").content.decode()
    assert "Median cycle time" in page and "collect" in page and "train" in page
    assert "coding" in client.get("/loops/").content.decode()


def test_ingested_turns_feed_a_cycle(world) -> None:
    """The path the serving job takes: session_turn events through ingest become sessions a cycle collects."""
    loop = _loop(world, min_sessions=1, target_sessions=1)
    turn = {
        "turn_index": 0,
        "request_id": "chatcmpl-x",
        "messages": [{"role": "user", "content": "hi"}],
        "response": {"role": "assistant", "content": "hello"},
        "prompt_token_ids": [1, 2],
        "completion_token_ids": [3],
        "logprobs": [-1.0],
        "policy_version": world["deployed"].pk,
        "latency_ms": 5.0,
        "finish_reason": "stop",
        "created_at": (timezone.now() - timedelta(seconds=60)).timestamp(),
    }
    events = EVENTS_LIST.validate_python([{"seq": 1, "kind": "session_turn", "session_id": "abc", "turn": turn}])
    ingest_batch(run_id=world["serve"].pk, events=events, publish=False)
    loops_tick()
    cycle = Cycle.objects.get(loop=loop)
    assert cycle.phase == CyclePhase.TRAIN and cycle.sessions == 1 and cycle.on_policy_share == 1.0
    row = json.loads(cycle.dataset_version.file.read().splitlines()[0])
    assert row["session_id"] == "abc" and row["turns"][0]["completion_token_ids"] == [3]


def test_a_cycles_sessions_are_rescored_with_a_new_reward_version_by_the_rescore_job(world) -> None:
    """Issue 18 section 3: re-scoring stored sessions with a new version is the existing re-scoring job."""
    from apps.training.services import run_launch_rescore

    loop = _loop(world)
    for n in range(3):
        _session(world, f"s{n}", policy_version=world["deployed"].pk)
    loops_tick()
    version = Cycle.objects.get(loop=loop).dataset_version
    newer = reward_config_create(
        name="sessions-v2", description="", spec={"terms": [{"type": "session_feedback", "turn_decay": 0.5}]},
        owner=world["admin"],
    ).versions.get()  # fmt: skip
    run = run_launch_rescore(created_by=world["admin"], dataset_version=version, reward_version=newer)
    assert run.kind == "rescore" and run.progress_total == 3
    assert run.spec["job"]["reward"] == newer.spec and run.spec["job"]["input_uri"].endswith(".jsonl")


def test_a_transient_database_error_rolls_the_tick_back_and_the_next_tick_goes_on(world, monkeypatch) -> None:
    """A deadlock or a lost connection is not the cycle's fault: nothing is recorded, the next tick retries; any
    other error fails the cycle (tested above through training and eval failures)."""
    from django.db import OperationalError

    from apps.realtime.services import cycles

    loop = _loop(world)
    for n in range(3):
        _session(world, f"s{n}", policy_version=world["deployed"].pk)

    def deadlocked(loop, cycle):  # type: ignore[no-untyped-def]
        raise OperationalError("deadlock detected")

    with monkeypatch.context() as patch:
        patch.setattr(cycles, "_collect", deadlocked)
        assert loops_tick() == 0  # logged, rolled back
    assert not Cycle.objects.exists() and not Session.objects.filter(cycle__isnull=False).exists()
    assert loops_tick() == 1
    assert Cycle.objects.get(loop=loop).phase == CyclePhase.TRAIN


def test_the_runs_api_filters_by_any_registered_kind(world, client_for) -> None:
    viewer = client_for(Role.VIEWER)
    listed = viewer.get("/api/v1/runs/", {"kind": "serve"})
    assert listed.status_code == 200 and [r["id"] for r in listed.json()["results"]] == [world["serve"].pk]
    refused = viewer.get("/api/v1/runs/", {"kind": "nope"})
    assert refused.status_code == 400 and "serve" in str(refused.json()["fields"]["kind"])
