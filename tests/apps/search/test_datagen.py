"""Synthetic-task generation in the control plane: launch (API and page), the job's input, and finalize."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.files.storage import default_storage

from apps.datasets.models import Dataset, DatasetKind, DatasetVersion
from apps.datasets.services import dataset_create, dataset_version_create
from apps.runs.models import Run, RunKind, RunStatus
from apps.runs.services import run_owner_hook, worker_spec
from apps.search.selectors import datagen_outputs
from apps.search.services.datagen import datagen_finalize, datagen_launch
from tests.factories import tasks_version
from tests.workers.search.test_synth import FILLER, stdlib_chunks
from workers.jobs.datagen import DatagenSpec, generate
from workers.search.types import Chunk, dump_chunks_jsonl

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _storage(settings, tmp_path):  # type: ignore[no-untyped-def]
    # Each test gets its own storage: run ids repeat across test databases, and their output paths with them.
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


# A slice of the demo corpus (about 1,200 chunks): enough bridges for a few tasks, small enough for quick tests.
MODULES = {
    *("builtins", "sys", "os.path", "shutil", "io", "subprocess", "json", "pathlib", "logging", "tempfile"),
    *("glob", "fnmatch", "zipfile", "tarfile", "gzip", "csv", "string", "textwrap", "difflib", "heapq"),
    *("collections", "functools", "itertools", "contextlib", "codecs", "pickle", "copy", "datetime", "time"),
}


def stdlib_slice() -> list[Chunk]:
    return [c for c in stdlib_chunks() if c.doc_id.removeprefix("py:") in MODULES]


def corpus_version(owner, chunks=None, name: str = "stdlib") -> DatasetVersion:  # type: ignore[no-untyped-def]
    dataset = dataset_create(name=name, kind=DatasetKind.CORPUS, owner=owner)
    data = dump_chunks_jsonl(stdlib_slice() if chunks is None else chunks)
    return dataset_version_create(dataset=dataset, data=data, filename=f"{name}.jsonl", created_by=owner)


@pytest.fixture
def corpus(users):  # type: ignore[no-untyped-def]
    return corpus_version(users["operator"])


def run_the_job(run: Run) -> dict[str, Any]:
    """What Ray does with the run: the job on exactly the input the control plane hands over, then success."""
    result = generate(DatagenSpec.model_validate(worker_spec(run)))
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    return result.report


def post(client_for, role: str = "operator", **body: Any):  # type: ignore[no-untyped-def]
    return client_for(role).post("/api/v1/datagen/", body, format="json")


# --- launch ----------------------------------------------------------------------------------------------------
def test_an_operator_launches_a_datagen_run_that_is_dispatched_on_commit(  # type: ignore[no-untyped-def]
    client_for, corpus, queued, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        reply = post(
            client_for, corpus_version=corpus.pk, target_dataset="stdlib-tasks", params={"num_tasks": 5, "seed": 3}
        )
    assert reply.status_code == 201, reply.json()
    run = Run.objects.get(pk=reply.json()["id"])
    assert queued == [run.pk]
    assert run.kind == RunKind.DATAGEN and run.dataset_version == corpus and run.progress_total == 5
    assert run.spec["target_dataset"] == "stdlib-tasks" and run.spec["params"]["seed"] == 3
    # The job's input is exactly what its typed spec accepts (extra keys are refused there).
    spec = DatagenSpec.model_validate(worker_spec(run))
    assert spec.corpus_label == str(corpus) and spec.corpus_hash == corpus.content_hash
    assert spec.corpus_uri.startswith("file://") and spec.output_uri.endswith(datagen_outputs(run)["tasks"])
    assert spec.num_tasks == 5 and spec.generator == "template"


def test_a_corpus_version_of_another_kind_is_a_400(client_for, users, queued):  # type: ignore[no-untyped-def]
    tasks = tasks_version(owner=users["operator"], rows=[{"id": "t1", "prompt": "p", "answer": "a"}])
    reply = post(client_for, corpus_version=tasks.pk, target_dataset="out")
    assert reply.status_code == 400
    assert "kind 'corpus'" in " ".join(reply.json()["fields"]["corpus_version"])
    assert not Run.objects.exists() and not Dataset.objects.filter(name="out").exists()


@pytest.mark.parametrize(
    ("params", "field", "words"),
    [
        ({"num_tasks": 0}, "params.num_tasks", "greater than or equal to 1"),
        ({"max_hops": 9}, "params.max_hops", "less than or equal to 4"),
        ({"generator": "magic"}, "params.generator", "'template' or 'llm'"),
        ({"distractors": 2, "min_distractors": 5}, "params.min_distractors", "more than distractors"),
        ({"generator": "llm", "model": "no-such-model"}, "params.model", "unknown model"),
        ({"surprise": 1}, "params.surprise", "Extra inputs"),
        ([1, 2], "params", "JSON object"),
    ],
)
def test_bad_params_are_a_400_naming_the_field(client_for, corpus, queued, params, field, words):  # type: ignore[no-untyped-def]
    reply = post(client_for, corpus_version=corpus.pk, target_dataset="out", params=params)
    assert reply.status_code == 400, reply.json()
    fields = reply.json()["fields"]
    assert field in fields and words in " ".join(fields[field]), fields
    assert not Run.objects.exists()


def test_a_target_dataset_of_another_kind_or_a_bad_name_is_a_400(client_for, corpus, queued):  # type: ignore[no-untyped-def]
    reply = post(client_for, corpus_version=corpus.pk, target_dataset="stdlib")  # the corpus itself
    assert reply.status_code == 400
    assert "corpus dataset" in " ".join(reply.json()["fields"]["target_dataset"])
    reply = post(client_for, corpus_version=corpus.pk, target_dataset="no spaces please")
    assert reply.status_code == 400 and "target_dataset" in reply.json()["fields"]
    assert not Run.objects.exists()


def test_a_viewer_may_read_but_not_launch(client_for, corpus, queued):  # type: ignore[no-untyped-def]
    reply = post(client_for, "viewer", corpus_version=corpus.pk, target_dataset="out")
    assert reply.status_code == 403
    assert not Run.objects.exists() and not Dataset.objects.filter(name="out").exists() and queued == []
    assert client_for("viewer").get("/api/v1/datagen/").status_code == 200


# --- finalize --------------------------------------------------------------------------------------------------
def test_finalize_registers_one_tasks_version_and_a_second_call_changes_nothing(client_for, users, corpus, queued):  # type: ignore[no-untyped-def]
    run = datagen_launch(
        corpus_version=corpus,
        target_dataset="stdlib-tasks",
        params={"num_tasks": 6, "max_hops": 2},
        user=users["operator"],
    )
    report = run_the_job(run)
    run_owner_hook(run_id=run.pk, point="succeeded", steps=[])  # the path Celery takes: the kind's hook
    run.refresh_from_db()
    outcome = run.summary["datagen"]
    dataset = Dataset.objects.get(name="stdlib-tasks")
    version = DatasetVersion.objects.get(dataset=dataset)
    assert dataset.kind == DatasetKind.TASKS and outcome["tasks_version"] == version.pk
    assert outcome["tasks_dataset"] == dataset.pk and outcome["kept"] == 6 == version.row_count
    assert version.validation_report["verification"] == report and version.validation_report["run"] == run.pk
    assert f"run {run.pk}" in version.notes and "kept 6 of" in version.notes
    with version.file.open("rb") as handle:
        rows = [json.loads(line) for line in handle.read().splitlines()]
    assert len(rows) == 6 and all(r["provenance"]["corpus"] == str(corpus) for r in rows)

    datagen_finalize(run_id=run.pk)
    run.refresh_from_db()
    assert DatasetVersion.objects.filter(dataset=dataset).count() == 1
    assert run.summary["datagen"] == outcome

    detail = client_for("viewer").get(f"/api/v1/datagen/{run.pk}/").json()
    assert detail["datagen"]["tasks_version"] == version.pk and detail["report"]["kept"] == 6


def test_a_job_that_kept_no_tasks_is_recorded_without_a_version(users, queued):  # type: ignore[no-untyped-def]
    owner = users["operator"]
    plain = corpus_version(owner, chunks=FILLER, name="prose")  # prose without names: nothing to bridge
    run = datagen_launch(corpus_version=plain, target_dataset="prose-tasks", params={"num_tasks": 3}, user=owner)
    report = run_the_job(run)
    assert report["kept"] == 0
    datagen_finalize(run_id=run.pk)
    run.refresh_from_db()
    assert run.summary["datagen"]["tasks_version"] is None and "kept no tasks" in run.summary["datagen"]["outcome"]
    assert not Dataset.objects.filter(name="prose-tasks").exists()


def test_finalize_ignores_a_run_that_did_not_succeed(users, corpus, queued):  # type: ignore[no-untyped-def]
    run = datagen_launch(corpus_version=corpus, target_dataset="t", params={"num_tasks": 2}, user=users["operator"])
    datagen_finalize(run_id=run.pk)
    run.refresh_from_db()
    assert "datagen" not in run.summary and not Dataset.objects.filter(name="t").exists()


def test_identical_tasks_link_the_existing_version(users, corpus, queued):  # type: ignore[no-untyped-def]
    owner = users["operator"]
    runs = [
        datagen_launch(corpus_version=corpus, target_dataset="same", params={"num_tasks": 3}, user=owner)
        for _ in range(2)
    ]
    for run in runs:
        run_the_job(run)
        datagen_finalize(run_id=run.pk)
    first, second = (Run.objects.get(pk=r.pk).summary["datagen"] for r in runs)
    assert first["tasks_version"] == second["tasks_version"] is not None
    assert "identical tasks" in second["outcome"]
    assert DatasetVersion.objects.filter(dataset__name="same").count() == 1


# --- pages -----------------------------------------------------------------------------------------------------
def _login(client, user) -> None:  # type: ignore[no-untyped-def]
    client.force_login(user)


def test_the_launch_page_creates_a_run_and_redirects_to_it(client, users, corpus, queued):  # type: ignore[no-untyped-def]
    _login(client, users["operator"])
    page = client.get("/search/datagen/new/")
    assert page.status_code == 200 and str(corpus) in page.content.decode()
    reply = client.post(
        "/search/datagen/new/",
        {"corpus_version": corpus.pk, "target_dataset": "from-page", "generator": "template", "num_tasks": "4"},
    )
    run = Run.objects.get()
    assert reply.status_code == 302 and reply["Location"] == f"/runs/{run.pk}/"
    assert run.spec["params"]["num_tasks"] == 4 and run.spec["target_dataset"] == "from-page"
    bad = client.post("/search/datagen/new/", {"corpus_version": corpus.pk, "target_dataset": "x", "num_tasks": "many"})
    assert bad.status_code == 200 and "params.num_tasks" in bad.content.decode()
    assert Run.objects.count() == 1


def test_a_viewer_cannot_open_the_launch_page(client, users):  # type: ignore[no-untyped-def]
    _login(client, users["viewer"])
    assert client.get("/search/datagen/new/").status_code == 403
    assert client.post("/search/datagen/new/", {"target_dataset": "x"}).status_code == 403
    assert not Run.objects.exists()


def test_the_report_page_shows_kept_and_dropped_by_reason(client, users, corpus, queued):  # type: ignore[no-untyped-def]
    run = datagen_launch(corpus_version=corpus, target_dataset="shown", params={"num_tasks": 4}, user=users["operator"])
    _login(client, users["viewer"])
    assert "No report yet" in client.get(f"/search/datagen/{run.pk}/").content.decode()
    report = run_the_job(run)
    datagen_finalize(run_id=run.pk)
    html = client.get(f"/search/datagen/{run.pk}/").content.decode()
    assert f"<strong>{report['kept']}</strong> kept of {report['candidates']} candidates" in html
    assert "no_quote_in_supporting_chunk" in html and "shown@v1" in html
    assert default_storage.exists(datagen_outputs(run)["report"]) and datagen_outputs(run)["report"].startswith(
        f"runs/{run.pk}/datagen-"
    )
    listing = client.get("/search/datagen/").content.decode()
    assert f"/search/datagen/{run.pk}/" in listing


# --- end to end ------------------------------------------------------------------------------------------------
