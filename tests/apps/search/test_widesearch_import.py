"""WideSearch imports (`POST /api/v1/widesearch-imports/`, `manage.py import_widesearch`): the published zip becomes a
tasks version of wide tasks; malformed, unauthorised and duplicated uploads are refused with nothing stored."""

from __future__ import annotations

import io
import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.core.management.base import CommandError

from apps.datasets.models import Dataset, DatasetVersion
from tests.workers.swarm.test_widesearch import GOLD, instance, ws_zip

pytestmark = pytest.mark.django_db


def post(client, data: bytes, **fields):  # type: ignore[no-untyped-def]
    body = {"tasks_dataset": "ws-tasks", **fields}
    return client.post(
        "/api/v1/widesearch-imports/", {"file": SimpleUploadedFile("ws.zip", data), **body}, format="multipart"
    )


def stored() -> tuple[int, int]:
    return Dataset.objects.count(), DatasetVersion.objects.count()


def test_an_import_stores_wide_tasks_and_refuses_what_it_cannot_score(client_for) -> None:  # type: ignore[no-untyped-def]
    client = client_for("operator")
    data = ws_zip([instance(), instance(instance_id="ws_en_002")], {"ws_en_001": GOLD, "ws_en_002": GOLD})
    before = stored()
    refused = post(client, data)  # the llm_judge column, by default
    assert refused.status_code == 400 and "scored by llm_judge" in refused.json()["fields"]["file"][0]
    assert stored() == before
    response = post(client, data, judge_columns="drop")
    assert response.status_code == 201, response.json()
    version = DatasetVersion.objects.get(pk=response.json()["id"])
    assert version.dataset.kind == "tasks" and version.row_count == 2
    assert version.validation_report["departures"] == 2 and version.validation_report["judge_columns"] == "drop"
    with version.file.open("rb") as handle:
        rows = [json.loads(line) for line in handle.read().splitlines()]
    assert [r["id"] for r in rows] == ["ws_en_001", "ws_en_002"] and rows[0]["table"]["tolerances"] == {"Revenue": 0.1}
    before = stored()
    again = post(client, data, judge_columns="drop")
    assert again.status_code == 400 and "identical content is already" in again.json()["fields"]["file"][0]
    assert post(client_for("viewer"), data, judge_columns="drop").status_code == 403
    bad = post(client, data, judge_columns="ask")
    assert bad.status_code == 400 and "judge_columns" in bad.json()["fields"]
    assert stored() == before


def test_the_command_imports_and_names_the_problem(users, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "ws.zip"
    path.write_bytes(ws_zip([instance()], {"ws_en_001": GOLD}))
    out = io.StringIO()
    owner = users["operator"].username
    call_command(
        "import_widesearch", str(path), "--tasks", "ws", "--judge-columns", "exact_match", "--owner", owner, stdout=out
    )
    assert "1 wide tasks" in out.getvalue()
    path.write_bytes(ws_zip([instance(instance_id="ws_en_009")], {"ws_en_001": GOLD}))
    with pytest.raises(CommandError, match="no gold table ws_en_009.csv"):
        call_command("import_widesearch", str(path), "--tasks", "ws", "--judge-columns", "drop", "--owner", owner)
    assert DatasetVersion.objects.filter(dataset__name="ws").count() == 1
