"""A/B statistics of a serving run's arms: the interval and test formulas against hand-computed values and peer
implementations, then the per-arm table and the comparison over sessions recorded through ingest."""

from __future__ import annotations

import time

import pytest
from scipy.stats import binomtest, chi2_contingency

from apps.realtime import stats
from apps.realtime.models import Session
from apps.realtime.services.sessions import feedback_create
from tests.apps.realtime.session_factories import ingest, serve_run, turn_event
from workers.session_records import FeedbackIn


def test_the_wilson_interval_matches_the_hand_computed_and_scipys():
    # 8 of 10: centre (0.8 + z²/20) / (1 + z²/10), half-width z·sqrt(0.016 + z²/400) / (1 + z²/10), z = 1.95996
    assert stats.wilson_interval(8, 10) == pytest.approx((0.49016, 0.94332), abs=1e-5)
    for k, n in ((0, 5), (3, 7), (50, 50), (123, 1000)):
        peer = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
        assert stats.wilson_interval(k, n) == pytest.approx((peer.low, peer.high), abs=1e-9)
    assert stats.wilson_interval(0, 0) is None


def test_the_two_proportion_test_and_newcombes_interval():
    # pooled 12/20: z = -0.4 / sqrt(0.24 · 0.2) = -1.8257, two-sided p = 0.0679
    assert stats.two_proportion_p_value(8, 10, 4, 10) == pytest.approx(0.06789, abs=1e-5)
    for a, n_a, b, n_b in ((8, 10, 4, 10), (30, 200, 45, 210)):
        chi2 = chi2_contingency([[a, n_a - a], [b, n_b - b]], correction=False)
        assert stats.two_proportion_p_value(a, n_a, b, n_b) == pytest.approx(chi2.pvalue, rel=1e-9)
    assert stats.two_proportion_p_value(0, 10, 0, 12) == 1.0 and stats.two_proportion_p_value(1, 0, 1, 2) is None
    # Newcombe (1998), Table II, 56/70 against 48/80: difference 0.2, method 10 interval 0.0524 to 0.3339.
    assert stats.newcombe_interval(48, 80, 56, 70) == pytest.approx((0.0524, 0.3339), abs=1e-4)


def test_percentile_intervals_are_the_order_statistics_binomial_ranks_give():
    values = [float(v) for v in range(20, 0, -1)]  # unsorted on purpose
    median = stats.percentile_interval(values, 0.5)
    # n = 20, q = 0.5: ranks 6 and 15 (Binomial(20, 0.5) puts 95.9% between them)
    assert (median.value, median.low, median.high) == (10.5, 6.0, 15.0)
    p95 = stats.percentile_interval(values, 0.95)
    assert (p95.value, p95.low, p95.high) == (pytest.approx(19.05), 17.0, None)  # 20 values have no upper rank
    assert stats.percentile_interval([], 0.5) == stats.Percentile(None, None, None)


def test_the_median_difference_is_seeded_and_tested():
    a, b = [100.0 + i for i in range(10)], [200.0 + i for i in range(10)]
    found = stats.median_difference(a, b)
    assert found.difference == 100.0 and found.relative == pytest.approx(100 / 104.5)
    assert found.low is not None and found.high is not None and found.low <= 100.0 <= found.high
    assert found.p_value == pytest.approx(0.000183, abs=1e-5)  # Mann-Whitney U = 0, 10 against 10
    assert stats.median_difference(a, b) == found  # seeded: the same numbers on every load
    assert stats.median_difference([], b).difference is None


@pytest.mark.django_db
def test_the_ab_endpoint_gives_each_arm_and_b_against_a(users, client_for):
    run = serve_run(users["operator"])
    now = time.time()
    events = []
    for arm, latency in (("a", 100.0), ("b", 200.0)):
        for i in range(10):
            events.append(turn_event(f"{arm}{i}", 0, arm=arm, latency_ms=latency + i, created_at=now - 60 + i))
    ingest(run, events)
    kept = {"a": 8, "b": 4}
    dissatisfied = {"a": 1, "b": 5}
    for session in Session.objects.filter(serve_run=run):
        i = int(session.client_session_id[1:])
        if i < kept[session.arm]:
            feedback_create(session=session, body=FeedbackIn(event_id="k", signal="edit_kept"))
            feedback_create(session=session, body=FeedbackIn(event_id="k2", signal="edit_kept"))  # counted once
        if i >= 10 - dissatisfied[session.arm]:
            feedback_create(session=session, body=FeedbackIn(event_id="d", signal="dissatisfied_followup"))
    response = client_for("viewer").get(f"/api/v1/serving/{run.pk}/ab/")
    assert response.status_code == 200, response.content
    body = response.json()
    a, b = body["arms"]
    assert (a["name"], a["sessions"], a["turns"], a["sessions_with_feedback"]) == ("a", 10, 10, 9)
    assert a["edit_kept"]["count"] == 8 and a["edit_kept"]["rate"] == 0.8
    assert a["edit_kept"]["ci"] == pytest.approx([0.49016, 0.94332], abs=1e-5)
    assert b["edit_kept"]["rate"] == 0.4 and b["dissatisfied"]["rate"] == 0.5 and a["dissatisfied"]["rate"] == 0.1
    assert a["latency_ms"]["p50"] == {"value": 104.5, "ci": [101.0, 108.0]}  # n = 10: ranks 2 and 9 of 100..109
    assert b["latency_ms"]["p50"]["value"] == 204.5
    [comparison] = body["comparisons"]
    assert (comparison["arm"], comparison["baseline"]) == ("b", "a")
    assert comparison["edit_kept"]["difference"] == pytest.approx(-0.4)
    assert comparison["edit_kept"]["p_value"] == pytest.approx(0.06789, abs=1e-5)
    assert comparison["edit_kept"]["ci"] == pytest.approx(list(stats.newcombe_interval(8, 10, 4, 10)))
    assert comparison["dissatisfied"]["difference"] == pytest.approx(0.4)
    assert comparison["latency_p50"]["difference"] == 100.0
    # A window that ends before the sessions: nothing to compare.
    early = client_for("viewer").get(f"/api/v1/serving/{run.pk}/ab/", {"until": "2000-01-01T00:00:00Z"}).json()
    assert early["arms"] == [] and early["comparisons"] == []
    assert client_for("viewer").get(f"/api/v1/serving/{run.pk}/ab/", {"since": "yesterday"}).status_code == 400
    assert client_for("viewer").get("/api/v1/serving/999999/ab/").status_code == 404
