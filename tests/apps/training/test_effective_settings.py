"""A training run's page shows its effective algorithm settings: the algorithm's defaults (docs/methods.md) merged with
the run's overrides, each marked with where it comes from, and any departure from the method; a launch that cannot
work is a 400 naming the field."""

from __future__ import annotations

import re

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


def _settings_table(html: str) -> dict[str, tuple[str, str]]:
    """{setting: (value, origin)} from the run page's effective-settings table."""
    table = html.split('id="effective-settings"', 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr><td><code>([^<]+)</code></td><td><code>([^<]*)</code></td><td>(.*?)</td>", table)
    return {name: (value, re.sub(r"<[^>]+>", "", origin)) for name, value, origin in rows}


def _page(users, run_id: int) -> str:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(users["viewer"])
    response = client.get(f"/runs/{run_id}/")
    assert response.status_code == 200
    return response.content.decode()


def test_a_dr_grpo_run_shows_no_std_division_as_its_methods_default(launch, users):
    reply = launch({**TINY, "algorithm": "dr_grpo"})
    assert reply.status_code == 201, reply.json()
    run = Run.objects.get(pk=reply.json()["id"])
    assert run.spec["config"]["scale_rewards"] is None  # stored as "the algorithm's", resolved on the page

    table = _settings_table(_page(users, run.pk))

    assert table["scale_rewards"] == ("none", "dr_grpo default")
    assert table["drop_equal_groups"] == ("true", "dr_grpo default")
    assert table["loss.max_completion_length"] == ("64", "dr_grpo default")  # 64 new tokens x 1 turn
    assert table["loss.kl_coef"] == ("0.0", "dr_grpo default")
    assert "dynamic_sampling_max_rounds" not in table


def test_overrides_are_marked_as_this_runs_and_departures_are_named(launch, users):
    config = {**TINY, "algorithm": "dapo", "scale_rewards": "none", "dynamic_sampling": False, "loss": {"kl_coef": 0.1}}
    reply = launch(config)
    assert reply.status_code == 201, reply.json()

    html = _page(users, reply.json()["id"])
    table = _settings_table(html)

    assert table["scale_rewards"] == ("none", "this run")
    assert table["dynamic_sampling"] == ("false", "this run")
    assert table["overlong_penalty"] == ("true", "dapo default")
    assert table["overlong_cache_tokens"] == ("13", "dapo default")  # a fifth of L_max = 64
    assert table["loss.epsilon_high"] == ("0.28", "dapo default")
    assert table["loss.kl_coef"] == ("0.1", "this run")
    assert table["loss.kl_placement"] == ("loss", "dapo default")
    assert "Departs from the method: scale_rewards=&#x27;none&#x27;" in html
    assert "Departs from the method: dynamic_sampling is off" in html


def test_a_composer_run_shows_its_k1_kl_as_a_reward_penalty(launch, users):
    reply = launch({**TINY, "algorithm": "composer"})
    assert reply.status_code == 201, reply.json()

    table = _settings_table(_page(users, reply.json()["id"]))

    assert table["loss.kl_estimator"] == ("k1", "composer default")
    assert table["loss.kl_placement"] == ("reward", "composer default")
    assert table["scale_rewards"] == ("none", "composer default")


def test_a_run_stored_before_the_defaults_moved_shows_what_it_ran_with(users):
    """Older runs stored scale_rewards="group" and drop_equal_groups=true for every algorithm: the page shows them
    as this run's choices, and that a dr_grpo run so configured departs from P2."""
    config = {**TINY, "algorithm": "dr_grpo", "scale_rewards": "group", "drop_equal_groups": True}
    run = Run.objects.create(kind="train", name="old", spec={"config": config}, created_by=users["operator"])

    html = _page(users, run.pk)

    assert _settings_table(html)["scale_rewards"] == ("group", "this run")
    assert "does not divide advantages by the group std" in html


def test_other_kinds_and_unreadable_configs_show_no_table(users):
    rescore = Run.objects.create(kind="rescore", name="r", spec={}, created_by=users["operator"])
    broken = Run.objects.create(
        kind="train", name="b", spec={"config": {"algorithm": "ppo"}}, created_by=users["operator"]
    )
    for run in (rescore, broken):
        assert 'id="effective-settings"' not in _page(users, run.pk)


@pytest.mark.parametrize(
    ("config", "field", "words"),
    [
        ({"algorithm": "dapo", "drop_equal_groups": False}, "config.dynamic_sampling", "unset drop_equal_groups"),
        ({"loss": {"kl_estimator": "k1", "kl_placement": "loss"}}, "config.loss", "kl_placement='reward'"),
        ({"overlong_penalty": True, "overlong_cache_tokens": 100}, "config.overlong_cache_tokens", "at most 64"),
    ],
)
def test_a_launch_that_cannot_work_is_a_400_naming_the_field(launch, config, field, words):
    reply = launch({**TINY, **config})
    assert reply.status_code == 400, reply.json()
    fields = reply.json()["fields"]
    assert field in fields and words in " ".join(fields[field]), fields
