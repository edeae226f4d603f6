"""Hard-data upsampling is a run's choice, shown with its effective settings: off by default, and when on the run
page names it as this run's setting, with its formula, and as a departure from uniform sampling."""

from __future__ import annotations

import pytest
from django.test import Client

from apps.runs.models import Run
from tests.factories import exact_answer_version, tasks_version
from workers.envs.registry import arithmetic_tasks

pytestmark = pytest.mark.django_db

TINY = {"base_model": "tiny-llama-smollm2-tokenizer", "steps": 2, "prompts_per_step": 2, "group_size": 2}


@pytest.fixture
def launch(users, client_for, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr("apps.runs.tasks.dispatch_run.delay", lambda run_id: None)
    owner = users["operator"]
    tasks = tasks_version(owner=owner, rows=arithmetic_tasks(8, seed=0))
    reward = exact_answer_version(owner=owner)

    def post(config):  # type: ignore[no-untyped-def]
        body = {"kind": "train", "dataset_version": tasks.pk, "reward_version": reward.pk, "config": config}
        return client_for("operator").post("/api/v1/runs/", body, format="json")

    return post


def _page(users, run_id: int) -> str:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(users["viewer"])
    response = client.get(f"/runs/{run_id}/")
    assert response.status_code == 200
    return response.content.decode()


def _row(html: str) -> str:
    table = html.split('id="effective-settings"', 1)[1].split("</table>", 1)[0]
    return table.split("<td><code>upsample_hard</code></td>", 1)[1].split("</tr>", 1)[0]


def test_upsampling_is_off_unless_the_run_turns_it_on(launch, users):
    reply = launch(TINY)
    assert reply.status_code == 201, reply.json()
    run = Run.objects.get(pk=reply.json()["id"])
    assert run.spec["config"]["upsample_hard"] == {"by": "off", "strength": 1.0, "max_weight": 4.0}
    html = _page(users, run.pk)
    assert "<td><code>off</code></td><td>grpo default</td>" in _row(html)
    assert "upsample_hard is on" not in html


def test_a_run_that_upsamples_hard_data_shows_it_with_its_formula(launch, users):
    reply = launch({**TINY, "upsample_hard": {"by": "turns", "strength": 2, "max_weight": 3}})
    assert reply.status_code == 201, reply.json()
    html = _page(users, reply.json()["id"])
    row = _row(html)
    assert "<td><code>by turns, strength 2, max_weight 3</code></td><td><strong>this run</strong></td>" in row
    assert "min(max_weight, 1 + strength * max(0, m / M - 1))" in row
    assert "Departs from the method: upsample_hard is on (by turns, strength 2, max_weight 3)" in html


def test_a_bad_upsampling_setting_is_a_400_naming_the_field(launch):
    reply = launch({**TINY, "upsample_hard": {"by": "turns", "max_weight": 0.5}})
    assert reply.status_code == 400
    assert "config.upsample_hard.max_weight" in reply.json()["fields"], reply.json()


def test_a_curriculum_on_tasks_without_hops_is_a_400_naming_the_row(launch):  # type: ignore[no-untyped-def]
    reply = launch({**TINY, "curriculum": {"by": "hops"}})
    assert reply.status_code == 400
    problems = reply.json()["fields"]["config.curriculum.by"]
    assert "task row 1" in problems[0] and "no integer 'hops'" in problems[0]
    assert not Run.objects.exists()
