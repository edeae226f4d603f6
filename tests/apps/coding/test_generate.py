"""Repository-task generation in the control plane: the launch (API and page) checks its parameters, the job gets
exactly its input, and a viewer may read but not launch."""

from __future__ import annotations

import json

import pytest

from apps.coding.services import job_outputs
from apps.datasets.models import DatasetKind
from apps.datasets.services import dataset_create
from apps.runs.models import Run
from apps.runs.services import worker_spec
from workers.specs import CodegenSpec

pytestmark = pytest.mark.django_db


@pytest.fixture
def queued(monkeypatch):  # type: ignore[no-untyped-def]
    runs: list[int] = []
    monkeypatch.setattr("apps.runs.tasks.dispatch_run.delay", runs.append)
    return runs


def post(client_for, role: str = "operator", **body):  # type: ignore[no-untyped-def]
    return client_for(role).post("/api/v1/repo-tasks/generate/", body, format="json")


def test_an_operator_launches_a_generation_run_whose_job_gets_its_parameters_and_outputs(  # type: ignore[no-untyped-def]
    client_for, queued, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = post(client_for, target_dataset="toolz-tasks", params={"sources": ["toolz"], "max_tasks": 5})
    assert response.status_code == 201, response.content
    run = Run.objects.get(pk=response.json()["id"])
    assert queued == [run.pk] and run.kind == "codegen" and run.progress_total == 5
    spec = CodegenSpec.model_validate(worker_spec(run))
    assert spec.sources == ["toolz"] and spec.max_tasks == 5
    assert spec.output_uri.endswith(job_outputs(run)["tasks"]) and spec.snapshot_root.endswith("repo-snapshots")


@pytest.mark.parametrize(
    "params, field, words",
    [
        ({"sources": ["inflection"]}, "params.sources", "unknown source"),
        ({"families": ["rewrite"]}, "params.families.0", "repair"),
        ({"max_tasks": 0}, "params.max_tasks", "greater than or equal to 1"),
        ({"operators": ["swap_everything"]}, "params.operators", "unknown operator"),
        ({"colour": "blue"}, "params.colour", "not permitted"),
    ],
)
def test_bad_parameters_are_a_400_naming_the_field_and_create_nothing(client_for, queued, params, field, words):  # type: ignore[no-untyped-def]
    response = post(client_for, target_dataset="x-tasks", params=params)
    assert response.status_code == 400, response.content
    assert field in response.json()["fields"] and words in str(response.json()["fields"][field]), response.json()
    assert not Run.objects.exists() and queued == []


def test_a_target_dataset_of_another_kind_or_a_bad_name_is_a_400(client_for, users, queued):  # type: ignore[no-untyped-def]
    dataset_create(name="plain", kind=DatasetKind.TASKS, owner=users["operator"])
    for name in ("plain", "no spaces please", ""):
        response = post(client_for, target_dataset=name, params={})
        assert response.status_code == 400 and "target_dataset" in response.json()["fields"], response.content
    assert not Run.objects.exists()


def test_a_viewer_reads_the_sources_but_cannot_generate(client_for, queued):  # type: ignore[no-untyped-def]
    assert post(client_for, role="viewer", target_dataset="v-tasks", params={}).status_code == 403
    sources = client_for("viewer").get("/api/v1/repo-tasks/sources/")
    assert sources.status_code == 200
    names = [source["name"] for source in sources.json()]
    assert len(names) >= 2 and "inflection" not in names and "parse" not in names
    assert all(len(source["sha256"]) == 64 and source["license"] for source in sources.json())


def test_the_generate_page_launches_and_names_a_bad_field(client, users, queued):  # type: ignore[no-untyped-def]
    client.force_login(users["operator"])
    page = client.get("/coding/generate/").content.decode()
    assert "toolz" in page and "Repair" in page
    refused = client.post("/coding/generate/", {"target_dataset": "p-tasks", "sources": ["toolz"], "max_tasks": "zero"})
    assert refused.status_code == 200 and "max_tasks" in refused.content.decode() and not Run.objects.exists()
    made = client.post("/coding/generate/", {"target_dataset": "p-tasks", "sources": ["toolz"], "max_tasks": "3"})
    run = Run.objects.get(kind="codegen")
    assert made.status_code == 302 and made["Location"] == f"/coding/runs/{run.pk}/"
    assert run.spec["params"]["sources"] == ["toolz"] and run.spec["params"]["max_tasks"] == 3


def _generated_rows(count: int) -> bytes:
    from tests.apps.coding.test_import import HIDDEN, PATCH
    from workers.coding.task import RepoTask

    rows = []
    for n in range(count):
        task = RepoTask.model_validate(
            {
                "id": f"mathx-repair-{n}",
                "instruction": "clamp() lets values above the maximum through. Fix it.",
                "snapshot": {"sha256": f"{n:064x}", "uri": f"file:///nowhere/{n:064x}.tar.gz"},
                "hidden_tests": {
                    "files": {"tests/test_clamp.py": HIDDEN},
                    "fail_to_pass": ["tests/test_clamp.py::test_upper"],
                },
                "reference_patch": PATCH,
                "family": "repair" if n % 2 else "implement",
                "source": {"library": "mathx", "function": "clamp"},
                "provenance": {"kind": "generated", "ids": {"run": 1}},
            }
        )
        rows.append(json.dumps(task.to_row(), sort_keys=True) + "\n")
    return "".join(rows).encode()


def test_a_generation_run_that_asks_for_a_benchmark_gets_its_held_out_part_pinned(users, queued, settings, tmp_path):  # type: ignore[no-untyped-def]
    from django.core.files.base import ContentFile
    from django.core.files.storage import default_storage

    from apps.benchmarks.models import BenchmarkVersion
    from apps.benchmarks.services.suites import codegen_heldout_benchmark
    from apps.coding.services import codegen_launch, repo_tasks_finalize
    from apps.datasets.models import DatasetVersion
    from apps.runs.models import RunStatus

    settings.STORAGES = {
        **settings.STORAGES,
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path)}},
    }
    run = codegen_launch(
        target_dataset="mathx-gen",
        params={"sources": ["toolz"], "max_tasks": 8},
        benchmark={"name": "mathx-bench", "test_fraction": 0.25},
        user=users["operator"],
    )
    names = job_outputs(run)
    default_storage.save(names["tasks"], ContentFile(_generated_rows(8)))
    default_storage.save(names["report"], ContentFile(json.dumps({"kept": 8, "candidates": 20, "dropped": {}})))
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    repo_tasks_finalize(run_id=run.pk)
    codegen_heldout_benchmark(run_id=run.pk)
    codegen_heldout_benchmark(run_id=run.pk)  # idempotent
    run.refresh_from_db()
    outcome = run.summary["benchmark"]
    version = BenchmarkVersion.objects.get(pk=outcome["benchmark_version"])
    test = DatasetVersion.objects.get(pk=outcome["test_version"])
    train = DatasetVersion.objects.get(pk=outcome["train_version"])
    assert version.benchmark.environment == "coding_agent" and version.task_count == test.row_count == 2
    assert train.row_count == 6 and train.dataset.name == "mathx-gen-train"
    assert list(version.excluded_training_data.all()) == [test]
    assert BenchmarkVersion.objects.count() == 1


@pytest.mark.parametrize(
    "benchmark", [{"name": "bad name"}, {"name": "b", "test_fraction": 1.5}, {"name": "b", "x": 1}]
)
def test_a_malformed_benchmark_option_is_a_400(client_for, queued, benchmark):  # type: ignore[no-untyped-def]
    response = post(client_for, target_dataset="t-tasks", params={}, benchmark=benchmark)
    assert response.status_code == 400 and "benchmark" in response.json()["fields"], response.content
    assert not Run.objects.exists()


def test_the_coding_demo_starts_one_generation_then_gates_on_its_held_out_benchmark(users, queued):  # type: ignore[no-untyped-def]
    from apps.accounts.models import Role
    from apps.benchmarks.services import benchmark_create, benchmark_version_create
    from apps.gates.models import Gate
    from apps.web.demo import CODING_BENCHMARK, CODING_GATE, CODING_SUITE, start_coding_demo

    assert "builds demo-repo-tasks" in start_coding_demo()
    run = Run.objects.get(kind="codegen")
    assert run.spec["target_dataset"] == CODING_SUITE and run.spec["benchmark"]["name"] == CODING_BENCHMARK
    assert "on its way" in start_coding_demo() and Run.objects.filter(kind="codegen").count() == 1
    admin = users[Role.ADMIN]
    benchmark = benchmark_create(name=CODING_BENCHMARK, environment="coding_agent", owner=admin)
    rows = [json.loads(line) for line in _generated_rows(2).splitlines()]
    benchmark_version_create(benchmark=benchmark, tasks=rows, created_by=admin)
    assert "created the gate" in start_coding_demo()
    assert Gate.objects.get(name=CODING_GATE).benchmark_versions.count() == 1
    assert "ready" in start_coding_demo()


def test_the_generate_page_passes_the_small_model_family_options_through(client, users, queued):  # type: ignore[no-untyped-def]
    """Operators, single_site and instruction_style from the form reach the job's params; a bad style is named."""
    client.force_login(users["operator"])
    page = client.get("/coding/generate/").content.decode()
    assert 'name="single_site"' in page and 'value="pinpoint"' in page and 'value="negate"' in page
    bad = {"target_dataset": "s-tasks", "sources": ["toolz"], "instruction_style": "exact"}
    refused = client.post("/coding/generate/", bad)
    assert refused.status_code == 200 and "instruction_style" in refused.content.decode() and not Run.objects.exists()
    form = {
        "target_dataset": "s-tasks",
        "sources": ["toolz"],
        "families": ["repair"],
        "operators": ["compare", "negate"],
        "single_site": "on",
        "instruction_style": "pinpoint",
    }
    assert client.post("/coding/generate/", form).status_code == 302
    params = Run.objects.get(kind="codegen").spec["params"]
    assert params["operators"] == ["compare", "negate"] and params["single_site"] is True
    assert params["instruction_style"] == "pinpoint"
