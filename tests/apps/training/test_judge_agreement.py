"""The reward config page reports, per version with a rubric judge, how the judge agrees with the version's
code-verified terms over the trajectories its runs scored."""

from __future__ import annotations

import pytest

from apps.rewards.services import reward_config_create
from apps.runs.models import TrajectorySummary

pytestmark = pytest.mark.django_db


def test_the_fragment_compares_the_judge_with_each_verified_term(client, users, run) -> None:  # type: ignore[no-untyped-def]
    spec = {
        "terms": [
            {"type": "normalized_match"},
            {"type": "rubric_judge", "name": "grm", "judge": "tiny-llama-smollm2-tokenizer"},
        ]
    }
    config = reward_config_create(name="judged", description="", spec=spec, owner=users["operator"])
    run.reward_version = config.versions.get()
    run.save(update_fields=["reward_version"])
    for i, (judged, verified) in enumerate([(0.9, 1.0), (0.8, 1.0), (0.2, 0.0), (0.7, 0.0)]):
        TrajectorySummary.objects.create(
            run=run, trajectory_id=f"t{i}", terms={"grm": judged, "normalized_match": verified}, reward=verified
        )
    client.force_login(users["viewer"])
    page = client.get(f"/rewards/{config.pk}/").content.decode()
    assert f'hx-get="/rewards/{config.pk}/judge-agreement/"' in page
    fragment = client.get(f"/rewards/{config.pk}/judge-agreement/").content.decode()
    assert "v1: the judge against the verified reward" in fragment
    assert "<td>grm</td><td>normalized_match</td><td>4</td>" in fragment and "<td>0.750</td>" in fragment
