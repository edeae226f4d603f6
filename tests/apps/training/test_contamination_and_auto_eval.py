"""The contamination guard (training data that overlaps a gating benchmark is refused, or flagged and never
passes that gate) and auto-eval (every new checkpoint of a run is evaluated on the benchmarks it names)."""

from __future__ import annotations

import pytest

from apps.benchmarks.models import Eval
from apps.gates.models import Gate, GateCheck, GateDecision
from apps.runs.models import Checkpoint, Run
from tests.factories import (
    CODING_ROWS,
    coding_version,
    exact_answer_version,
    finish_eval,
    tasks_version,
)
from workers.envs.registry import arithmetic_tasks

pytestmark = pytest.mark.django_db

TINY = {"base_model": "tiny-llama-smollm2-tokenizer", "steps": 2, "prompts_per_step": 2, "group_size": 2}


@pytest.fixture
def gated(users):  # type: ignore[no-untyped-def]
    """A gate pinning a coding benchmark version whose prompts are arithmetic questions, and training data."""
    owner = users["admin"]
    train_rows = arithmetic_tasks(8, seed=0)
    leaked = [{**CODING_ROWS[i], "prompt": "  " + str(train_rows[i]["prompt"]).upper() + " "} for i in range(2)]
    version = coding_version(owner=owner, rows=leaked + CODING_ROWS[2:6])
    gate = Gate.objects.create(name="ship", rules=[{"type": "flag_rate", "max_rate": 1.0}], owner=owner)
    gate.benchmark_versions.set([version])
    return {
        "version": version,
        "gate": gate,
        "tasks": tasks_version(owner=users["operator"], rows=train_rows),
        "clean": tasks_version(owner=users["operator"], rows=arithmetic_tasks(8, seed=99)[4:], name="clean"),
        "reward": exact_answer_version(owner=users["operator"]),
    }


def _launch(client_for, gated, dataset, **extra):  # type: ignore[no-untyped-def]
    body = {
        "kind": "train",
        "dataset_version": dataset.pk,
        "reward_version": gated["reward"].pk,
        "config": TINY,
        **extra,
    }
    return client_for("operator").post("/api/v1/runs/", body, format="json")


def test_training_data_sharing_tasks_with_a_gating_benchmark_is_refused_naming_them(client_for, gated) -> None:
    reply = _launch(client_for, gated, gated["tasks"])
    assert reply.status_code == 400
    detail = reply.json()["detail"]
    assert (
        "mini-coding@v1" in detail and "ship" in detail and "add-0, add-1" in detail and "allow_contamination" in detail
    )
    assert not Run.objects.filter(kind="train").exists()


def test_data_a_benchmark_lists_as_never_train_on_is_refused(client_for, gated) -> None:
    gated["version"].excluded_training_data.set([gated["clean"]])
    reply = _launch(client_for, gated, gated["clean"])
    assert reply.status_code == 400 and "never-train-on" in reply.json()["detail"]


def test_clean_data_launches_and_a_benchmark_no_gate_uses_does_not_block(client_for, gated, users) -> None:
    assert _launch(client_for, gated, gated["clean"]).status_code == 201
    gated["gate"].benchmark_versions.clear()
    assert _launch(client_for, gated, gated["tasks"]).status_code == 201


def test_an_allowed_contaminated_run_is_flagged_and_its_checkpoints_fail_the_gate(client_for, gated, users, tmp_path):
    reply = _launch(client_for, gated, gated["tasks"], allow_contamination=True)
    assert reply.status_code == 201, reply.json()
    run = Run.objects.get(pk=reply.json()["id"])
    assert "contaminated" in run.tags
    assert run.spec["contamination"][0]["overlapping_tasks"] == ["add-0", "add-1"]
    path = tmp_path / "ckpt.pt"
    path.write_bytes(b"x")
    checkpoint = Checkpoint.objects.create(run=run, step=1, uri=f"file://{path}")
    check_reply = client_for("operator").post(
        f"/api/v1/gates/{gated['gate'].pk}/evaluate/", {"checkpoint": checkpoint.pk}, format="json"
    )
    check = GateCheck.objects.get(pk=check_reply.json()["id"])
    finish_eval(check.candidate_evals.get(), {row["id"]: (1, 1) for row in CODING_ROWS[:6]})
    decision = GateDecision.objects.get(gate_check=check)
    assert decision.verdict == "fail"
    guard = decision.evidence["outcomes"][-1]
    assert guard["rule"]["type"] == "contamination_guard" and guard["verdict"] == "fail"


def test_new_checkpoints_of_a_run_are_evaluated_on_its_auto_eval_benchmarks_once(
    client, client_for, gated, users, tmp_path
) -> None:
    from apps.benchmarks.services import eval_auto
    from apps.runs.services import ingest_batch
    from workers.events import EVENTS_LIST

    other = coding_version(owner=users["admin"], name="auto", rows=CODING_ROWS[:3])
    reply = _launch(client_for, gated, gated["clean"], auto_eval=[other.pk])
    assert reply.status_code == 201, reply.json()
    run = Run.objects.get(pk=reply.json()["id"])
    assert run.spec["auto_eval"] == [other.pk]
    path = tmp_path / "step-1.pt"
    path.write_bytes(b"x")  # the eval launch checks the checkpoint file exists
    events = EVENTS_LIST.validate_python([{"seq": 1, "kind": "checkpoint", "step": 1, "uri": f"file://{path}"}])
    ingest_batch(run_id=run.pk, events=events, publish=False)  # queues the TRAIN checkpoints hook (auto-eval) on commit
    assert eval_auto(run_id=run.pk, steps=[1]) == 2  # the checkpoint's eval and its base model's (did it learn?)
    assert eval_auto(run_id=run.pk, steps=[1]) == 0  # a retried task starts nothing new
    evaluation = Eval.objects.get(checkpoint__isnull=False)
    assert Eval.objects.get(checkpoint__isnull=True).base_model == TINY["base_model"]
    assert evaluation.checkpoint.step == 1 and evaluation.benchmark_version_id == other.pk
    finish_eval(evaluation, {row["id"]: (1, 1) for row in CODING_ROWS[:3]})
    client.force_login(users["viewer"])
    html = client.get(f"/runs/{run.pk}/").content.decode()
    assert f"/benchmarks/evals/{evaluation.pk}/" in html and "pass@1" in html


def test_the_run_page_shows_checkpoint_evals_and_contamination(client, client_for, gated, users, tmp_path) -> None:
    reply = _launch(client_for, gated, gated["tasks"], allow_contamination=True)
    run = Run.objects.get(pk=reply.json()["id"])
    client.force_login(users["viewer"])
    html = client.get(f"/runs/{run.pk}/").content.decode()
    assert "Contaminated training data" in html and "add-0" in html


def test_a_gate_checks_contamination_again_when_it_decides(client_for, gated, users, tmp_path) -> None:
    """A run launched before any gate pinned the benchmark is still caught when its checkpoint is gated."""
    gated["gate"].benchmark_versions.clear()
    reply = _launch(client_for, gated, gated["tasks"])
    assert reply.status_code == 201  # nothing gated yet: launched clean
    run = Run.objects.get(pk=reply.json()["id"])
    assert "contamination" not in run.spec
    gated["gate"].benchmark_versions.set([gated["version"]])
    path = tmp_path / "ckpt.pt"
    path.write_bytes(b"x")
    checkpoint = Checkpoint.objects.create(run=run, step=1, uri=f"file://{path}")
    reply = client_for("operator").post(
        f"/api/v1/gates/{gated['gate'].pk}/evaluate/", {"checkpoint": checkpoint.pk}, format="json"
    )
    check = GateCheck.objects.get(pk=reply.json()["id"])
    finish_eval(check.candidate_evals.get(), {row["id"]: (1, 1) for row in CODING_ROWS[:6]})
    decision = GateDecision.objects.get(gate_check=check)
    guard = decision.evidence["outcomes"][-1]
    assert decision.verdict == "fail" and guard["rule"]["type"] == "contamination_guard"
    assert guard["inputs"]["contamination"][0]["overlapping_tasks"] == ["add-0", "add-1"]


def test_a_checkpoint_ingested_for_an_auto_eval_run_queues_the_auto_eval_after_commit(
    client_for, gated, monkeypatch, django_capture_on_commit_callbacks, tmp_path
) -> None:
    from apps.runs.services import ingest_batch
    from workers.events import EVENTS_LIST

    queued: list[tuple[int, str, list[int]]] = []
    monkeypatch.setattr(
        "apps.runs.tasks.run_lifecycle.delay", lambda run_id, point, steps: queued.append((run_id, point, steps))
    )
    reply = _launch(client_for, gated, gated["clean"], auto_eval=[gated["version"].pk])
    run = Run.objects.get(pk=reply.json()["id"])
    events = EVENTS_LIST.validate_python([{"seq": 1, "kind": "checkpoint", "step": 3, "uri": f"file://{tmp_path}/c"}])
    with django_capture_on_commit_callbacks(execute=True):
        ingest_batch(run_id=run.pk, events=events, publish=False)
    assert queued == [(run.pk, "checkpoints", [3])]  # TRAIN's checkpoints hook: training's auto-eval


def test_an_auto_eval_that_cannot_start_is_recorded_on_the_run(client_for, gated, users, tmp_path) -> None:
    from apps.benchmarks.services import eval_auto

    reply = _launch(client_for, gated, gated["clean"], auto_eval=[gated["version"].pk])
    run = Run.objects.get(pk=reply.json()["id"])
    Checkpoint.objects.create(run=run, step=1, uri=f"file://{tmp_path}/not-written-yet.pt")
    assert eval_auto(run_id=run.pk, steps=[1]) == 1  # only the base model's eval: the checkpoint's cannot start
    run.refresh_from_db()
    assert "does not exist" in run.summary["auto_eval_errors"][0]


@pytest.mark.parametrize(("eval_scores", "flagged"), [((6, 5, 4, 3, 2), True), ((2, 3, 4, 5, 6), False)])
def test_checkpoint_evals_chart_on_the_run_and_feed_the_reward_eval_divergence_detector(
    users, tmp_path, eval_scores, flagged
) -> None:
    from django.utils import timezone

    from apps.benchmarks.services import eval_launch
    from apps.review.models import Flag
    from apps.runs.models import MetricPoint

    owner = users["operator"]
    version = coding_version(owner=users["admin"], rows=CODING_ROWS[:6])
    run = Run.objects.create(
        kind="train", spec={"config": {"base_model": "tiny-llama-smollm2-tokenizer"}}, created_by=owner
    )
    now = timezone.now()
    MetricPoint.objects.bulk_create(  # the training reward keeps rising
        [MetricPoint(run=run, step=step, name="reward_mean", value=step / 10, time=now) for step in range(1, 11)]
    )
    for index, step in enumerate((2, 4, 6, 8, 10)):
        path = tmp_path / f"ckpt-{step}.pt"
        path.write_bytes(b"x")
        checkpoint = Checkpoint.objects.create(run=run, step=step, uri=f"file://{path}")
        evaluation, _ = eval_launch(benchmark_version=version, checkpoint=checkpoint, created_by=owner)
        passed = eval_scores[index]
        finish_eval(evaluation, {row["id"]: (1, int(i < passed)) for i, row in enumerate(CODING_ROWS[:6])})
    curve = list(
        MetricPoint.objects.filter(run=run, name="eval/mini-coding/pass@1")
        .order_by("step")
        .values_list("step", "value")
    )
    assert curve == [(s, pytest.approx(p / 6)) for s, p in zip((2, 4, 6, 8, 10), eval_scores, strict=True)]
    from apps.runs.models import MetricRollup

    rolled = MetricRollup.objects.filter(run=run, name="eval/mini-coding/pass@1")
    assert sum(rolled.values_list("count", flat=True)) == 5  # long-range charts read the same curve
    flags = Flag.objects.filter(run=run, detector="reward_eval_divergence")
    assert flags.exists() is flagged
    if flagged:
        flag = flags.get()
        assert flag.trajectory_ref == f"run:{run.pk}" and flag.evidence["eval_metric"] == "pass@1"
