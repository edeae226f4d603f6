"""The health panel (apps/runs/health.py): each signal against its threshold, the learning trend, the API and the
run page."""

from __future__ import annotations

import random

import pytest
from django.test import Client

from apps.runs import services
from apps.runs.health import run_health
from apps.runs.models import Run, RunStatus

pytestmark = pytest.mark.django_db


def _train_run(run: Run, steps: dict[str, list[float]], config: dict | None = None) -> Run:
    """Give `run` a training spec and ingest its per-step metrics (one metric event per step)."""
    run.spec = {**run.spec, "config": {"prompts_per_step": 4, "group_size": 2, "mode": "sync", **(config or {})}}
    run.save(update_fields=["spec"])
    count = max(len(v) for v in steps.values())
    events = [
        {"seq": i + 1, "kind": "metric", "step": i + 1, "values": {k: v[i] for k, v in steps.items() if i < len(v)}}
        for i in range(count)
    ]
    services.ingest_batch(run_id=run.pk, events=_events(events), publish=False)
    run.refresh_from_db()
    return run


def _events(rows: list[dict]) -> list:  # type: ignore[type-arg]
    from workers.events import EventBatch

    return EventBatch.model_validate({"events": rows}).events


def _signals(health: dict) -> dict[str, dict]:  # type: ignore[type-arg]
    return {s["key"]: s for s in health["signals"]}


def test_a_healthy_learning_run_is_ok_and_improving(run):
    rng = random.Random(0)
    n = 20
    _train_run(
        run,
        {
            "reward_mean": [0.1 + 0.03 * i + rng.uniform(-0.02, 0.02) for i in range(n)],
            "staleness": [0.0] * n,
            "mismatch/kl_k3": [1e-6] * n,
            "mismatch/provenance_mismatched_samples": [0.0] * n,
            "dropped_groups": [1.0] * n,
            "groups": [4.0] * n,
            "empty_completions": [0.0] * n,
            "clip_fraction": [0.05] * n,
            "entropy": [1.2 - 0.01 * i for i in range(n)],
            "flags/rate": [0.0] * n,
        },
    )
    health = run_health(run)
    signals = _signals(health)
    assert health["status"] == "ok" and health["problems"] == [], health
    assert signals["dropped_groups"]["shown"] == "25%" and signals["entropy"]["status"] == "ok"
    trend = health["trend"]
    assert trend["verdict"] == "improving" and trend["ci"][0] > 0 and trend["slope"] == pytest.approx(0.03, abs=0.005)


def test_each_broken_signal_is_named_with_its_status(run):
    n = 12
    _train_run(
        run,
        {
            "reward_mean": [0.5] * n,
            "staleness": [0.0] * (n - 1) + [2.0],  # a sync run must never train on an older version
            "mismatch/kl_k3": [0.05] * n,  # far over 1e-2
            "mismatch/provenance_mismatched_samples": [0.0] * (n - 1) + [1.0],
            "dropped_groups": [4.0] * n,
            "groups": [4.0] * n,
            "empty_completions": [2.0] * n,  # 2 of 8 episodes: 25%, a warning (bad is above 25%)
            "clip_fraction": [0.3] * n,
            "entropy": [1.0, 1.0, 1.0] + [0.05] * (n - 3),  # collapsed to 5% of its start
            "flags/rate": [0.5] * n,
        },
    )
    health = run_health(run)
    signals = _signals(health)
    assert health["status"] == "bad"
    statuses = {key: signals[key]["status"] for key in signals}
    assert statuses == {
        "staleness": "bad",
        "mismatch": "bad",
        "provenance": "bad",
        "dropped_groups": "bad",
        "empty_completions": "warn",
        "clip_fraction": "warn",
        "entropy": "bad",
        "flags": "bad",
        "quiet": "ok",  # running (its first batch started it) and reporting
        "stall": "ok",
        "weight_sync": "unknown",  # not reported
    }, statuses
    assert "Train-inference mismatch" in health["problems"] and "Empty completions" in health["problems"]
    assert health["trend"]["verdict"] == "flat"


def test_a_run_without_training_metrics_is_unknown_not_ok(run):
    health = run_health(run)
    assert health["status"] == "unknown" and health["trend"]["verdict"] == "unknown"
    assert all(s["status"] == "unknown" for s in health["signals"])


def test_a_running_run_that_stopped_reporting_is_flagged_quiet(run):
    from datetime import timedelta

    from django.utils import timezone

    from apps.runs.models import MetricPoint

    _train_run(run, {"reward_mean": [0.1, 0.2, 0.3]})
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    run.refresh_from_db()
    assert _signals(run_health(run))["quiet"]["status"] == "ok"
    MetricPoint.objects.filter(run=run).update(time=timezone.now() - timedelta(minutes=40))
    quiet = _signals(run_health(run))["quiet"]
    assert quiet["status"] == "warn" and "40 min" in quiet["shown"]


def test_a_running_run_with_no_step_yet_is_unknown_until_the_wait_is_long(run):
    """Alive is not healthy: a run that started but reported no step is "unknown" (not a green "ok" with "last step
    1 min ago"), and "quiet" once it has waited longer than QUIET_MINUTES."""
    from datetime import timedelta

    from django.utils import timezone

    from apps.runs.health import QUIET_MINUTES

    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, started_at=timezone.now() - timedelta(minutes=1))
    run.refresh_from_db()
    health = run_health(run)
    quiet = _signals(health)["quiet"]
    assert health["status"] == "unknown", health
    assert quiet["status"] == "unknown" and quiet["shown"].startswith("no step yet")
    Run.objects.filter(pk=run.pk).update(started_at=timezone.now() - timedelta(minutes=QUIET_MINUTES + 5))
    run.refresh_from_db()
    health = run_health(run)
    assert health["status"] == "warn" and health["problems"] == ["Reporting"], health


def test_the_api_and_the_run_page_show_the_panel_to_those_who_may_read_the_run(run, client_for, users):
    _train_run(run, {"reward_mean": [0.1, 0.2, 0.3, 0.45], "mismatch/kl_k3": [0.02] * 4})
    reply = client_for("viewer").get(f"/api/v1/runs/{run.pk}/health/")
    assert reply.status_code == 200, reply.content
    body = reply.json()
    assert body["status"] == "bad" and body["trend"]["verdict"] == "improving"
    assert Client().get(f"/api/v1/runs/{run.pk}/health/").status_code in (401, 403)
    assert client_for("viewer").get("/api/v1/runs/999999/health/").status_code == 404
    browser = Client()
    browser.force_login(users["viewer"])
    page = browser.get(f"/runs/{run.pk}/").content.decode()
    assert 'id="run-health"' in page and "Train-inference mismatch" in page and "reward improving" in page


def test_a_weight_sync_over_its_budget_and_a_stall_are_findings(run):
    from django.utils import timezone

    _train_run(run, {"reward_mean": [0.1, 0.2, 0.3], "weight_sync_seconds": [0.4, 12.0, 0.5]})
    signals = _signals(run_health(run))
    assert signals["weight_sync"]["status"] == "ok" and "max 12 s (step 2)" in signals["weight_sync"]["shown"]
    run.spec["config"]["weight_sync_budget_seconds"] = 5
    Run.objects.filter(pk=run.pk).update(
        spec=run.spec, status=RunStatus.RUNNING, stalled_at=timezone.now(), phase="weight_sync"
    )
    run.refresh_from_db()
    health = run_health(run)
    signals = _signals(health)
    assert signals["weight_sync"]["status"] == "bad" and "1 steps over budget" in signals["weight_sync"]["shown"]
    assert signals["weight_sync"]["threshold"] == "bad > 5 s"
    assert signals["stall"]["status"] == "bad" and "in weight_sync" in signals["stall"]["shown"]
    assert "Weight sync" in health["problems"] and "Stall watchdog" in health["problems"]


def test_the_run_list_shows_each_runs_health_refreshed_by_beat_and_filters_on_it(run, users, client_for):
    from apps.runs.health import claim_runs_needing_health, health_refresh
    from apps.runs.tasks import reconcile_runs

    assert run.health == "unknown"
    _train_run(run, {"reward_mean": [0.1, 0.2, 0.3], "mismatch/kl_k3": [0.05] * 3})
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED, finished_at=run.last_event_at)
    reconcile_runs()  # beat: the ended run's panel is computed and stored
    run.refresh_from_db()
    assert run.health == "bad" and run.health_problems == ["Train-inference mismatch"]
    assert claim_runs_needing_health() == []  # up to date until it changes
    Run.objects.filter(pk=run.pk).update(health_at=None)
    assert claim_runs_needing_health() == [run.pk] and claim_runs_needing_health() == []  # claimed once
    assert health_refresh(run_id=run.pk) == "bad" and health_refresh(run_id=10**9) == "unknown"  # a deleted run

    api = client_for("viewer")
    assert [r["id"] for r in api.get("/api/v1/runs/?health=bad").json()["results"]] == [run.pk]
    assert api.get("/api/v1/runs/?health=ok").json()["results"] == []
    refused = api.get("/api/v1/runs/?health=great")
    assert refused.status_code == 400 and "health" in refused.json()["fields"], refused.content
    assert api.get(f"/api/v1/runs/{run.pk}/").json()["health_problems"] == ["Train-inference mismatch"]
    browser = Client()
    browser.force_login(users["viewer"])
    page = browser.get("/?health=bad").content.decode()
    assert "badge health-bad" in page and 'title="Train-inference mismatch"' in page
    assert f'href="/runs/{run.pk}/"' in page
    assert f'href="/runs/{run.pk}/"' not in browser.get("/?health=ok").content.decode()
    assert browser.get("/?sort=health").status_code == 200
