from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from apps.runs import services
from apps.runs.models import IngestedRange, MetricPoint, Run, RunEvent, TrajectorySummary
from apps.training import services as training_services

pytestmark = pytest.mark.django_db(transaction=True)


def _client(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def _post(run: Run, events: list[dict], token: str | None = None):  # type: ignore[no-untyped-def]
    return _client(token or services.ingest_token_for(run)).post(
        f"/api/v1/runs/{run.pk}/ingest/", {"events": events}, format="json"
    )


BATCH = [
    {"seq": 1, "kind": "progress", "done": 0, "total": 3},
    {"seq": 2, "kind": "metric", "step": 1, "values": {"reward_mean": 0.5, "term/f_beta": 0.25}},
    {"seq": 3, "kind": "log", "lines": ["hello", "world"]},
    {"seq": 4, "kind": "trajectory", "trajectory_id": "t1", "reward": 0.5, "terms": {"f_beta": 0.25}},
]


def test_a_retried_batch_adds_nothing_the_second_time(run):
    first = _post(run, BATCH)
    assert first.status_code == 200 and first.json() == {"accepted": 4, "duplicates": 0, "last_seq": 4}
    second = _post(run, BATCH)
    assert second.status_code == 200 and second.json() == {"accepted": 0, "duplicates": 4, "last_seq": 4}
    assert RunEvent.objects.filter(run=run).count() == 3  # the metric event is stored once, as MetricPoints
    assert list(IngestedRange.objects.filter(run=run).values_list("lo", "hi")) == [(1, 4)]
    assert MetricPoint.objects.filter(run=run).count() == 2
    assert TrajectorySummary.objects.filter(run=run).count() == 1
    run.refresh_from_db()
    assert run.log_tail == "hello\nworld"
    assert run.status == "running"


def test_out_of_order_and_overlapping_batches_lose_and_duplicate_nothing(run):
    events = [{"seq": s, "kind": "metric", "step": s, "values": {"x": float(s)}} for s in range(1, 11)]
    assert _post(run, events[5:]).json()["accepted"] == 5
    assert _post(run, events[:7]).json() == {"accepted": 5, "duplicates": 2, "last_seq": 10}
    steps = sorted(MetricPoint.objects.filter(run=run).values_list("step", flat=True))
    assert steps == list(range(1, 11))


def test_an_unknown_run_is_404(run):
    response = _client(services.ingest_token_for(run)).post(
        "/api/v1/runs/999999/ingest/", {"events": BATCH}, format="json"
    )
    assert response.status_code == 404


def test_the_token_check_after_a_runs_first_batch_needs_no_database_and_still_refuses_and_finds_a_deleted_run(run):
    """Later batches are authorized from the cached nonce: a wrong token is still a 403, and a run deleted since its
    first batch is a 404 with nothing stored (not a 500)."""
    from apps.runs import ingest

    assert _post(run, BATCH[:2]).status_code == 200
    assert ingest._NONCES[run.pk] == run.ingest_nonce
    assert _post(run, BATCH[:2], token=services.ingest_token_for(run) + "x").status_code == 403
    token = services.ingest_token_for(run)
    Run.objects.filter(pk=run.pk).delete()
    gone = _post(run, BATCH[2:], token=token)
    assert gone.status_code == 404 and "does not exist" in gone.json()["detail"]
    assert not RunEvent.objects.exists() and not MetricPoint.objects.exists()


def test_a_missing_token_is_401_and_a_foreign_token_is_403(run, users, trajectories_jsonl):
    assert APIClient().post(f"/api/v1/runs/{run.pk}/ingest/", {"events": BATCH}, format="json").status_code == 401
    other = training_services.run_launch_rescore(
        created_by=users["operator"], dataset_version=run.dataset_version, reward_version=run.reward_version
    )
    assert _post(run, BATCH, token=services.ingest_token_for(other)).status_code == 403
    assert _post(run, BATCH, token="cri_garbage").status_code == 403
    assert RunEvent.objects.count() == 0


def test_an_ingest_token_opens_nothing_else(run):
    client = _client(services.ingest_token_for(run))
    assert client.get("/api/v1/runs/").status_code in (401, 403)
    assert client.get(f"/api/v1/runs/{run.pk}/").status_code in (401, 403)


def test_an_oversized_batch_is_413(run, settings):
    settings.INGEST_MAX_EVENTS = 3
    assert _post(run, BATCH).status_code == 413
    settings.INGEST_MAX_EVENTS = 10_000
    settings.INGEST_MAX_BYTES = 50
    assert _post(run, BATCH).status_code == 413
    assert RunEvent.objects.count() == 0


def test_a_malformed_event_is_400_naming_the_field_and_nothing_is_written(run):
    bad = [*BATCH, {"seq": 5, "kind": "metric", "step": -1, "values": {"x": 1.0}}]
    response = _post(run, bad)
    assert response.status_code == 400
    assert "step" in response.json()["detail"]
    assert _post(run, [{"seq": 1, "kind": "nope"}]).status_code == 400
    for number in ["NaN", "Infinity", "1e999"]:
        nan_body = '{"events": [{"seq": 1, "kind": "metric", "step": 1, "values": {"x": NUMBER}}]}'.replace(
            "NUMBER", number
        )
        nan = _client(services.ingest_token_for(run)).post(
            f"/api/v1/runs/{run.pk}/ingest/", nan_body, content_type="application/json"
        )
        assert nan.status_code == 400 and "values.x" in nan.json()["detail"], (number, nan.json())
    for values, named in [({"": 1.0}, "[key]"), ({"n" * 101: 1.0}, "[key]"), ({}, "values")]:
        refused = _post(run, [*BATCH, {"seq": 9, "kind": "metric", "step": 1, "values": values}])
        assert refused.status_code == 400 and named in refused.json()["detail"], (values, refused.json())
    assert RunEvent.objects.count() == 0 and MetricPoint.objects.count() == 0


def test_a_long_series_reads_back_downsampled_with_its_spikes(run):
    from apps.runs.selectors import metric_names, metric_series

    events = [
        {"seq": s, "kind": "metric", "step": s, "values": {"loss": 100.0 if s == 4321 else 1.0}} for s in range(1, 5001)
    ]
    assert _post(run, events).json()["accepted"] == 5000
    series = metric_series(run_id=run.pk, name="loss", max_points=100)
    assert series["count"] == 5000
    assert 90 <= len(series["steps"]) <= 100
    assert max(series["max"]) == 100.0 and min(series["min"]) == 1.0
    assert series["steps"] == sorted(series["steps"])
    assert metric_names(run_id=run.pk) == ["loss"]
    short = metric_series(run_id=run.pk, name="missing")
    assert short["count"] == 0 and short["steps"] == []


def test_a_non_finite_number_in_a_free_form_field_is_400_and_stores_nothing(run):
    body = '{"events": [{"seq": 1, "kind": "summary", "data": {"x": Infinity}}]}'
    response = _client(services.ingest_token_for(run)).post(
        f"/api/v1/runs/{run.pk}/ingest/", body, content_type="application/json"
    )
    assert response.status_code == 400
    assert RunEvent.objects.count() == 0


def test_a_late_batch_with_lower_seqs_moves_neither_progress_nor_the_log_backwards(run):
    _post(run, [{"seq": 3, "kind": "progress", "done": 3, "total": 4}, {"seq": 4, "kind": "log", "lines": ["c"]}])
    _post(run, [{"seq": 1, "kind": "progress", "done": 1, "total": 4}, {"seq": 2, "kind": "log", "lines": ["a", "b"]}])
    run.refresh_from_db()
    assert (run.progress_done, run.progress_seq) == (3, 3)
    assert run.log_tail == "a\nb\nc"
    _post(run, [{"seq": 5, "kind": "log", "lines": ["d"]}])
    run.refresh_from_db()
    assert run.log_tail == "a\nb\nc\nd"


def test_events_read_back_in_commit_order_page_by_page_with_a_cursor(run, client_for):
    _post(run, [{"seq": s, "kind": "log", "lines": [f"line {s}"]} for s in range(3, 6)])
    _post(run, [{"seq": 1, "kind": "log", "lines": ["late"]}])
    assert list(RunEvent.objects.filter(run=run).order_by("seq").values_list("batch", flat=True)) == [2, 1, 1, 1]
    api = client_for("viewer")
    body = api.get(f"/api/v1/runs/{run.pk}/events/").json()
    assert [e["seq"] for e in body["events"]] == [3, 4, 5, 1]
    assert body["next"] is None and body["cursor"] == 2
    _post(run, [{"seq": 2, "kind": "log", "lines": ["later"]}])
    body = api.get(f"/api/v1/runs/{run.pk}/events/", {"after_batch": 2}).json()
    assert [e["seq"] for e in body["events"]] == [2]
    bad = api.get(f"/api/v1/runs/{run.pk}/events/", {"after_batch": "x"})
    assert bad.status_code == 400 and "after_batch" in bad.json()["fields"]


def test_replay_pages_through_more_events_than_one_page(run):
    from apps.runs.selectors import run_events_after

    _post(run, [{"seq": s, "kind": "log", "lines": [str(s)]} for s in range(1, 8)])
    seen: list[int] = []
    position: tuple[int, int | None] | None = (0, None)
    while position is not None:
        _, events, position = run_events_after(run_id=run.pk, after_batch=position[0], after_seq=position[1], limit=3)
        seen += [e["seq"] for e in events]
    assert seen == list(range(1, 8))


def test_a_retry_that_overlaps_several_earlier_batches_stores_only_the_gaps(run):
    def metrics(seqs):  # type: ignore[no-untyped-def]
        return [{"seq": s, "kind": "metric", "step": s, "values": {"x": 1.0}} for s in seqs]

    _post(run, metrics([1, 2, 3]))
    _post(run, metrics([7, 8]))
    _post(run, [{"seq": 5, "kind": "log", "lines": ["five"]}])
    reply = _post(run, metrics([2, 3, 4]) + [{"seq": 5, "kind": "log", "lines": ["five"]}] + metrics([6, 7, 9]))
    assert reply.json() == {"accepted": 3, "duplicates": 4, "last_seq": 9}
    assert sorted(MetricPoint.objects.filter(run=run).values_list("step", flat=True)) == [1, 2, 3, 4, 6, 7, 8, 9]
    assert RunEvent.objects.filter(run=run, kind="log").count() == 1


def test_metric_names_that_need_escaping_in_copy_text_and_times_read_back_exactly(run):
    names = ["back\\slash", "tab\there", "new\nline", "cr\rhere", "plain/name", "ünïcode ✓"]
    events = [
        {"seq": i + 1, "kind": "metric", "step": i, "time": 1_700_000_000.25 + i, "values": {name: 1e-7 * (i + 1)}}
        for i, name in enumerate(names)
    ]
    assert _post(run, events).json()["accepted"] == len(names)
    stored = {p.name: p for p in MetricPoint.objects.filter(run=run)}
    assert sorted(stored) == sorted(names)
    for i, name in enumerate(names):
        assert stored[name].value == 1e-7 * (i + 1) and stored[name].step == i
        assert stored[name].time.timestamp() == 1_700_000_000.25 + i


def test_the_hand_built_metric_payload_equals_pydantics_dump():
    from apps.runs.services.ingest import _payloads
    from workers.events import EVENTS_LIST

    events = EVENTS_LIST.validate_python(
        [*BATCH, {"seq": 5, "kind": "metric", "step": 2, "time": 3.5, "values": {"a": 1}}]
    )
    assert _payloads(events) == list(EVENTS_LIST.dump_python(events, mode="json"))


def test_a_nul_character_is_a_400_naming_it_and_stores_nothing(run):
    named = _post(run, [{"seq": 1, "kind": "metric", "step": 0, "values": {"a\x00b": 1.0}}])
    assert named.status_code == 400 and "events.0.metric.values" in named.json()["detail"]
    for event in (
        {"seq": 1, "kind": "log", "lines": ["fine", "nul \x00 here"]},
        {"seq": 1, "kind": "trajectory", "trajectory_id": "t\x00", "reward": 1.0},
        {"seq": 1, "kind": "summary", "data": {"note": "a\x00"}},
    ):
        response = _post(run, [{"seq": 2, "kind": "progress", "done": 1, "total": 2}, event])
        assert response.status_code == 400, (event, response.content)
        assert "NUL character" in response.json()["detail"]
    assert not MetricPoint.objects.filter(run=run).exists() and not RunEvent.objects.filter(run=run).exists()
    assert not TrajectorySummary.objects.filter(run=run).exists()
    run.refresh_from_db()
    assert run.last_seq == 0 and run.progress_done == 0


def test_the_api_answers_a_nul_that_reached_the_database_with_a_400():
    from django.db import DataError
    from psycopg.errors import UntranslatableCharacter

    from apps.common.errors import NUL_PROBLEM, json_exception_handler

    wrapped = DataError("unsupported Unicode escape sequence")
    wrapped.__cause__ = UntranslatableCharacter("unsupported Unicode escape sequence")
    response = json_exception_handler(wrapped, {})
    assert response is not None and response.status_code == 400 and response.data == {"detail": NUL_PROBLEM}
    assert json_exception_handler(DataError("numeric field overflow"), {}) is None  # other errors are not hidden


def test_a_step_past_64_bits_is_a_400_and_stores_nothing(run):
    response = _post(run, [{"seq": 1, "kind": "metric", "step": 2**70, "values": {"x": 1.0}}])
    assert response.status_code == 400 and "64-bit integers" in response.json()["detail"]
    assert not MetricPoint.objects.filter(run=run).exists()
    run.refresh_from_db()
    assert run.last_seq == 0


# --- after the run has ended ---------------------------------------------------------------------------------------


def _end(run: Run, seconds_ago: float, status: str = "stopped") -> None:
    from datetime import timedelta

    from django.utils import timezone

    Run.objects.filter(pk=run.pk).update(status=status, finished_at=timezone.now() - timedelta(seconds=seconds_ago))


def _log(seq: int, line: str, made: float | None) -> dict:  # type: ignore[type-arg]
    return {"seq": seq, "kind": "log", "lines": [line], **({"time": made} if made is not None else {})}


def test_a_run_stopped_long_ago_refuses_its_token_with_a_409_and_stores_nothing(run, settings):
    import time

    settings.INGEST_GRACE_SECONDS = 60
    assert _post(run, [_log(1, "while running", time.time())]).status_code == 200
    _end(run, seconds_ago=3600)
    refused = _post(run, [_log(2, "after the end", time.time())])
    assert refused.status_code == 409, refused.content
    detail = refused.json()["detail"]
    assert "ended (stopped)" in detail and "CRUCIBLE_INGEST_GRACE_SECONDS" in detail and "nothing was stored" in detail
    untimed = _post(run, [_log(2, "no time", None)])
    assert untimed.status_code == 409 and "carry no time" in untimed.json()["detail"]
    run.refresh_from_db()
    assert run.log_tail == "while running" and run.late_events == 0 and run.last_seq == 1
    assert RunEvent.objects.filter(run=run).count() == 1


def test_within_the_grace_a_run_that_ended_takes_its_last_events_and_counts_them_late(run, settings):
    import time

    settings.INGEST_GRACE_SECONDS = 60
    _end(run, seconds_ago=5, status="succeeded")
    final = [_log(1, "final checkpoint written", time.time()), {"seq": 2, "kind": "end", "outcome": "succeeded"}]
    response = _post(run, final)
    assert response.status_code == 200 and response.json()["accepted"] == 2
    run.refresh_from_db()
    assert run.late_events == 2 and run.reported_outcome == "succeeded" and run.status == "succeeded"


def test_after_the_grace_a_replayed_spool_of_events_made_before_the_end_still_lands(run, settings):
    """A driver killed before its events were sent leaves a spool; the next job on the node replays it, maybe long
    after the run failed: events made while the run lived are stored and counted late, never refused."""
    import time

    settings.INGEST_GRACE_SECONDS = 60
    made = time.time() - 7200
    _end(run, seconds_ago=3600, status="failed")
    replay = _post(run, [_log(1, "spooled", made), _log(2, "spooled too", made + 1)])
    assert replay.status_code == 200 and replay.json()["accepted"] == 2
    mixed = _post(run, [_log(3, "old", made + 2), _log(4, "new", time.time())])  # refused whole
    assert mixed.status_code == 409 and "1 of these 2 events" in mixed.json()["detail"]
    run.refresh_from_db()
    assert run.late_events == 2 and run.last_seq == 2
