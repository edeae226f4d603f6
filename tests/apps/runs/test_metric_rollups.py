"""Metric roll-ups: ingest keeps them exactly once, and long series are downsampled from them."""

from __future__ import annotations

import math

import pytest

from apps.runs.models import ROLLUP_STEPS, MetricRollup, Run
from apps.runs.selectors import metric_series
from apps.runs.services import ingest_batch, metric_rollups_rebuild
from workers.events import EVENTS_LIST

pytestmark = pytest.mark.django_db

STEPS = 6_000  # with max_points=10 an output bucket spans 600 steps: more than two roll-up buckets


def _value(step: int) -> float:
    return math.sin(step / 97.0) + step / 1000.0


def _events(first_seq: int, steps: range) -> list:  # type: ignore[type-arg]
    return EVENTS_LIST.validate_python(
        [
            {"seq": first_seq + i, "kind": "metric", "step": step, "values": {"reward_mean": _value(step), "loss": 1.0}}
            for i, step in enumerate(steps)
        ]
    )


@pytest.fixture
def run(users):  # type: ignore[no-untyped-def]
    run = Run.objects.create(kind="train", spec={}, created_by=users["operator"])
    ingest_batch(run_id=run.pk, events=_events(1, range(0, 4000)), publish=False)
    ingest_batch(run_id=run.pk, events=_events(4001, range(4000, STEPS)), publish=False)
    return run


def _rollups(run: Run) -> list[tuple]:  # type: ignore[type-arg]
    return list(
        MetricRollup.objects.filter(run=run)
        .order_by("name", "bucket")
        .values_list("name", "bucket", "min", "max", "sum", "count")
    )


def test_ingest_keeps_roll_ups_once_and_they_match_a_rebuild(run) -> None:
    before = _rollups(run)
    assert sum(r[5] for r in before if r[0] == "reward_mean") == STEPS
    assert len([r for r in before if r[0] == "loss"]) == math.ceil(STEPS / ROLLUP_STEPS)
    ingest_batch(run_id=run.pk, events=_events(1, range(0, 4000)), publish=False)  # a retried batch
    assert _rollups(run) == before
    metric_rollups_rebuild(run_ids=[run.pk])
    rebuilt = _rollups(run)
    assert [r[:4] + (r[5],) for r in rebuilt] == [r[:4] + (r[5],) for r in before]
    assert all(math.isclose(a[4], b[4], rel_tol=1e-9, abs_tol=1e-9) for a, b in zip(rebuilt, before, strict=True))


def test_a_long_series_is_downsampled_from_its_roll_ups_with_exact_envelopes_and_means(run) -> None:
    series = metric_series(run_id=run.pk, name="reward_mean", max_points=10)
    values = [_value(s) for s in range(STEPS)]
    assert series["count"] == STEPS and len(series["steps"]) <= 10
    assert series["steps"] == sorted(series["steps"]) and series["steps"][0] == 0
    assert min(series["min"]) == pytest.approx(min(values)) and max(series["max"]) == pytest.approx(max(values))
    # Each output bucket is a whole number of roll-up buckets: its mean is exactly the mean of its points.
    edges = series["steps"][1:] + [STEPS]
    for start, end, mean, low, high in zip(
        series["steps"], edges, series["mean"], series["min"], series["max"], strict=True
    ):
        chunk = values[start:end]
        assert mean == pytest.approx(sum(chunk) / len(chunk)) and low == pytest.approx(min(chunk))
        assert high == pytest.approx(max(chunk))


def test_a_short_series_still_comes_from_its_points(run) -> None:
    series = metric_series(run_id=run.pk, name="reward_mean", max_points=1000)
    assert series["count"] == STEPS and len(series["steps"]) == 1000 and series["steps"][:2] == [0, 6]
    assert metric_series(run_id=run.pk, name="nothing", max_points=10)["count"] == 0
