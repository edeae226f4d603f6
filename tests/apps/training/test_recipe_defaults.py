"""A recipe's environment brings the recipe's defaults (issue 36, section 2): a training launch on `swarm` or
`search` that names no algorithm, substeps or reward gets the recipe's (Kimi K2.5's loss and PARL; CISPO, 4
substeps and Context-1's reward), in the job the worker receives and on the run page as the defaults they are;
PARL's λ1, λ2 anneal over the run's own steps, and a longer horizon is a warning on the run page."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from apps.rewards.models import RewardConfigVersion
from apps.rewards.services import reward_config_create
from apps.runs.models import Run
from tests.apps.training.test_train_launch import search_world  # noqa: F401  (the fixture)
from workers.rewards.schema import anneal_horizons, context1_spec, parl_spec, validate_reward_spec

pytestmark = pytest.mark.django_db

TINY = {"base_model": "tiny-llama-smollm2-tokenizer", "steps": 2, "prompts_per_step": 2, "group_size": 2}
SWARM = {**TINY, "environment": "swarm", "env_params": {"max_turns": 3}}
SEARCH = {**TINY, "environment": "search", "env_params": {"max_turns": 2}}


def _launch(client_for: Any, world: dict[str, Any], config: dict[str, Any], **extra: Any) -> Any:
    body = {
        "kind": "train",
        "dataset_version": world["tasks"].pk,
        "corpus_version": world["corpus"].pk,
        "config": config,
        **extra,
    }
    return client_for("operator").post("/api/v1/runs/", body, format="json")


def _run(reply: Any) -> Run:
    assert reply.status_code == 201, reply.json()
    return Run.objects.get(pk=reply.json()["id"])


def _page(users: dict[str, Any], run: Run) -> str:
    client = Client()
    client.force_login(users["viewer"])
    response = client.get(f"/runs/{run.pk}/")
    assert response.status_code == 200
    return response.content.decode()


def test_a_swarm_launch_naming_nothing_trains_with_kimis_loss_and_parl(client_for, search_world, users):  # noqa: F811
    search_world["ready"]()
    run = _run(_launch(client_for, search_world, SWARM))
    config, job = run.spec["config"], run.spec["job"]
    assert (config["algorithm"], config["algorithm_default_of"]) == ("kimi", "swarm")
    assert job["config"]["algorithm"] == "kimi" and job["config"]["substeps"] == 1
    assert run.reward_version is not None and run.reward_version.config.name == "recipe-swarm"
    assert run.spec["reward_default_of"] == "swarm"
    stored = validate_reward_spec(run.reward_version.spec)
    assert stored == parl_spec()  # the recipe's reward, its horizon left to the run
    # The worker's reward anneals λ1, λ2 over the run's two steps (0-based 0 and 1): zero at the last.
    assert anneal_horizons(validate_reward_spec(job["reward"])) == {"parallel_instantiation": 1, "subagent_finish": 1}
    html = _page(users, run)
    assert "algorithm <code>kimi</code> (swarm's recipe default)" in html
    assert """id="reward-default">(swarm's recipe default: the launch named no reward)""" in html
    assert "anneal-warning" not in html


def test_a_search_launch_naming_nothing_trains_with_cispo_4_substeps_and_context1(
    client_for,
    search_world,  # noqa: F811
    users,
):
    search_world["ready"]()
    run = _run(_launch(client_for, search_world, SEARCH))
    job = run.spec["job"]
    assert (job["config"]["algorithm"], job["config"]["algorithm_default_of"]) == ("cispo", "search")
    assert (job["config"]["substeps"], job["config"]["substeps_default_of"]) == (4, "search")
    assert job["reward"] == context1_spec().model_dump(mode="json")
    assert run.reward_version is not None and run.reward_version.config.name == "recipe-search"
    html = _page(users, run)
    for shown in (
        "algorithm <code>cispo</code> (search's recipe default)",
        "substeps <code>4</code>",
        "sampling.max_new_tokens <code>256</code>",
    ):
        assert shown in html
    assert (job["config"]["sampling"]["max_new_tokens"], job["config"]["max_new_tokens_default_of"]) == (256, "search")
    again = _run(_launch(client_for, search_world, SEARCH))
    assert again.reward_version == run.reward_version  # one version per recipe, not one per launch
    assert job["config"]["group_size"] == 2  # named: kept
    unnamed = _run(_launch(client_for, search_world, {k: v for k, v in SEARCH.items() if k != "group_size"}))
    config = unnamed.spec["job"]["config"]
    assert (config["group_size"], config["group_size_default_of"]) == (8, "search")
    assert "group_size <code>8</code>" in _page(users, unnamed)
    assert RewardConfigVersion.objects.filter(config__name="recipe-search").count() == 1


def test_explicit_choices_override_the_recipe(client_for, search_world, users):  # noqa: F811
    search_world["ready"]()
    config = {**SEARCH, "algorithm": "grpo", "substeps": 1, "sampling": {"max_new_tokens": 32}}
    run = _run(_launch(client_for, search_world, config, reward_version=search_world["reward"].pk))
    job = run.spec["job"]
    assert (job["config"]["algorithm"], job["config"]["algorithm_default_of"]) == ("grpo", None)
    assert (job["config"]["substeps"], job["config"]["substeps_default_of"]) == (1, None)
    assert (job["config"]["sampling"]["max_new_tokens"], job["config"]["max_new_tokens_default_of"]) == (32, None)
    assert run.reward_version == search_world["reward"] and "reward_default_of" not in run.spec
    html = _page(users, run)
    assert 'id="recipe-defaults"' not in html and 'id="reward-default"' not in html


def test_a_parl_horizon_longer_than_the_run_is_a_warning_on_the_run_page(client_for, search_world, users):  # noqa: F811
    search_world["ready"]()
    owner = search_world["owner"]
    long = reward_config_create(
        name="parl-100", spec=parl_spec(anneal_steps=100).model_dump(mode="json"), owner=owner
    ).versions.get()
    fits = reward_config_create(
        name="parl-1", spec=parl_spec(anneal_steps=1).model_dump(mode="json"), owner=owner
    ).versions.get()
    warned = _run(_launch(client_for, search_world, SWARM, reward_version=long.pk))
    # An explicit horizon is kept, in the stored reward and in the worker's.
    assert set(anneal_horizons(validate_reward_spec(warned.spec["job"]["reward"])).values()) == {100}
    html = _page(users, warned)
    assert "anneal-warning" in html
    warning = "reward term parallel_instantiation anneals its weight to 0 over 100 steps, longer than the run&#x27;s 2"
    assert warning in html
    assert "99% of it is left at the last step" in html
    quiet = _run(_launch(client_for, search_world, SWARM, reward_version=fits.pk))
    assert "anneal-warning" not in _page(users, quiet)


def test_an_environment_without_a_recipe_reward_needs_one_named(client_for, search_world):  # noqa: F811
    search_world["ready"]()
    refused = _launch(client_for, search_world, {**TINY, "environment": "exact_answer"})
    assert refused.status_code == 400
    assert (
        "environment 'exact_answer' has no recipe reward: name a reward config version"
        in (refused.json()["fields"]["reward_version"][0])
    )
    sft = client_for("operator").post(
        "/api/v1/runs/",
        {"kind": "sft", "dataset_version": search_world["tasks"].pk, "config": {}},
        format="json",
    )
    assert sft.status_code == 400
    assert "sft runs need a reward config version" in sft.json()["fields"]["reward_version"][0]
    assert not Run.objects.filter(kind__in=["train", "sft"]).exists()


def test_the_launch_form_shows_the_recipe_defaults_and_launches_with_them(client, search_world):  # noqa: F811
    search_world["ready"]()
    client.force_login(search_world["owner"])
    page = client.get("/runs/new/train/").content.decode()
    assert "(the environment&#x27;s recipe default: composer on coding_agent, cispo on search, kimi on swarm; grpo" in (
        page
    )
    assert "substeps (empty: the environment&#x27;s recipe default: 4 on search; 1 otherwise)" in page
    assert 'data-envs="search swarm"' in page and "Kimi K2.5&#x27;s PARL (K1) on swarm" in page
    form = {
        "dataset_version": search_world["tasks"].pk,
        "corpus_version": search_world["corpus"].pk,
        "reward_version": "",
        "algorithm": "",
        "substeps": "",
        "environment": "search",
        **{key: str(value) for key, value in TINY.items()},
        "env_params": '{"max_turns": 2}',
    }
    assert client.post("/runs/new/train/", form).status_code == 302
    run = Run.objects.get(kind="train")
    assert (run.spec["config"]["algorithm"], run.spec["config"]["substeps"]) == ("cispo", 4)
    assert run.spec["reward_default_of"] == "search"
