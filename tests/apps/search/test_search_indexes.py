"""Search indexes in the control plane: launching a build (an INDEX run), reuse and rebuild, the API and its
permissions, the success hook that marks an index ready, the harness's lookup, the page, and the S3 path.

The Ray job itself is not run here: its build function (tests/workers/search/test_search_index.py) is called on the
spec the control plane hands Ray, which writes the index where the control plane expects it."""

from __future__ import annotations

import pytest
from rest_framework.exceptions import ValidationError

from apps.accounts.models import Role
from apps.datasets.models import DatasetKind
from apps.datasets.services import dataset_create, dataset_version_create
from apps.runs.models import Run, RunKind, RunStatus
from apps.runs.services import worker_spec
from apps.search.models import CorpusIndex, IndexStatus
from apps.search.selectors import index_for, ready_index_uri
from apps.search.services.indexes import index_finalize, index_launch
from tests.apps.runs.test_storage_s3 import s3_endpoint, s3_settings  # noqa: F401 (fixtures)
from tests.factories import trajectories_version
from workers.jobs.build_index import BuildIndexSpec, build
from workers.search import index_store as index_module
from workers.search.index import IndexConfig
from workers.search.index_store import load_index
from workers.search.types import Chunk, dump_chunks_jsonl

pytestmark = pytest.mark.django_db

LEXICAL = {"dense": False}  # BM25 only: no model load in these tests


def corpus_chunks() -> list[Chunk]:
    texts = {
        "tides": ["Tides are raised mostly by the Moon's gravity.", "Spring tides follow full and new moons."],
        "coffee": ["Espresso forces hot water through finely ground coffee."],
        "volcano": ["Magma and ash escape from a magma chamber during an eruption."],
    }
    return [
        Chunk(chunk_id=f"{doc}#{i}", doc_id=doc, position=i, text=text, title=doc)
        for doc, parts in texts.items()
        for i, text in enumerate(parts)
    ]


@pytest.fixture(autouse=True)
def local_storage(settings, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    settings.STORAGES = {
        **settings.STORAGES,
        "default": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "media")},
        },
    }
    monkeypatch.setenv("CRUCIBLE_INDEX_CACHE", str(tmp_path / "index-cache"))
    monkeypatch.setattr(index_module, "_loaded", {})


@pytest.fixture
def corpus_version(users):  # type: ignore[no-untyped-def]
    owner = users["operator"]
    dataset = dataset_create(name="notes", kind=DatasetKind.CORPUS, owner=owner)
    return dataset_version_create(
        dataset=dataset, data=dump_chunks_jsonl(corpus_chunks()), filename="chunks.jsonl", created_by=owner
    )


def run_the_job(index: CorpusIndex, *, summary: bool = True) -> None:
    """What Ray would do: build from the spec the control plane hands the job, then report success."""
    run = index.run
    spec = BuildIndexSpec.model_validate(worker_spec(run))
    result = build(spec, log_line=lambda line: None)
    run.status = RunStatus.SUCCEEDED
    run.summary = result if summary else {}
    run.save(update_fields=["status", "summary"])


# --- launch --------------------------------------------------------------------------------------------------------
def test_launch_creates_an_index_run_whose_spec_is_the_jobs_input(
    corpus_version, users, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks() as callbacks:
        index = index_launch(corpus_version=corpus_version, config={"rrf_k": 30}, user=users["operator"])
    assert len(callbacks) == 1  # dispatch_run, after the commit
    run = index.run
    assert run.kind == RunKind.INDEX and run.dataset_version == corpus_version
    job = run.spec["job"]
    assert job["config"] == IndexConfig(rrf_k=30).model_dump(mode="json")
    assert job["corpus_hash"] == corpus_version.content_hash
    assert job["output_uri"] == index.uri and index.uri.startswith("file://")
    assert job["corpus_uri"].endswith(corpus_version.file.name)
    spec = BuildIndexSpec.model_validate(worker_spec(run))  # the worker's schema accepts what Ray is handed
    assert spec.config == IndexConfig(rrf_k=30) and spec.run_id == run.pk
    assert index.config_hash == IndexConfig(rrf_k=30).content_hash()
    assert index.status == IndexStatus.PENDING


def test_launching_the_same_build_again_reuses_it_unless_it_failed(corpus_version, users):
    first = index_launch(corpus_version=corpus_version, config={}, user=users["operator"])
    spelled_out = IndexConfig().model_dump(mode="json")
    assert index_launch(corpus_version=corpus_version, config=spelled_out, user=users["admin"]).run_id == first.run_id
    other = index_launch(corpus_version=corpus_version, config=LEXICAL, user=users["operator"])
    assert other.pk != first.pk
    Run.objects.filter(pk=first.run_id).update(status=RunStatus.FAILED)
    rebuilt = index_launch(corpus_version=corpus_version, config={}, user=users["operator"])
    assert rebuilt.pk == first.pk and rebuilt.run_id != first.run_id
    assert rebuilt.uri != first.uri and rebuilt.status == IndexStatus.PENDING
    assert Run.objects.filter(kind=RunKind.INDEX).count() == 3


def test_launch_refuses_a_bad_config_naming_the_field(corpus_version, users):
    with pytest.raises(ValidationError) as info:
        index_launch(corpus_version=corpus_version, config={"rrf_k": 0, "colour": "red"}, user=users["operator"])
    assert set(info.value.detail) == {"config.rrf_k", "config.colour"}


def test_launch_refuses_a_dataset_that_is_not_a_corpus(users, trajectories_jsonl):
    version = trajectories_version(owner=users["operator"], data=trajectories_jsonl)
    with pytest.raises(ValidationError, match="kind 'corpus'"):
        index_launch(corpus_version=version, config={}, user=users["operator"])


# --- finalize and lookup -------------------------------------------------------------------------------------------
def test_finalize_marks_the_index_ready_once_and_the_harness_loads_it(corpus_version, users):
    with pytest.raises(ValidationError, match="build an index first: POST /api/v1/search-indexes/"):
        ready_index_uri(corpus_version)
    index = index_launch(corpus_version=corpus_version, config=LEXICAL, user=users["operator"])
    with pytest.raises(ValidationError, match="is pending"):
        ready_index_uri(corpus_version)
    run_the_job(index)
    index_finalize(run_id=index.run_id)
    index.refresh_from_db()
    assert index.status == IndexStatus.READY
    ready_at = index.ready_at
    assert index.stats["manifest"]["chunks"] == 4 and index.stats["manifest"]["documents"] == 3
    assert index.stats["summary"]["seconds"]["total"] >= 0
    index_finalize(run_id=index.run_id)  # a retried hook changes nothing
    index.refresh_from_db()
    assert index.ready_at == ready_at

    assert index_for(corpus_version) == index
    assert index_for(corpus_version, LEXICAL) == index
    assert index_for(corpus_version, {}) is None
    uri = ready_index_uri(corpus_version)
    hits = load_index(uri).search("why are there tides", k=2)
    assert hits[0].chunk.doc_id == "tides"


def test_finalize_ignores_a_run_that_is_no_longer_the_indexs(corpus_version, users):
    index = index_launch(corpus_version=corpus_version, config=LEXICAL, user=users["operator"])
    old_run = index.run_id
    Run.objects.filter(pk=old_run).update(status=RunStatus.FAILED)
    index_launch(corpus_version=corpus_version, config=LEXICAL, user=users["operator"])
    index_finalize(run_id=old_run)
    index.refresh_from_db()
    assert index.ready_at is None


# --- API -----------------------------------------------------------------------------------------------------------
def test_api_builds_reuses_and_lists_indexes(corpus_version, client_for):
    operator = client_for(Role.OPERATOR)
    created = operator.post(
        "/api/v1/search-indexes/", {"corpus_version": corpus_version.pk, "config": LEXICAL}, format="json"
    )
    assert created.status_code == 201, created.json()
    body = created.json()
    assert body["status"] == "pending" and body["config"]["dense"] is False and body["run"]
    again = operator.post(
        "/api/v1/search-indexes/", {"corpus_version": corpus_version.pk, "config": LEXICAL}, format="json"
    )
    assert again.status_code == 200 and again.json()["id"] == body["id"]

    viewer = client_for(Role.VIEWER)
    listed = viewer.get(f"/api/v1/search-indexes/?corpus_version={corpus_version.pk}")
    assert listed.status_code == 200 and [i["id"] for i in listed.json()["results"]] == [body["id"]]
    assert viewer.get("/api/v1/search-indexes/?status=ready").json()["results"] == []
    assert viewer.get(f"/api/v1/search-indexes/{body['id']}/").json()["run"] == body["run"]


def test_api_refuses_bad_input_with_the_field_named(corpus_version, client_for, users, trajectories_jsonl):
    operator = client_for(Role.OPERATOR)
    bad = operator.post(
        "/api/v1/search-indexes/", {"corpus_version": corpus_version.pk, "config": {"alpha": 2}}, format="json"
    )
    assert bad.status_code == 400 and "config.alpha" in bad.json()["fields"]
    not_object = operator.post(
        "/api/v1/search-indexes/", {"corpus_version": corpus_version.pk, "config": [1]}, format="json"
    )
    assert not_object.status_code == 400 and "config" in not_object.json()["fields"]
    version = trajectories_version(owner=users["operator"], data=trajectories_jsonl)
    wrong_kind = operator.post("/api/v1/search-indexes/", {"corpus_version": version.pk}, format="json")
    assert wrong_kind.status_code == 400 and "corpus_version" in wrong_kind.json()["fields"]


def test_a_viewer_cannot_build_an_index(corpus_version, client_for):
    response = client_for(Role.VIEWER).post(
        "/api/v1/search-indexes/", {"corpus_version": corpus_version.pk}, format="json"
    )
    assert response.status_code == 403
    assert not CorpusIndex.objects.exists()


# --- page ----------------------------------------------------------------------------------------------------------
def test_the_page_lists_indexes_and_builds_one(corpus_version, client, users):
    client.force_login(users["viewer"])
    page = client.get("/search/indexes/")
    assert page.status_code == 200 and b"No indexes yet" in page.content and b"Build an index" not in page.content
    assert client.post("/search/indexes/", {"corpus_version": corpus_version.pk}).status_code == 403

    client.force_login(users["operator"])
    bad = client.post("/search/indexes/", {"corpus_version": corpus_version.pk, "config": '{"rrf_k": -1}'})
    assert bad.status_code == 200 and b"config.rrf_k" in bad.content
    made = client.post("/search/indexes/", {"corpus_version": corpus_version.pk, "config": '{"dense": false}'})
    index = CorpusIndex.objects.get()
    assert made.status_code == 302 and made["Location"] == f"/runs/{index.run_id}/"
    listed = client.get("/search/indexes/")
    assert f"run {index.run_id}".encode() in listed.content and b"BM25 only" in listed.content
    # A finished build shows its speed: chunks over the manifest's BM25 and embedding seconds.
    index.stats = {"manifest": {"chunks": 300, "build_seconds": {"bm25": 1.0, "dense": 9.0}}}
    index.save(update_fields=["stats"])
    assert b"<td>30.0" in client.get("/search/indexes/").content


# --- S3 ------------------------------------------------------------------------------------------------------------
def test_an_index_round_trips_through_s3(s3_settings, users, tmp_path, monkeypatch):  # noqa: F811
    owner = users["operator"]
    dataset = dataset_create(name="notes-s3", kind=DatasetKind.CORPUS, owner=owner)
    version = dataset_version_create(
        dataset=dataset, data=dump_chunks_jsonl(corpus_chunks()), filename="chunks.jsonl", created_by=owner
    )
    index = index_launch(corpus_version=version, config=LEXICAL, user=owner)
    assert index.uri.startswith(f"s3://{s3_settings}/search-indexes/")
    run_the_job(index)
    index_finalize(run_id=index.run_id)
    index.refresh_from_db()
    assert index.status == IndexStatus.READY and index.stats["manifest"]["chunks"] == 4
    spec = BuildIndexSpec.model_validate(worker_spec(index.run))
    loaded = load_index(ready_index_uri(version), spec.storage_options)
    assert [h.chunk.chunk_id for h in loaded.search("espresso coffee", k=1)] == ["coffee#0"]
