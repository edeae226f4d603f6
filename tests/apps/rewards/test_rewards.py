from __future__ import annotations

import copy

import pytest

from apps.rewards.models import RewardConfigVersion
from workers.rewards.schema import context1_spec

pytestmark = pytest.mark.django_db


def _spec() -> dict:
    return context1_spec().model_dump(mode="json")


def test_an_invalid_term_is_a_400_naming_the_term_and_the_field(client_for):
    spec = _spec()
    spec["terms"][0]["beta"] = -1
    response = client_for("operator").post("/api/v1/reward-configs/", {"name": "r", "spec": spec}, format="json")
    assert response.status_code == 400
    body = response.json()
    assert "f_beta" in body["detail"] and "beta" in body["detail"]
    assert RewardConfigVersion.objects.count() == 0


def test_an_unknown_term_type_lists_the_valid_types(client_for):
    spec = {"terms": [{"type": "vibes", "weight": 1.0}]}
    response = client_for("operator").post("/api/v1/reward-configs/", {"name": "r", "spec": spec}, format="json")
    assert response.status_code == 400
    assert "f_beta" in response.json()["detail"]


def test_editing_makes_a_new_hashed_version_and_the_diff_names_the_change(client_for):
    client = client_for("operator")
    created = client.post("/api/v1/reward-configs/", {"name": "r", "spec": _spec()}, format="json")
    assert created.status_code == 201
    config_id = created.json()["id"]
    spec = copy.deepcopy(_spec())
    spec["terms"][0]["beta"] = 2.0
    second = client.post(
        f"/api/v1/reward-configs/{config_id}/versions/", {"spec": spec, "notes": "anneal"}, format="json"
    )
    assert second.status_code == 201
    v1, v2 = RewardConfigVersion.objects.order_by("number")
    assert (v1.number, v2.number) == (1, 2)
    assert v1.content_hash != v2.content_hash
    assert v2.parent_id == v1.pk
    diff = client.get(f"/api/v1/reward-versions/{v1.pk}/diff/{v2.pk}/").json()
    assert diff["changes"] == [{"path": "terms.f_beta.beta", "change": "changed", "old": 4.0, "new": 2.0}]


def test_saving_an_identical_spec_is_refused(client_for):
    client = client_for("operator")
    config_id = client.post("/api/v1/reward-configs/", {"name": "r", "spec": _spec()}, format="json").json()["id"]
    again = client.post(f"/api/v1/reward-configs/{config_id}/versions/", {"spec": _spec()}, format="json")
    assert again.status_code == 400
    assert RewardConfigVersion.objects.count() == 1


def test_a_version_cannot_be_edited_in_place(client_for):
    client = client_for("admin")
    client.post("/api/v1/reward-configs/", {"name": "r", "spec": _spec()}, format="json")
    version = RewardConfigVersion.objects.get()
    for method in (client.put, client.patch, client.delete):
        assert method(f"/api/v1/reward-versions/{version.pk}/", {"spec": {}}, format="json").status_code == 405
    version.refresh_from_db()
    assert version.spec == _spec()
