"""The training form's basic view and recipes (issue 39 part 5): dataset, environment, model, recipe and steps up
front, everything else under Advanced; the default recipe is the example run's (LoRA 16, minutes on 2 cores) and
its estimate is under 10 minutes here; datasets are offered for the environments that train on them, and the
default pairs the default environment with a dataset it accepts."""

from __future__ import annotations

import re

import pytest

from apps.datasets.models import Dataset, DatasetKind, DatasetVersion
from apps.runs.models import Run
from apps.training.launch_form import CALIBRATION_SECONDS_PER_SLOT, recipe_presets
from tests.factories import exact_answer_version, tasks_version
from workers.envs.registry import arithmetic_tasks
from workers.rl.example_recipe import EXAMPLE_CONFIG

pytestmark = pytest.mark.django_db


@pytest.fixture
def form_data(users):  # type: ignore[no-untyped-def]
    owner = users["operator"]
    # Alphabetically first, and a kind exact_answer cannot train on: the form must not preselect it.
    repo = Dataset.objects.create(name="aaa-repo-tasks", kind=DatasetKind.REPO_TASKS, owner=owner)
    DatasetVersion.objects.create(
        dataset=repo, number=1, file="x.jsonl", row_count=3, size_bytes=1, content_hash="r" * 64, created_by=owner
    )
    tasks = tasks_version(owner=owner, rows=arithmetic_tasks(128, seed=0), name="zzz-arith")
    reward = exact_answer_version(owner=owner)
    return repo.versions.get(), tasks, reward


def _form_values(html: str) -> dict[str, str]:
    """What the browser would submit: each input's value, each select's selected option, checked checkboxes."""
    values: dict[str, str] = {}
    for name, value in re.findall(r'<input name="([^"]+)" value="([^"]*)"', html):
        values[name] = value
    for name, body in re.findall(r'<select name="([^"]+)"[^>]*>(.*?)</select>', html, re.S):
        chosen = re.search(r'<option value="([^"]*)"[^>]*\bselected\b', body)
        first = re.search(r'<option value="([^"]*)"', body)
        values[name] = chosen.group(1) if chosen else (first.group(1) if first else "")
    for name in re.findall(r'<input type="checkbox" name="([^"]+)" checked>', html):
        values[name] = "on"
    values["env_params"] = '{"answer_format": "last_number"}'
    return values


def test_the_basic_view_shows_five_choices_and_folds_the_rest(client, users, form_data) -> None:
    client.force_login(users["operator"])
    html = client.get("/runs/new/train/").content.decode()
    basic, advanced = html.split('<details id="advanced"')
    for name in ("dataset_version", "base_model", "environment", "recipe", "steps"):
        assert f'name="{name}"' in basic, name
    for name in ("learning_rate", "lora.rank", "group_size", "reward_version", "compute.cpus", "loss"):
        assert f'name="{name}"' not in basic and f'name="{name}"' in advanced, name
    assert 'id="run-estimate"' in basic  # the estimate beside the basic choices


def test_the_default_recipe_is_the_examples_and_the_default_dataset_fits_the_default_environment(
    client, users, form_data
) -> None:
    repo, tasks, _ = form_data
    client.force_login(users["operator"])
    html = client.get("/runs/new/train/").content.decode()
    values = _form_values(html)
    assert values["recipe"] == "cpu-lora"
    assert values["lora.rank"] == "16" and float(values["learning_rate"]) == EXAMPLE_CONFIG["learning_rate"]
    assert values["steps"] == "12" and values["sampling.max_new_tokens"] == "24"
    assert values["dataset_version"] == str(tasks.pk)  # not the repository tasks listed first
    assert f'value="{repo.pk}" data-envs="coding_agent"' in html
    assert re.search(rf'value="{tasks.pk}" data-envs="[^"]*\bexact_answer\b', html)


def test_the_default_launch_is_accepted_and_its_estimate_is_under_ten_minutes(client, users, form_data) -> None:
    client.force_login(users["operator"])
    values = _form_values(client.get("/runs/new/train/").content.decode())
    reply = client.post("/runs/new/train/", values)
    assert reply.status_code == 302, reply.content.decode()[:3000]
    run = Run.objects.get()
    config = run.spec["config"]
    assert config["lora"]["rank"] == 16 and config["learning_rate"] == EXAMPLE_CONFIG["learning_rate"]
    assert config["steps"] == 12 and config["base_model"] == "smollm2-135m-instruct"
    # launch.js's estimate: steps x prompts x group x max_new_tokens slots at the model's rate.
    slots = config["steps"] * config["prompts_per_step"] * config["group_size"] * config["sampling"]["max_new_tokens"]
    assert slots * CALIBRATION_SECONDS_PER_SLOT[config["base_model"]] < 10 * 60


def test_the_paper_recipe_carries_the_reported_settings_and_custom_changes_nothing() -> None:
    defaults = {"learning_rate": "1e-06", "steps": "20", "lora.rank": "", "algorithm": ""}
    presets = {r["name"]: r["settings"] for r in recipe_presets(defaults)}
    assert presets["paper"]["learning_rate"] == "1e-06" and presets["paper"]["lora.rank"] == ""
    assert presets["cpu-lora"]["lora.rank"] == "16" and presets["custom"] == {}
