from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from apps.datasets.models import Dataset, DatasetVersion

pytestmark = pytest.mark.django_db


def _create(client, name: str = "trajs", kind: str = "trajectories"):  # type: ignore[no-untyped-def]
    return client.post("/api/v1/datasets/", {"name": name, "kind": kind, "description": "d"}, format="json")


def _upload(client, dataset_id: int, data: bytes, name: str = "t.jsonl"):  # type: ignore[no-untyped-def]
    return client.post(
        f"/api/v1/datasets/{dataset_id}/versions/", {"file": SimpleUploadedFile(name, data)}, format="multipart"
    )


def test_an_operator_uploads_trajectories_and_gets_a_counted_hashed_version(client_for, trajectories_jsonl):
    client = client_for("operator")
    dataset_id = _create(client).json()["id"]
    response = _upload(client, dataset_id, trajectories_jsonl)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["number"] == 1
    assert body["row_count"] == 40
    assert len(body["content_hash"]) == 64
    version = DatasetVersion.objects.get()
    assert version.file.read() == trajectories_jsonl


def test_malformed_jsonl_is_rejected_with_line_numbers_and_nothing_is_stored(
    client_for, trajectories_jsonl, tmp_path, settings
):
    client = client_for("operator")
    dataset_id = _create(client).json()["id"]
    lines = trajectories_jsonl.splitlines()
    lines[2] = b'{"id": "broken", '
    lines[5] = b'{"task_id": "no id here"}'
    response = _upload(client, dataset_id, b"\n".join(lines))
    assert response.status_code == 400
    body = response.json()
    messages = body["fields"]["file"]
    assert any(m.startswith("line 3:") for m in messages)
    assert any(m.startswith("line 6:") and "id" in m for m in messages)
    assert "file" in body["detail"]
    assert DatasetVersion.objects.count() == 0


def test_uploading_identical_content_twice_is_refused(client_for, trajectories_jsonl):
    client = client_for("operator")
    dataset_id = _create(client).json()["id"]
    assert _upload(client, dataset_id, trajectories_jsonl).status_code == 201
    again = _upload(client, dataset_id, trajectories_jsonl)
    assert again.status_code == 400
    assert "already" in again.json()["detail"]
    assert DatasetVersion.objects.count() == 1


def test_an_oversized_file_is_refused_naming_the_limit(client_for, trajectories_jsonl, settings):
    settings.DATASET_MAX_BYTES = 100
    client = client_for("operator")
    dataset_id = _create(client).json()["id"]
    response = _upload(client, dataset_id, trajectories_jsonl)
    assert response.status_code == 400
    assert "CRUCIBLE_DATASET_MAX_BYTES" in response.json()["detail"]
    assert DatasetVersion.objects.count() == 0


def test_an_unknown_kind_and_a_duplicate_name_get_field_errors(client_for):
    client = client_for("operator")
    bad_kind = _create(client, kind="images")
    assert bad_kind.status_code == 400 and "kind" in bad_kind.json()["fields"]
    assert _create(client).status_code == 201
    duplicate = _create(client)
    assert duplicate.status_code == 400 and "name" in duplicate.json()["fields"]
    assert Dataset.objects.count() == 1


def test_a_viewer_cannot_create_a_dataset(client_for):
    response = _create(client_for("viewer"))
    assert response.status_code == 403
    assert json.loads(response.content)["detail"]


def test_a_blank_or_spaced_name_is_refused_from_the_page_too(users, client):
    client.force_login(users["operator"])
    for name in ("", "has spaces", "x" * 101):
        response = client.post("/datasets/", {"name": name, "kind": "tasks"})
        assert response.status_code == 200
        assert b"name: use 1-100 letters" in response.content
    assert Dataset.objects.count() == 0
