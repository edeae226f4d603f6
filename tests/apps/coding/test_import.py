"""Repository-task import in the control plane: the upload checked at launch (API, page, manage.py), the import job
on exactly the input the control plane hands over (real sandbox), and finalize (all or nothing, idempotent)."""

from __future__ import annotations

import io
import json
import logging
import tarfile
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from apps.benchmarks.models import BenchmarkTask
from apps.coding.services import job_outputs, repo_import_launch, repo_tasks_finalize
from apps.datasets.models import Dataset, DatasetKind, DatasetVersion
from apps.datasets.services import dataset_create, dataset_version_create
from apps.runs.models import Run, RunStatus
from apps.runs.services import worker_spec
from workers.jobs.repoimport import import_tasks
from workers.specs import RepoImportSpec

pytestmark = pytest.mark.django_db

MODULE = "def clamp(x, lo, hi):\n    return max(lo, x)\n"
FIXED = "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n"
PATCH = (
    "--- a/mathx.py\n+++ b/mathx.py\n@@ -1,2 +1,2 @@\n def clamp(x, lo, hi):\n"
    "-    return max(lo, x)\n+    return max(lo, min(x, hi))\n"
)
HIDDEN = (
    "from mathx import clamp\n\n\ndef test_upper():\n    assert clamp(5, 0, 3) == 3\n\n\n"
    "def test_inside():\n    assert clamp(2, 0, 3) == 2\n"
)


def task_row(task_id: str = "clamp-upper", **changes: Any) -> dict[str, Any]:
    """A task as a person writes it by hand (the example in docs/recipes.md)."""
    row: dict[str, Any] = {
        "id": task_id,
        "instruction": "clamp() lets values above the maximum through. Fix it.",
        "repo": {"files": {"mathx.py": MODULE}},
        "hidden_tests": {
            "files": {"tests/test_clamp.py": HIDDEN},
            "fail_to_pass": ["tests/test_clamp.py::test_upper"],
            "pass_to_pass": ["tests/test_clamp.py::test_inside"],
        },
        "reference_patch": PATCH,
        "provenance": {"kind": "imported", "ids": {"ticket": "ENG-12"}},
    }
    row.update(changes)
    return row


def jsonl(*rows: dict[str, Any]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


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


def upload(client_for, data: bytes, role: str = "operator", name: str = "tasks.jsonl", **fields: Any):  # type: ignore[no-untyped-def]
    body = {"target_dataset": "mathx-tasks", "file": io.BytesIO(data), **fields}
    body["file"].name = name
    return client_for(role).post("/api/v1/repo-tasks/import/", body, format="multipart")


def run_the_job(run: Run) -> dict[str, Any]:
    """What Ray does with the run: the job on exactly the input the control plane hands over, then success."""
    report = import_tasks(RepoImportSpec.model_validate(worker_spec(run)))
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    return report


# --- launch: the upload is checked at once, and a bad one creates nothing -------------------------------------------


def test_an_operator_imports_a_hand_written_task_and_it_is_verified_and_stored(client_for, queued):  # type: ignore[no-untyped-def]
    response = upload(client_for, jsonl(task_row()))
    assert response.status_code == 201, response.content
    run = Run.objects.get(pk=response.json()["id"])
    assert run.kind == "repoimport" and run.progress_total == 1 and run.spec["upload"]["tasks"] == 1
    report = run_the_job(run)
    assert report["kept"] == 1 and report["refused"] == []
    repo_tasks_finalize(run_id=run.pk)
    run.refresh_from_db()
    version = DatasetVersion.objects.get(pk=run.summary["repo_tasks"]["version"])
    assert version.dataset.kind == DatasetKind.REPO_TASKS and version.row_count == 1
    row = json.loads(version.file.read())
    assert row["id"] == "clamp-upper" and row["family"] == "imported"
    assert row["snapshot"]["uri"].endswith(f"{row['snapshot']['sha256']}.tar.gz")
    with tarfile.open(row["snapshot"]["uri"].removeprefix("file://")) as archive:
        assert archive.getnames() == ["mathx.py"]  # the hidden tests are not in the snapshot
    assert version.validation_report["statistics"]["tasks"] == 1
    # Finalize again: nothing changes.
    repo_tasks_finalize(run_id=run.pk)
    assert DatasetVersion.objects.filter(dataset=version.dataset).count() == 1


@pytest.mark.parametrize(
    "data, words",
    [
        (b"{not json\n", "line 1: invalid JSON"),
        (b"", "empty"),
        (b"\n\n", "holds no task rows"),
        (jsonl(task_row(), task_row()), "repeats line 1"),
        (jsonl(task_row(instruction="  ")), "instruction"),
        (jsonl(task_row(repo={"files": {"../escape.py": "x = 1\n"}})), ".."),
        (jsonl(task_row(repo={"files": {"/etc/passwd": "x"}})), "absolute"),
        (jsonl({k: v for k, v in task_row().items() if k != "hidden_tests"}), "hidden_tests"),
        (jsonl(task_row(hidden_tests={"files": {}, "fail_to_pass": []})), "fail_to_pass"),
    ],
)
def test_a_malformed_upload_is_a_400_naming_the_line_and_field_and_creates_nothing(client_for, queued, data, words):  # type: ignore[no-untyped-def]
    response = upload(client_for, data)
    assert response.status_code == 400, response.content
    assert words in json.dumps(response.json()), response.json()
    assert not Run.objects.exists() and not Dataset.objects.exists() and queued == []


def test_a_bundle_with_a_path_leaving_the_tree_is_refused(client_for, queued):  # type: ignore[no-untyped-def]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, content in (("tasks.jsonl", jsonl(task_row())), ("../evil.py", b"x = 1\n")):
            info = tarfile.TarInfo(name)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    response = upload(client_for, buffer.getvalue(), name="bundle.tar.gz")
    assert response.status_code == 400 and ".." in json.dumps(response.json()), response.content
    assert not Run.objects.exists()


def test_a_target_dataset_of_another_kind_is_a_400(client_for, users, queued):  # type: ignore[no-untyped-def]
    dataset_create(name="mathx-tasks", kind=DatasetKind.TASKS, owner=users["operator"])
    response = upload(client_for, jsonl(task_row()))
    assert response.status_code == 400 and "target_dataset" in response.json()["fields"]


def test_a_viewer_may_read_import_runs_but_not_import(client_for, queued):  # type: ignore[no-untyped-def]
    assert upload(client_for, jsonl(task_row()), role="viewer").status_code == 403
    assert client_for("viewer").get("/api/v1/repo-tasks/").status_code == 200
    assert not Run.objects.exists()


def test_repository_tasks_cannot_be_uploaded_as_a_plain_dataset_version(users):  # type: ignore[no-untyped-def]
    from rest_framework.exceptions import ValidationError

    dataset = dataset_create(name="raw", kind=DatasetKind.REPO_TASKS, owner=users["operator"])
    with pytest.raises(ValidationError, match="repo-tasks/import"):
        dataset_version_create(
            dataset=dataset, data=jsonl(task_row()), filename="t.jsonl", created_by=users["operator"]
        )


# --- the sandbox check and all-or-nothing --------------------------------------------------------------------------


def test_a_vacuous_task_and_a_patch_that_does_not_apply_are_refused_with_the_reason_and_nothing_is_stored(
    users, queued
):  # type: ignore[no-untyped-def]
    # test_inside already passes on the snapshot: the task asks for nothing.
    vacuous = task_row(
        "vacuous",
        hidden_tests={"files": {"tests/test_clamp.py": HIDDEN}, "fail_to_pass": ["tests/test_clamp.py::test_inside"]},
    )
    broken = task_row("broken-patch", reference_patch=PATCH.replace("max(lo, x)", "max(hi, x)"))
    run = repo_import_launch(
        target_dataset="mathx-tasks",
        data=jsonl(task_row(), vacuous, broken),
        filename="t.jsonl",
        user=users["operator"],
    )
    report = run_the_job(run)
    reasons = {item["id"]: item["reason"] for item in report["refused"]}
    assert report["kept"] == 1 and set(reasons) == {"vacuous", "broken-patch"}
    assert "pass" in reasons["vacuous"] and "test_inside" in reasons["vacuous"]
    assert "apply" in reasons["broken-patch"]
    repo_tasks_finalize(run_id=run.pk)
    run.refresh_from_db()
    assert run.summary["repo_tasks"]["version"] is None and "nothing was stored" in run.summary["repo_tasks"]["outcome"]
    assert not Dataset.objects.filter(name="mathx-tasks").exists()


def test_keep_valid_stores_the_tasks_that_pass(users, queued):  # type: ignore[no-untyped-def]
    vacuous = task_row("vacuous", repo={"files": {"mathx.py": FIXED}})  # the patch no longer applies
    run = repo_import_launch(
        target_dataset="mathx-tasks",
        data=jsonl(task_row(), vacuous),
        filename="t.jsonl",
        user=users["operator"],
        keep_valid=True,
    )
    run_the_job(run)
    repo_tasks_finalize(run_id=run.pk)
    run.refresh_from_db()
    version = DatasetVersion.objects.get(pk=run.summary["repo_tasks"]["version"])
    assert version.row_count == 1 and run.summary["repo_tasks"]["refused"] == 1


def test_manage_py_imports_here_and_refuses_a_bad_file_naming_the_line(users, tmp_path):  # type: ignore[no-untyped-def]
    good = tmp_path / "good.jsonl"
    good.write_bytes(jsonl(task_row()))
    out = io.StringIO()
    call_command("import_repo_tasks", str(good), "--dataset", "cli-tasks", "--owner", "operator-user", stdout=out)
    assert '"kept": 1' in out.getvalue()
    assert DatasetVersion.objects.get(dataset__name="cli-tasks").row_count == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"id": "x"}\n')
    with pytest.raises(CommandError, match="line 1"):
        call_command("import_repo_tasks", str(bad), "--dataset", "cli-tasks", "--owner", "operator-user", stdout=out)
    assert DatasetVersion.objects.filter(dataset__name="cli-tasks").count() == 1


def test_the_pages_show_the_runs_the_form_and_the_report(client, users, queued):  # type: ignore[no-untyped-def]
    run = repo_import_launch(
        target_dataset="mathx-tasks", data=jsonl(task_row()), filename="t.jsonl", user=users["operator"]
    )
    run_the_job(run)
    repo_tasks_finalize(run_id=run.pk)
    client.force_login(users["viewer"])
    assert "run " + str(run.pk) in client.get("/coding/").content.decode()
    page = client.get(f"/coding/runs/{run.pk}/").content.decode()
    assert "Suite statistics" in page and "clamp-upper" in page and "CursorBench" in page
    assert client.get("/coding/import/").status_code == 403  # a viewer cannot launch
    client.force_login(users["operator"])
    assert client.get("/coding/import/").status_code == 200
    assert job_outputs(run)["report"].endswith("report.json")


def test_an_imported_suite_splits_into_a_held_out_coding_benchmark_sliced_by_family_and_source(
    client_for, client, users, queued
):  # type: ignore[no-untyped-def]
    rows = [task_row(f"clamp-{n}", source={"library": "mathx", "function": "clamp"}) for n in range(2)]
    run = repo_import_launch(
        target_dataset="mathx-tasks", data=jsonl(*rows), filename="t.jsonl", user=users["operator"]
    )
    run_the_job(run)
    repo_tasks_finalize(run_id=run.pk)
    run.refresh_from_db()
    api = client_for("operator")
    split = api.post(f"/api/v1/dataset-versions/{run.summary['repo_tasks']['version']}/split/", {}, format="json")
    assert split.status_code == 201, split.content
    test_part = split.json()["test"]
    assert test_part["row_count"] == 1 and test_part["validation_report"]["statistics"]["tasks"] == 1
    benchmark = api.post("/api/v1/benchmarks/", {"name": "mathx-bench", "environment": "coding_agent"}, format="json")
    assert benchmark.json()["metric"] == "pass@1" and benchmark.json()["score_field"] == "tests_passed"
    made = api.post(
        f"/api/v1/benchmarks/{benchmark.json()['id']}/versions/", {"dataset_version": test_part["id"]}, format="json"
    )
    assert made.status_code == 201, made.content
    task = BenchmarkTask.objects.get(version_id=made.json()["id"])
    client.force_login(users["viewer"])
    page = client.get(f"/benchmarks/versions/{made.json()['id']}/").content.decode()
    assert "Suite statistics" in page and "CursorBench" in page
    assert {"family:imported", "source:mathx"} <= set(task.tags) and task.source_ref == "mathx clamp"


# --- a task never shown solvable (issue 36 section 3) ----------------------------------------------------------------


def _without_patch(task_id: str, patch: str | None) -> dict[str, Any]:
    row = task_row(task_id)
    if patch is None:
        del row["reference_patch"]
    else:
        row["reference_patch"] = patch
    return row


@pytest.mark.parametrize("patch", ["", None], ids=["empty-patch", "no-patch-field"])
def test_a_task_without_a_reference_patch_is_refused_naming_the_task_the_field_and_the_fix(users, queued, patch):  # type: ignore[no-untyped-def]
    run = repo_import_launch(
        target_dataset="mathx-tasks",
        data=jsonl(_without_patch("no-fix", patch)),
        filename="t.jsonl",
        user=users["operator"],
    )
    report = run_the_job(run)
    assert report["kept"] == 0 and report["unverified"] == 0
    (refused,) = report["refused"]
    assert refused["id"] == "no-fix" and refused["row"] == 1
    assert "'reference_patch' is missing or empty" in refused["reason"] and '"unverified": true' in refused["reason"]
    repo_tasks_finalize(run_id=run.pk)
    assert not Dataset.objects.filter(name="mathx-tasks").exists()


def test_a_reference_patch_that_does_not_make_the_hidden_tests_pass_is_refused(users, queued):  # type: ignore[no-untyped-def]
    # Applies cleanly, but only clamps at hi + 1: test_upper still fails with the patch.
    wrong = PATCH.replace("min(x, hi)", "min(x, hi + 1)")
    run = repo_import_launch(
        target_dataset="mathx-tasks",
        data=jsonl(task_row("wrong-fix", reference_patch=wrong)),
        filename="t.jsonl",
        user=users["operator"],
    )
    report = run_the_job(run)
    (refused,) = report["refused"]
    assert report["kept"] == 0 and "with the reference patch applied" in refused["reason"]
    assert "tests/test_clamp.py::test_upper (failed)" in refused["reason"]


def test_unverified_true_stores_the_task_marked_on_every_page_and_in_the_statistics(client_for, client, users, queued):  # type: ignore[no-untyped-def]
    marked = _without_patch("no-fix", None) | {"unverified": True}
    run = repo_import_launch(
        target_dataset="mathx-tasks", data=jsonl(task_row(), marked), filename="t.jsonl", user=users["operator"]
    )
    report = run_the_job(run)
    assert report["kept"] == 2 and report["unverified"] == 1 and report["refused"] == []
    assert report["statistics"]["unverified"] == 1
    repo_tasks_finalize(run_id=run.pk)
    run.refresh_from_db()
    version = DatasetVersion.objects.get(pk=run.summary["repo_tasks"]["version"])
    rows = {row["id"]: row for row in map(json.loads, version.file.read().splitlines())}
    assert rows["no-fix"]["unverified"] is True and rows["no-fix"]["reference_patch"] is None
    assert "unverified" not in rows["clamp-upper"]
    assert version.validation_report["statistics"]["unverified"] == 1
    client.force_login(users["viewer"])
    for page in (f"/datasets/{version.dataset_id}/", f"/coding/runs/{run.pk}/", "/coding/"):
        text = client.get(page).content.decode()
        assert "1 unverified" in text or "1 of 2 unverified" in text, page
    assert "1 of 2 unverified" in client.get(f"/datasets/{version.dataset_id}/").content.decode()
    run_page = client.get(f"/coding/runs/{run.pk}/").content.decode()
    assert run_page.count(">unverified</span>") == 1  # the marked task in the task list, not the verified one
    # A benchmark made from it shows it too.
    api = client_for("operator")
    benchmark = api.post("/api/v1/benchmarks/", {"name": "mathx-bench", "environment": "coding_agent"}, format="json")
    made = api.post(
        f"/api/v1/benchmarks/{benchmark.json()['id']}/versions/", {"dataset_version": version.pk}, format="json"
    )
    assert made.status_code == 201, made.content
    page = client.get(f"/benchmarks/versions/{made.json()['id']}/").content.decode()
    assert "1 of 2 unverified" in page and page.count(">unverified</span>") == 1


def test_manage_py_prints_each_progress_line_once(users, tmp_path, capfd):  # type: ignore[no-untyped-def]
    upload = tmp_path / "tasks.jsonl"
    upload.write_bytes(jsonl(task_row(), _without_patch("no-fix", "")))
    out = io.StringIO()
    with pytest.raises(CommandError, match="nothing was stored"):
        call_command(
            "import_repo_tasks",
            str(upload),
            "--dataset",
            "cli-tasks",
            "--owner",
            "operator-user",
            "--workers",
            "1",
            stdout=out,
        )
    printed = out.getvalue()
    elsewhere = capfd.readouterr()
    everything = printed + elsewhere.out + elsewhere.err
    lines = [
        "2 task(s) in the upload; verifying each in the sandbox, 1 at a time",
        "kept clamp-upper (line 1)",
        "refused no-fix (line 2): no reference patch",
        "kept 1 of 2 task(s), refused 1, in ",
    ]
    for line in lines:
        assert printed.count(line) == 1, (line, printed)
        assert everything.count(line) == 1, (line, everything)
    assert "refused line 2" not in everything  # the refusal is not printed a second time after the progress
    assert logging.getLogger("crucible.repoimport").handlers == []  # no handler left behind to print it again
