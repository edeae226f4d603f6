"""The cluster page and `GET /api/v1/cluster/` say plainly when Ray does not answer (with a live Ray head they list
its nodes and which run placed each actor: tests/test_e2e.py), and show the queue either way."""

from __future__ import annotations

import pytest

from apps.runs.models import Run, RunStatus

pytestmark = pytest.mark.django_db


def test_with_ray_unreachable_the_page_and_the_api_say_so_and_still_show_the_queue(
    settings, users, client, client_for
) -> None:  # type: ignore[no-untyped-def]
    settings.RAY_ADDRESS = "http://127.0.0.1:9"
    Run.objects.create(
        kind="train",
        spec={},
        status=RunStatus.QUEUED,
        created_by=users["operator"],
        resources={"text": "1 learner rank(s) x [1 GPU]", "total": {"GPU": 1.0}},
        queued_reason="waiting for 1 GPU more",
    )
    reply = client_for("viewer").get("/api/v1/cluster/")
    assert reply.status_code == 200
    body = reply.json()
    assert "127.0.0.1:9" in body["error"] and body["nodes"] == []
    assert body["queued"][0]["position"] == 1 and body["queued"][0]["reason"] == "waiting for 1 GPU more"
    assert client.get("/api/v1/cluster/").status_code in (401, 403)

    client.force_login(users["viewer"])
    html = client.get("/cluster/").content.decode()
    assert "Ray is unreachable" in html and "127.0.0.1:9" in html and "waiting for 1 GPU more" in html
