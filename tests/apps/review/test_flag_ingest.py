"""Flag events from the workers' detectors become `Flag` rows exactly once, linked to their trajectory."""

from __future__ import annotations

from typing import Any, get_args

import pytest
from rest_framework.test import APIClient

from apps.review.models import Flag, Severity
from apps.runs import services
from apps.runs.models import Run, RunEvent, TrajectorySummary
from apps.training import services as training_services
from workers.events import FlagEvent
from workers.findings import SEVERITIES
from workers.findings import Severity as WorkerSeverity

pytestmark = pytest.mark.django_db(transaction=True)


def _post(run: Run, events: list[dict[str, Any]]) -> Any:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {services.ingest_token_for(run)}")
    return client.post(f"/api/v1/runs/{run.pk}/ingest/", {"events": events}, format="json")


def _trajectory(seq: int, trajectory_id: str) -> dict[str, Any]:
    return {"seq": seq, "kind": "trajectory", "trajectory_id": trajectory_id, "step": 3, "reward": 0.1}


def _flag(seq: int, trajectory_id: str, detector: str = "malformed_tool_calls", **extra: Any) -> dict[str, Any]:
    return {
        "seq": seq,
        "kind": "flag",
        "trajectory_id": trajectory_id,
        "detector": detector,
        "detector_version": "1",
        "severity": "high",
        "evidence": {"turn": 4, "span": [0, 31], "excerpt": "error: invalid JSON", "value": 2, "threshold": 1},
        "step": 3,
        **extra,
    }


def test_a_flag_in_the_batch_of_its_trajectory_is_stored_once_and_linked(run: Run) -> None:
    batch = [_trajectory(1, "s3-t1"), _flag(2, "s3-t1"), _flag(3, "s3-t1", detector="repetition")]
    assert _post(run, batch).json() == {"accepted": 3, "duplicates": 0, "last_seq": 3}
    assert _post(run, batch).json() == {"accepted": 0, "duplicates": 3, "last_seq": 3}
    flags = list(Flag.objects.filter(run=run).order_by("detector"))
    assert [f.detector for f in flags] == ["malformed_tool_calls", "repetition"]
    summary = TrajectorySummary.objects.get(run=run, trajectory_id="s3-t1")
    flag = flags[0]
    assert flag.trajectory == summary and flag.trajectory_ref == "s3-t1"
    assert (flag.detector_version, flag.severity, flag.step) == ("1", Severity.HIGH, 3)
    assert flag.evidence["span"] == [0, 31] and flag.evidence["excerpt"] == "error: invalid JSON"
    assert RunEvent.objects.filter(run=run, kind="flag").count() == 2  # the ledger keeps them too


def test_a_second_flag_of_one_detector_on_one_trajectory_adds_nothing(run: Run) -> None:
    _post(run, [_trajectory(1, "t1"), _flag(2, "t1")])
    assert _post(run, [_flag(3, "t1", severity="low")]).json()["accepted"] == 1
    assert list(Flag.objects.filter(run=run).values_list("severity", flat=True)) == ["high"]


def test_a_flag_that_arrives_before_its_trajectory_is_linked_when_the_trajectory_comes(run: Run) -> None:
    _post(run, [_flag(2, "late")])
    flag = Flag.objects.get(run=run)
    assert flag.trajectory is None and flag.trajectory_ref == "late"
    _post(run, [_trajectory(1, "late"), _trajectory(3, "other")])
    flag.refresh_from_db()
    assert flag.trajectory == TrajectorySummary.objects.get(run=run, trajectory_id="late")


def test_flags_link_only_to_their_own_runs_trajectory(run: Run, users: Any) -> None:
    other = training_services.run_launch_rescore(
        created_by=users["operator"], dataset_version=run.dataset_version, reward_version=run.reward_version
    )
    _post(other, [_trajectory(1, "shared-id")])
    _post(run, [_flag(1, "shared-id")])
    assert Flag.objects.get(run=run).trajectory is None


def test_a_flag_with_an_unknown_severity_is_refused_naming_the_field(run: Run) -> None:
    response = _post(run, [_flag(1, "t1", severity="critical")])
    assert response.status_code == 400
    assert any("severity" in field for field in response.json()["fields"])
    assert not Flag.objects.exists() and not RunEvent.objects.exists()


def test_the_workers_severities_and_field_limits_match_the_flag_model() -> None:
    assert set(get_args(WorkerSeverity)) == set(SEVERITIES) == set(Severity.values)
    for event_field, model_field in (
        ("trajectory_id", "trajectory_ref"),
        ("detector", "detector"),
        ("detector_version", "detector_version"),
    ):
        limits = {m.max_length for m in FlagEvent.model_fields[event_field].metadata if hasattr(m, "max_length")}
        assert limits == {Flag._meta.get_field(model_field).max_length}


def test_ingested_flags_queue_a_review_sync_after_the_commit(users, monkeypatch, django_capture_on_commit_callbacks):
    from apps.runs.models import Run
    from apps.runs.services import ingest_batch
    from workers.events import EVENTS_LIST

    synced: list[bool] = []
    monkeypatch.setattr("apps.review.tasks.review_queues_sync.delay", lambda: synced.append(True))
    run = Run.objects.create(kind="rescore", spec={}, created_by=users["operator"])
    flag = {"seq": 1, "kind": "flag", "trajectory_id": "t1", "detector": "repetition", "detector_version": "1"}
    with django_capture_on_commit_callbacks(execute=True):
        ingest_batch(
            run_id=run.pk,
            events=EVENTS_LIST.validate_python([{**flag, "severity": "low", "evidence": {}}]),
            publish=False,
        )
    assert synced == [True]
