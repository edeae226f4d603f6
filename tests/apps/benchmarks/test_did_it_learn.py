"""Did it learn? (issue 37 §4, docs/did-it-learn.md): a training run's reward trend with its interval, the share of
groups with signal, and its last evaluated checkpoint against its base model on the same benchmark (paired, with a
verdict), on the run page, in the API and as a filter of the runs list; the base eval queued by auto-eval."""

from __future__ import annotations

import pytest
from django.test import Client

from apps.benchmarks.models import Eval
from apps.benchmarks.services import eval_auto
from apps.runs.health import health_refresh
from apps.runs.learning import run_signal_share
from apps.runs.models import Checkpoint, Run
from apps.runs.services import ingest_batch
from tests.factories import CODING_ROWS, coding_version, finish_eval

pytestmark = pytest.mark.django_db

TINY = "tiny-llama-smollm2-tokenizer"
ROWS = CODING_ROWS[:8]


def _train_run(owner, version, *, reward=None, extra=None):  # type: ignore[no-untyped-def]
    """A training run that auto-evaluates on `version`, with per-step metrics ingested as a job would."""
    from workers.events import EventBatch

    run = Run.objects.create(
        kind="train",
        name="learns",
        spec={"config": {"base_model": TINY}, "auto_eval": [version.pk], **(extra or {})},
        created_by=owner,
    )
    reward = reward if reward is not None else [0.1 + 0.05 * i + (0.01 if i % 2 else -0.01) for i in range(10)]
    events = [
        {
            "seq": i + 1,
            "kind": "metric",
            "step": i + 1,
            "values": {"reward_mean": r, "groups": 4.0, "signal_groups": 3.0 if i < 5 else 2.0, "dropped_groups": 0.0},
        }
        for i, r in enumerate(reward)
    ]
    ingest_batch(run_id=run.pk, events=EventBatch.model_validate({"events": events}).events, publish=False)
    return run


def _checkpoint(run, tmp_path, step):  # type: ignore[no-untyped-def]
    path = tmp_path / f"run{run.pk}-step{step}.pt"
    path.write_bytes(b"x")
    return Checkpoint.objects.create(run=run, step=step, uri=f"file://{path}")


def _results(passed: set[int]) -> dict[str, tuple[int, int]]:
    return {row["id"]: (1, int(i in passed)) for i, row in enumerate(ROWS)}


@pytest.fixture
def learned(users, tmp_path):  # type: ignore[no-untyped-def]
    """A run whose last checkpoint passes 7 of 8 held-out tasks where its base model passed 1 (the same one)."""
    version = coding_version(owner=users["admin"], rows=ROWS)
    run = _train_run(users["operator"], version)
    _checkpoint(run, tmp_path, 5)
    assert eval_auto(run_id=run.pk, steps=[5]) == 2  # the checkpoint's eval and the base model's
    _checkpoint(run, tmp_path, 10)
    assert eval_auto(run_id=run.pk, steps=[10]) == 1  # the base eval is reused
    base = Eval.objects.get(checkpoint__isnull=True)
    finish_eval(base, _results({0}))
    finish_eval(Eval.objects.get(checkpoint__step=5), _results({0, 1, 2}))
    finish_eval(Eval.objects.get(checkpoint__step=10), _results({0, 1, 2, 3, 4, 5, 6}))
    run.refresh_from_db()
    return {"run": run, "version": version, "base": base}


def test_auto_eval_queues_one_eval_of_the_base_model_with_the_checkpoints_settings(users, tmp_path) -> None:
    version = coding_version(owner=users["admin"], rows=ROWS)
    run = _train_run(users["operator"], version)
    _checkpoint(run, tmp_path, 5)
    assert eval_auto(run_id=run.pk, steps=[5]) == 2
    assert eval_auto(run_id=run.pk, steps=[5]) == 0  # a retried hook starts nothing
    base = Eval.objects.get(checkpoint__isnull=True)
    assert base.base_model == TINY and base.benchmark_version == version
    checkpoint_eval = Eval.objects.get(checkpoint__step=5)
    settings = {k: v for k, v in base.run.spec["job"]["config"].items() if k not in ("base_model", "checkpoint_uri")}
    theirs = checkpoint_eval.run.spec["job"]["config"]
    assert settings == {k: v for k, v in theirs.items() if k not in ("base_model", "checkpoint_uri")}
    # Another run of the same base model on the same benchmark reuses that eval.
    other = _train_run(users["operator"], version)
    _checkpoint(other, tmp_path, 5)
    assert eval_auto(run_id=other.pk, steps=[5]) == 1
    assert Eval.objects.filter(checkpoint__isnull=True).count() == 1


def test_auto_evals_answer_within_the_runs_own_completion_budget(users, tmp_path) -> None:
    """A policy trained to answer in 24 tokens is evaluated in 24, and its base alike (not the eval default 384,
    in which a rambling base model would finish sentences the trained one learned to skip)."""
    version = coding_version(owner=users["admin"], rows=ROWS)
    run = _train_run(
        users["operator"], version, extra={"config": {"base_model": TINY, "sampling": {"max_new_tokens": 24}}}
    )
    _checkpoint(run, tmp_path, 5)
    assert eval_auto(run_id=run.pk, steps=[5]) == 2
    assert sorted(e.run.spec["job"]["config"]["max_new_tokens"] for e in Eval.objects.all()) == [24, 24]
    plain = _train_run(users["operator"], version)  # no budget named: the eval default
    _checkpoint(plain, tmp_path, 5)
    eval_auto(run_id=plain.pk, steps=[5])
    assert Eval.objects.get(checkpoint__run=plain).run.spec["job"]["config"]["max_new_tokens"] == 384


def test_a_run_started_from_a_checkpoint_is_judged_against_that_checkpoint(users, tmp_path) -> None:
    version = coding_version(owner=users["admin"], rows=ROWS)
    parent = _train_run(users["operator"], version)
    start = _checkpoint(parent, tmp_path, 10)
    extra = {"init_checkpoint": {"checkpoint": start.pk, "run": parent.pk, "step": 10, "uri": start.uri}}
    child = _train_run(users["operator"], version, extra=extra)
    _checkpoint(child, tmp_path, 5)
    assert eval_auto(run_id=child.pk, steps=[5]) == 2
    assert Eval.objects.filter(checkpoint=start).count() == 1 and not Eval.objects.filter(checkpoint__isnull=True)
    finish_eval(Eval.objects.get(checkpoint=start), _results({0, 1}))
    finish_eval(Eval.objects.get(checkpoint__run=child), _results({0, 1}))
    child.refresh_from_db()
    verdict = child.learning["eval"]
    assert verdict["verdict"] == "no_difference" and verdict["p_value"] == 1.0 and verdict["diff"] == 0.0
    assert verdict["base"]["eval"] == Eval.objects.get(checkpoint=start).pk


def test_the_verdict_pairs_the_last_checkpoint_with_the_base(learned) -> None:
    verdict = learned["run"].learning["eval"]
    # 6 tasks newly passed, none newly failed: exact McNemar p = 2 / 2**6.
    assert verdict["verdict"] == "better"
    assert verdict["p_value"] == pytest.approx(2 / 64)
    assert verdict["diff"] == pytest.approx(6 / 8) and verdict["n"] == 8
    assert verdict["base"]["score"] == pytest.approx(1 / 8) and verdict["checkpoint"]["score"] == pytest.approx(7 / 8)
    assert verdict["checkpoint"]["step"] == 10 and verdict["base"]["eval"] == learned["base"].pk
    assert verdict["ci"][0] > 0 and verdict["test"] == "mcnemar_exact"


def test_a_worse_checkpoint_is_called_worse_and_a_missing_base_is_pending(users, tmp_path) -> None:
    version = coding_version(owner=users["admin"], rows=ROWS)
    run = _train_run(users["operator"], version)
    _checkpoint(run, tmp_path, 5)
    eval_auto(run_id=run.pk, steps=[5])
    finish_eval(Eval.objects.get(checkpoint__step=5), _results(set()))
    run.refresh_from_db()
    assert run.learning["eval"] is None and "has not finished" in run.learning["eval_pending"]
    finish_eval(Eval.objects.get(checkpoint__isnull=True), _results(set(range(8))))
    run.refresh_from_db()
    assert run.learning["eval"]["verdict"] == "worse" and run.learning["eval"]["diff"] == -1.0


def test_the_signal_share_counts_groups_over_the_run_and_says_when_it_was_not_recorded(users) -> None:
    from workers.events import EventBatch

    version = coding_version(owner=users["admin"], rows=ROWS)
    run = _train_run(users["operator"], version)
    assert run_signal_share(run.pk) == {"share": 25 / 40, "groups": 40, "basis": "learner"}
    old = Run.objects.create(kind="train", spec={"config": {}}, created_by=users["operator"])
    events = [{"seq": 1, "kind": "metric", "step": 1, "values": {"reward_mean": 0.5, "groups": 4.0}}]
    ingest_batch(run_id=old.pk, events=EventBatch.model_validate({"events": events}).events, publish=False)
    assert run_signal_share(old.pk) == {"share": None, "groups": 4, "basis": "not recorded"}
    dapo = Run.objects.create(kind="train", spec={"config": {}}, created_by=users["operator"])
    values = {"groups": 4.0, "signal_groups": 4.0, "dynamic_sampling/generated_groups": 10.0}
    values["dynamic_sampling/filtered_groups"] = 6.0
    events = [{"seq": 1, "kind": "metric", "step": 1, "values": values}]
    ingest_batch(run_id=dapo.pk, events=EventBatch.model_validate({"events": events}).events, publish=False)
    assert run_signal_share(dapo.pk) == {"share": 0.4, "groups": 10, "basis": "dynamic_sampling"}


def test_the_run_page_heads_with_the_learning_line(learned, users) -> None:
    browser = Client()
    browser.force_login(users["viewer"])
    page = browser.get(f"/runs/{learned['run'].pk}/").content.decode()
    assert 'id="learning-line"' in page
    assert "62% of groups with signal" in page  # 25 of 40 groups
    assert "held-out pass@1 0.88 vs base 0.12: better, +0.75" in page and "p = 0.031" in page
    assert "(improving)" in page and 'id="learning-eval"' in page


def test_the_api_answers_with_a_learning_object(learned, client_for) -> None:
    run = learned["run"]
    body = client_for("viewer").get(f"/api/v1/runs/{run.pk}/").json()
    learning = body["learning"]
    assert learning["reward"]["verdict"] == "improving" and learning["reward"]["steps"] == 10
    low, high = learning["reward"]["ci"]
    assert low < learning["reward"]["slope"] < high and low > 0
    assert learning["reward"]["last_mean"] > learning["reward"]["first_mean"]
    assert learning["signal"]["share"] == pytest.approx(25 / 40)
    assert learning["eval"]["verdict"] == "better" and "better" in learning["line"]


def test_the_runs_list_filters_by_learning_from_what_is_stored(learned, users, client_for) -> None:
    run = learned["run"]
    flat = _train_run(users["operator"], learned["version"], reward=[0.5, 0.1, 0.9, 0.2, 0.8, 0.3])
    for each in (run, flat):
        health_refresh(run_id=each.pk)  # what beat does: stores the reward trend and the signal share
    flat.refresh_from_db()
    assert flat.learning["reward"]["verdict"] == "flat" and flat.learning.get("eval") is None
    api = client_for("viewer")

    def ids(query: str) -> set[int]:
        reply = api.get(f"/api/v1/runs/?learning={query}")
        assert reply.status_code == 200, reply.content
        return {r["id"] for r in reply.json()["results"]}

    assert ids("better") == {run.pk} and ids("improving") == {run.pk} and ids("flat") == {flat.pk}
    assert ids("worse") == set()
    reply = api.get("/api/v1/runs/?learning=rising")
    assert reply.status_code == 400 and "learning" in reply.json()["fields"]
    listed = api.get("/api/v1/runs/").json()["results"]
    stored = next(r for r in listed if r["id"] == run.pk)["learning"]
    assert stored["eval"]["verdict"] == "better" and stored["reward"]["verdict"] == "improving"
    browser = Client()
    browser.force_login(users["viewer"])
    page = browser.get("/?learning=better").content.decode()
    assert f"/runs/{run.pk}/" in page and f"/runs/{flat.pk}/" not in page
    assert 'name="learning"' in page


def test_the_health_panel_counts_groups_without_signal_even_when_none_are_dropped(users) -> None:
    """Kimi and Dr. GRPO keep equal groups (drop_equal_groups off): dropped_groups is 0 however many groups carry no
    signal, so the health signal reads signal_groups where the learner reports it."""
    from apps.runs.health import run_health
    from workers.events import EventBatch

    run = Run.objects.create(kind="train", spec={"config": {}}, created_by=users["operator"])
    values = {"reward_mean": 0.5, "groups": 4.0, "signal_groups": 1.0, "dropped_groups": 0.0}
    events = [{"seq": i, "kind": "metric", "step": i, "values": values} for i in range(1, 4)]
    ingest_batch(run_id=run.pk, events=EventBatch.model_validate({"events": events}).events, publish=False)
    signal = next(s for s in run_health(run)["signals"] if s["key"] == "dropped_groups")
    assert signal["shown"] == "75%" and signal["status"] == "warn"
