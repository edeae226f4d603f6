"""The run page's distributions over steps: per-trajectory reward, sampled tokens and turns, binned in PostgreSQL
over the run's whole range, steps grouped into columns; ingest stores each trajectory's sampled tokens."""

from __future__ import annotations

import pytest

from apps.runs.chart_reads import trajectory_distribution
from apps.runs.models import Run, TrajectorySummary

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(users):  # type: ignore[no-untyped-def]
    run = Run.objects.create(kind="rescore", name="dist", spec={}, created_by=users["operator"])
    rows = []
    for step in range(1, 11):
        for i in range(4):  # rewards climb with the step; one trajectory per step has no reward
            reward = None if i == 3 else min(1.0, step / 10 + i * 0.05)
            rows.append(
                TrajectorySummary(
                    run=run,
                    trajectory_id=f"s{step}-{i}",
                    step=step,
                    reward=reward,
                    num_turns=1 + i,
                    completion_tokens=10 * step + i,
                )
            )
    TrajectorySummary.objects.bulk_create(rows)
    return run


def test_counts_per_column_add_up_and_the_mass_moves_with_the_steps(run):  # type: ignore[no-untyped-def]
    d = trajectory_distribution(run_id=run.pk, field="reward", bins=10, max_columns=5)
    assert len(d["columns"]) == 5 and len(d["edges"]) == 11
    assert d["columns"][0] == [1, 2] and d["columns"][-1] == [9, 10]
    assert [sum(c) for c in d["counts"]] == [6] * 5  # 2 steps x 3 rewarded trajectories; the None left out
    assert sum(d["counts"][0][:3]) == 6 and sum(d["counts"][-1][-3:]) == 6
    assert d["edges"][0] == pytest.approx(0.1) and d["edges"][-1] == pytest.approx(1.0)
    every = trajectory_distribution(run_id=run.pk, field="completion_tokens", max_columns=100)
    assert len(every["columns"]) == 10 and sum(map(sum, every["counts"])) == 40


def test_one_value_everywhere_and_an_empty_run(run, users):  # type: ignore[no-untyped-def]
    TrajectorySummary.objects.filter(run=run).update(num_turns=2)
    flat = trajectory_distribution(run_id=run.pk, field="num_turns")
    assert flat["edges"] == [1.5, 2.5] and all(len(c) == 1 for c in flat["counts"])
    empty = Run.objects.create(kind="rescore", name="empty", spec={}, created_by=users["operator"])
    assert trajectory_distribution(run_id=empty.pk, field="reward")["counts"] == []


def test_the_endpoint_names_a_bad_field_and_needs_a_login(run, users, client):  # type: ignore[no-untyped-def]
    from django.test import Client

    viewer = Client()
    viewer.force_login(users["viewer"])
    good = viewer.get(f"/runs/{run.pk}/distribution.json?field=completion_tokens")
    assert good.status_code == 200 and good.json()["field"] == "completion_tokens"
    bad = viewer.get(f"/runs/{run.pk}/distribution.json?field=password")
    assert bad.status_code == 400 and "completion_tokens" in bad.json()["detail"]
    assert client.get(f"/runs/{run.pk}/distribution.json").status_code in (302, 403)
    assert viewer.get("/runs/999999/distribution.json").status_code == 404


def test_ingest_stores_the_sampled_tokens(run):  # type: ignore[no-untyped-def]
    from apps.runs.services.ingest import ingest_batch
    from workers.events import EVENTS_LIST

    event = {"seq": 1, "kind": "trajectory", "trajectory_id": "x", "step": 1, "reward": 1.0, "completion_tokens": 37}
    ingest_batch(run_id=run.pk, events=EVENTS_LIST.validate_python([event]), publish=False)
    assert TrajectorySummary.objects.get(run=run, trajectory_id="x").completion_tokens == 37
    with pytest.raises(ValueError, match="completion_tokens"):
        EVENTS_LIST.validate_python([{**event, "completion_tokens": -1}])


def test_step_times_sample_a_series_for_the_wall_time_axis(run, users):  # type: ignore[no-untyped-def]
    from datetime import timedelta

    from django.test import Client
    from django.utils import timezone

    from apps.runs.chart_reads import step_times
    from apps.runs.models import MetricPoint

    start = timezone.now()
    MetricPoint.objects.bulk_create(
        MetricPoint(run=run, step=step, name="loss", value=1.0, time=start + timedelta(seconds=2 * step))
        for step in range(0, 5000)
    )
    times = step_times(run_id=run.pk, name="loss", max_points=100)
    assert 90 <= len(times["steps"]) <= 101 and times["steps"] == sorted(times["steps"]) and times["steps"][0] == 0
    gaps = {round(b - a, 3) for a, b in zip(times["epoch"], times["epoch"][1:], strict=False)}
    assert gaps == {100.0}  # every 50th step, 2 s apart each
    assert step_times(run_id=run.pk, name="nothing") == {"steps": [], "epoch": []}
    viewer = Client()
    viewer.force_login(users["viewer"])
    body = viewer.get(f"/runs/{run.pk}/chart.json").json()
    assert len(body["times"]["steps"]) > 10 and body["times"]["epoch"][0] == pytest.approx(start.timestamp())
