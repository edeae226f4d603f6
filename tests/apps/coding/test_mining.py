"""Repository tasks mined from a git history (issue 40 part 3): the commits that change code and tests become tasks
whose fail-to-pass tests are found by running them; the mining run verifies and stores them like an import, and a
benchmark pinned from it keeps time order."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from apps.coding.services import repo_tasks_finalize
from apps.datasets.models import DatasetVersion
from apps.runs.models import Run, RunStatus
from apps.runs.services import worker_spec
from workers.coding.mining import MineParams, classify, mine
from workers.jobs.repomine import mine_and_import
from workers.specs import RepoMineSpec

pytestmark = pytest.mark.django_db

ENV = {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@x", "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@x"}


def git(repo: Path, *args: str, when: int = 0) -> str:
    env = {**ENV, "PATH": "/usr/bin:/bin", "HOME": str(repo)}
    if when:
        env |= {"GIT_AUTHOR_DATE": f"{when} +0000", "GIT_COMMITTER_DATE": f"{when} +0000"}
    done = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True)
    return done.stdout


def commit(repo: Path, files: dict[str, str], message: str, when: int) -> str:
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message, when=when)
    return git(repo, "rev-parse", "HEAD").strip()


CLAMP_TEST = "from mathx import clamp\n\n\ndef test_inside():\n    assert clamp(2, 0, 3) == 2\n"
UPPER_TEST = "\n\ndef test_upper():\n    assert clamp(5, 0, 3) == 3\n"
LOWER_TEST = "\n\ndef test_lower():\n    assert clamp(-1, 0, 3) == 0\n"


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    return make_history(tmp_path_factory.mktemp("mathx-history"))


def make_history(repo: Path) -> Path:
    """A small project's history: a start, two fixes with their tests (the second over two files), a docs-only
    change, and a code change whose tests already passed."""
    git(repo, "init", "-q", "-b", "main")
    commit(
        repo,
        {"mathx.py": "def clamp(x, lo, hi):\n    return x\n", "tests/test_clamp.py": CLAMP_TEST},
        "start",
        1_700_000_000,
    )
    commit(
        repo,
        {"mathx.py": "def clamp(x, lo, hi):\n    return min(x, hi)\n", "tests/test_clamp.py": CLAMP_TEST + UPPER_TEST},
        "clamp lets values above the maximum through",
        1_700_100_000,
    )
    commit(repo, {"README.md": "# mathx\n"}, "docs", 1_700_200_000)
    commit(
        repo,
        {
            "mathx.py": "from bounds import low\n\n\ndef clamp(x, lo, hi):\n    return low(min(x, hi), lo)\n",
            "bounds.py": "def low(x, lo):\n    return max(x, lo)\n",
            "tests/test_clamp.py": CLAMP_TEST + UPPER_TEST + LOWER_TEST,
        },
        "Values under the minimum come back unchanged.\n\nThey should be raised to it.",
        1_700_300_000,
    )
    refactor = {
        "bounds.py": "def low(x, lo):\n    return x if x > lo else lo\n",
        "tests/test_clamp.py": CLAMP_TEST + UPPER_TEST + LOWER_TEST + "\n",
    }
    commit(repo, refactor, "refactor", 1_700_400_000)
    return repo


def test_each_commit_with_code_and_tests_becomes_a_task_whose_fail_to_pass_tests_were_run(history) -> None:  # type: ignore[no-untyped-def]
    result = mine(history, MineParams(runs=2), repo="acme/mathx")
    by_message = {row["problem_statement"]: row for row in result.instances}
    assert set(by_message) == {
        "clamp lets values above the maximum through",
        "Values under the minimum come back unchanged.\n\nThey should be raised to it.",
    }
    lower = by_message["Values under the minimum come back unchanged.\n\nThey should be raised to it."]
    assert lower["FAIL_TO_PASS"] == ["tests/test_clamp.py::test_lower"]
    assert lower["PASS_TO_PASS"] == ["tests/test_clamp.py::test_inside", "tests/test_clamp.py::test_upper"]
    assert lower["files_changed"] == 2 and "bounds.py" in lower["patch"] and "test_lower" in lower["test_patch"]
    assert lower["created_at"].startswith("2023-11-18")
    dropped = result.report["dropped"]
    assert dropped["no_code_change"] == 1  # the docs commit
    assert dropped["no_fail_to_pass"] == 1 and dropped["merge_or_root"] == 1  # the refactor; the first commit


def test_a_test_that_changes_outcome_between_runs_is_flaky_and_in_neither_list() -> None:
    ids = ["t::a", "t::b", "t::c", "t::d"]
    before = [{"t::a": "failed", "t::b": "passed", "t::c": "passed", "t::d": "failed"}] * 2
    after = [
        {"t::a": "passed", "t::b": "passed", "t::c": "passed", "t::d": "passed"},
        {"t::a": "passed", "t::b": "passed", "t::c": "failed", "t::d": "missing"},
    ]
    assert classify(ids, before, after) == (["t::a"], ["t::b"], ["t::c", "t::d"])


def test_size_filters_drop_commits_and_count_them(history) -> None:  # type: ignore[no-untyped-def]
    result = mine(history, MineParams(min_lines=3, max_lines=5), repo="acme/mathx")
    assert result.report["dropped"]["too_small"] >= 1 or result.report["dropped"]["too_large"] >= 1
    assert all(3 <= row["lines_changed"] <= 5 for row in result.instances)


# --- through the control plane ----------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _storage(settings, tmp_path):  # type: ignore[no-untyped-def]
    settings.MEDIA_ROOT = tmp_path
    settings.STORAGES = {
        **settings.STORAGES,
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path)}},
    }


@pytest.fixture
def queued(monkeypatch):  # type: ignore[no-untyped-def]
    runs: list[int] = []
    monkeypatch.setattr("apps.runs.tasks.dispatch_run.delay", runs.append)
    return runs


def mine_request(client_for, role: str = "operator", **fields: Any):  # type: ignore[no-untyped-def]
    body = {"target_dataset": "mathx-mined", "location": "/srv/git/mathx", "repo": "acme/mathx", **fields}
    return client_for(role).post("/api/v1/repo-tasks/mine/", body, format="json")


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"repo": "not a name"}, "repo"),
        ({"location": "  "}, "location"),
        ({"params": {"max_commits": 0}}, "params.max_commits"),
        ({"params": {"test_pattern": "("}}, "params"),
        ({"params": {"nope": 1}}, "params.nope"),
        ({"benchmark": {"name": "x", "test_fraction": 2}}, "benchmark"),
    ],
)
def test_a_bad_mining_request_is_a_400_naming_the_field_and_creates_no_run(client_for, queued, fields, field) -> None:  # type: ignore[no-untyped-def]
    before = Run.objects.count()
    response = mine_request(client_for, **fields)
    assert response.status_code == 400 and field in json.dumps(response.json()), response.json()
    assert Run.objects.count() == before and queued == []


def test_a_viewer_cannot_mine(client_for, queued) -> None:  # type: ignore[no-untyped-def]
    assert mine_request(client_for, "viewer").status_code == 403


def test_a_mining_run_verifies_stores_and_pins_the_newest_commits_as_its_benchmark(client_for, queued, history) -> None:  # type: ignore[no-untyped-def]
    from apps.benchmarks.services.suites import codegen_heldout_benchmark

    response = mine_request(
        client_for, location=str(history), benchmark={"name": "mathx-mined-bench", "test_fraction": 0.5}
    )
    assert response.status_code == 201, response.json()
    run = Run.objects.get(pk=response.json()["id"])
    assert run.kind == "repomine" and run.spec["benchmark"]["split"] == "time"
    report = mine_and_import(RepoMineSpec.model_validate(worker_spec(run)))
    assert report["kept"] == 2 and report["mining"]["candidates"] == 3 and report["refused"] == []
    assert report["statistics"]["tasks"] == 2
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    repo_tasks_finalize(run_id=run.pk)
    codegen_heldout_benchmark(run_id=run.pk)
    run.refresh_from_db()
    version = DatasetVersion.objects.get(pk=run.summary["repo_tasks"]["version"])
    assert version.row_count == 2
    outcome = run.summary["benchmark"]
    test = DatasetVersion.objects.get(pk=outcome["test_version"])
    [held_out] = [json.loads(line) for line in test.file.read().splitlines()]
    assert held_out["instruction"].startswith("Values under the minimum")  # the newer of the two commits
    page = client_for("viewer").get(f"/api/v1/repo-tasks/{run.pk}/")
    assert page.status_code == 200 and page.json()["report"]["mining"]["kept"] == 2


def test_the_mining_run_page_shows_the_mining_and_the_suite_beside_cursorbench(
    client_for, client, users, queued, history
) -> None:  # type: ignore[no-untyped-def]
    response = mine_request(client_for, location=str(history))
    run = Run.objects.get(pk=response.json()["id"])
    mine_and_import(RepoMineSpec.model_validate(worker_spec(run)))
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    repo_tasks_finalize(run_id=run.pk)
    client.force_login(users["viewer"])
    page = client.get(f"/coding/runs/{run.pk}/").content.decode()
    assert "Tasks mined from acme/mathx" in page and "changed code and tests" in page
    assert "no_fail_to_pass" in page and "Median files changed by the reference patch" in page and "181" in page
