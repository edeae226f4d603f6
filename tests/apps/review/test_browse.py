"""The trajectory browser and the run comparison pages."""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from apps.review.models import Flag
from apps.runs.models import MetricPoint, Run, TrajectorySummary
from tests.factories import context1_version, exact_answer_version

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(users):  # type: ignore[no-untyped-def]
    run = Run.objects.create(
        kind="train", name="r", spec={"config": {"learning_rate": 1e-5}}, created_by=users["operator"]
    )
    TrajectorySummary.objects.bulk_create(
        [
            TrajectorySummary(run=run, trajectory_id=f"t{i}", task_id=f"task-{i % 5}", step=i // 10, reward=i / 100)
            for i in range(120)
        ]
    )
    Flag.objects.create(run=run, trajectory_ref="t3", detector="repetition", detector_version="1", severity="high")
    Flag.objects.create(run=run, trajectory_ref="t4", detector="length_blowup", detector_version="1")
    return run


def _ids(html: str) -> list[str]:
    import re

    return re.findall(r"/trajectories/(t\d+)/", html)


def test_the_browser_filters_by_task_reward_step_and_flag(client, users, run) -> None:
    client.force_login(users["viewer"])
    url = f"/runs/{run.pk}/trajectories/"
    assert len(_ids(client.get(url).content.decode())) == 100  # a page
    assert sorted(_ids(client.get(url, {"task": "task-3", "step": "1"}).content.decode())) == ["t13", "t18"]
    ranged = _ids(client.get(url, {"min_reward": "0.5", "max_reward": "0.52", "order": "reward"}).content.decode())
    assert ranged == ["t52", "t51", "t50"]
    assert _ids(client.get(url, {"flag": "any", "order": "step"}).content.decode()) == ["t4", "t3"]
    assert _ids(client.get(url, {"flag": "repetition"}).content.decode()) == ["t3"]
    assert "t3" not in _ids(client.get(url, {"flag": "none"}).content.decode())
    second = client.get(url, {"page": "2"}).content.decode()
    assert len(_ids(second)) == 20 and "next" not in second.split("page 2")[-1]
    bad = client.get(url, {"min_reward": "lots"}).content.decode()
    assert "min_reward: &#x27;lots&#x27; is not a number" in bad


def test_the_browser_needs_a_login(client, run) -> None:
    assert client.get(f"/runs/{run.pk}/trajectories/").status_code == 302


def test_two_runs_compare_curves_config_and_reward(client, users, run) -> None:
    owner = users["operator"]
    run.reward_version = context1_version(owner=owner)
    run.save(update_fields=["reward_version"])
    other = Run.objects.create(
        kind="train",
        name="o",
        spec={"config": {"learning_rate": 3e-5}},
        reward_version=exact_answer_version(owner=owner),
        created_by=owner,
    )
    now = timezone.now()
    MetricPoint.objects.bulk_create(
        [
            MetricPoint(run=r, step=s, name="reward_mean", value=s * k, time=now)
            for r, k in ((run, 1), (other, 2))
            for s in range(1, 6)
        ]
    )
    client.force_login(users["viewer"])
    reply = client.get("/runs/compare/", {"run": [run.pk, other.pk]})
    html = reply.content.decode()
    assert reply.status_code == 200 and "<code>learning_rate</code>" in html and "0.00003" in html
    assert "terms" in html  # the reward config diff
    series = json.loads(html.split('id="compare-series" type="application/json">')[1].split("</script>")[0])
    assert [line["run"] for line in series["reward_mean"]] == [run.pk, other.pk]
    assert series["reward_mean"][1]["mean"] == [2.0, 4.0, 6.0, 8.0, 10.0]
    one = client.get("/runs/compare/", {"run": [run.pk]}).content.decode()
    assert "pick at least two runs" in one
    grouped = client.get(
        "/runs/compare/", {"run": [run.pk, other.pk], "group": "config.learning_rate"}
    ).content.decode()
    groups = json.loads(grouped.split('id="compare-groups" type="application/json">')[1].split("</script>")[0])
    assert len(set(groups.values())) == 2 and "config.learning_rate=" in grouped
    bad = client.get("/runs/compare/", {"run": [run.pk, other.pk], "group": "password"}).content.decode()
    assert "write config.&lt;key&gt; or summary.&lt;key&gt;" in bad and 'id="compare-groups"' not in bad


def test_the_run_page_shows_its_config_and_the_diff_to_its_parent(client, users, run) -> None:
    child = Run.objects.create(
        kind="train", name="child", spec={"config": {"learning_rate": 2e-5}}, parent=run, created_by=users["operator"]
    )
    client.force_login(users["viewer"])
    html = client.get(f"/runs/{child.pk}/").content.decode()
    assert f"Against the parent run {run.pk}" in html and "<code>learning_rate</code>" in html
    assert 'id="chart-pause"' in html and 'id="chart-filter"' in html
    assert "Same config" not in html
    assert "Against the parent" not in client.get(f"/runs/{run.pk}/").content.decode()
