"""Benchmarks and evals in the control plane: versions, bad input, eval launch and reuse, results, comparison."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from apps.benchmarks.models import Benchmark, BenchmarkTask, BenchmarkVersion, Eval
from apps.benchmarks.services import benchmark_import_humaneval, eval_launch
from apps.runs.models import Run, RunKind, TaskResult
from tests.factories import CODING_ROWS, checkpoint_for, coding_version, finish_eval

pytestmark = pytest.mark.django_db


def _new_benchmark(client, name: str = "mini") -> int:  # type: ignore[no-untyped-def]
    reply = client.post("/api/v1/benchmarks/", {"name": name, "environment": "coding"}, format="json")
    assert reply.status_code == 201, reply.json()
    assert reply.json()["score_field"] == "tests_passed" and reply.json()["metric"] == "pass@1"
    return int(reply.json()["id"])


def test_a_version_is_content_hashed_and_the_same_tasks_twice_are_the_same_version(client_for) -> None:
    client = client_for("operator")
    bench = _new_benchmark(client)
    first = client.post(f"/api/v1/benchmarks/{bench}/versions/", {"tasks": CODING_ROWS}, format="json")
    assert first.status_code == 201, first.json()
    assert first.json()["number"] == 1 and first.json()["task_count"] == len(CODING_ROWS)
    again = client.post(f"/api/v1/benchmarks/{bench}/versions/", {"tasks": CODING_ROWS[::-1]}, format="json")
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    changed = client.post(f"/api/v1/benchmarks/{bench}/versions/", {"tasks": CODING_ROWS[:3]}, format="json")
    assert changed.status_code == 201 and changed.json()["number"] == 2
    assert changed.json()["content_hash"] != first.json()["content_hash"]
    version = BenchmarkVersion.objects.get(pk=first.json()["id"])
    stored = [json.loads(line) for line in version.tasks_file.read().splitlines()]
    assert [row["id"] for row in stored] == [row["id"] for row in CODING_ROWS]
    assert set(BenchmarkTask.objects.filter(version=version).values_list("task_id", flat=True)) == {
        row["id"] for row in CODING_ROWS
    }


def test_a_version_is_immutable_over_the_api(client_for, users) -> None:
    version = coding_version(owner=users["admin"])
    client = client_for("admin")
    for method in ("put", "patch", "delete"):
        reply = getattr(client, method)(f"/api/v1/benchmark-versions/{version.pk}/", {"notes": "x"}, format="json")
        assert reply.status_code == 405


def test_a_jsonl_upload_becomes_a_version(client_for) -> None:
    client = client_for("operator")
    bench = _new_benchmark(client)
    data = "".join(json.dumps(row) + "\n" for row in CODING_ROWS).encode()
    reply = client.post(
        f"/api/v1/benchmarks/{bench}/versions/",
        {"file": SimpleUploadedFile("tasks.jsonl", data), "provenance": "imported"},
        format="multipart",
    )
    assert reply.status_code == 201, reply.json()
    assert set(BenchmarkTask.objects.filter(version_id=reply.json()["id"]).values_list("provenance", flat=True)) == {
        "imported"
    }


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"tasks": []}, "tasks", "at least one task"),
        ({"tasks": "nope"}, "tasks", "JSON list"),
        ({"tasks": [{**CODING_ROWS[0], "test": ""}]}, "tasks", "task row 1: field 'test'"),
        ({"tasks": [CODING_ROWS[0], CODING_ROWS[0]]}, "tasks", "repeats task row 1"),
        ({"tasks": [{"id": "x", "prompt": "p"}]}, "tasks", "missing field"),
        ({"tasks": [{**CODING_ROWS[0], "entry_point": "not valid"}]}, "tasks", "Python identifier"),
        ({"tasks": CODING_ROWS, "env_params": {"bogus": 1}}, "env_params", "takes no parameter 'bogus'"),
    ],
)
def test_bad_tasks_are_refused_with_the_row_and_field_and_nothing_is_stored(client_for, body, field, words) -> None:
    client = client_for("operator")
    bench = _new_benchmark(client)
    reply = client.post(f"/api/v1/benchmarks/{bench}/versions/", body, format="json")
    assert reply.status_code == 400
    assert field in reply.json()["fields"] and words in reply.json()["detail"]
    assert not BenchmarkVersion.objects.exists()


def test_a_malformed_jsonl_line_is_named(client_for) -> None:
    client = client_for("operator")
    bench = _new_benchmark(client)
    data = (json.dumps(CODING_ROWS[0]) + "\n{not json\n").encode()
    reply = client.post(
        f"/api/v1/benchmarks/{bench}/versions/", {"file": SimpleUploadedFile("t.jsonl", data)}, format="multipart"
    )
    assert reply.status_code == 400 and "line 2" in reply.json()["detail"]


def test_an_unknown_environment_and_a_duplicate_name_are_refused(client_for) -> None:
    client = client_for("operator")
    reply = client.post("/api/v1/benchmarks/", {"name": "b", "environment": "chess"}, format="json")
    assert reply.status_code == 400 and "coding" in reply.json()["detail"]
    _new_benchmark(client, "b")
    assert client.post("/api/v1/benchmarks/", {"name": "b", "environment": "coding"}, format="json").status_code == 400


def test_viewers_cannot_create_benchmarks_versions_or_evals(client_for, users) -> None:
    version = coding_version(owner=users["admin"])
    client = client_for("viewer")
    assert client.post("/api/v1/benchmarks/", {"name": "v", "environment": "coding"}, format="json").status_code == 403
    reply = client.post(f"/api/v1/benchmarks/{version.benchmark_id}/versions/", {"tasks": CODING_ROWS}, format="json")
    assert reply.status_code == 403
    reply = client.post("/api/v1/evals/", {"benchmark_version": version.pk, "base_model": "x"}, format="json")
    assert reply.status_code == 403


def test_humaneval_imports_its_164_tasks_once(users) -> None:
    first = benchmark_import_humaneval(owner=users["admin"])
    again = benchmark_import_humaneval(owner=users["admin"])
    assert first.pk == again.pk and first.task_count == 164
    assert Benchmark.objects.get(name="humaneval").environment == "coding"
    difficulties = set(BenchmarkTask.objects.filter(version=first).values_list("difficulty", flat=True))
    assert difficulties == {"easy", "medium", "hard"}


def test_an_eval_launch_checks_the_model_and_the_checkpoint_file(client_for, users, tmp_path) -> None:
    version = coding_version(owner=users["admin"])
    client = client_for("operator")
    reply = client.post("/api/v1/evals/", {"benchmark_version": version.pk}, format="json")
    assert reply.status_code == 400 and "base_model" in reply.json()["fields"]
    reply = client.post("/api/v1/evals/", {"benchmark_version": version.pk, "base_model": "gpt-9"}, format="json")
    assert reply.status_code == 400 and "unknown model 'gpt-9'" in reply.json()["detail"]
    checkpoint = checkpoint_for(owner=users["operator"], tmp_path=tmp_path)
    (tmp_path / f"ckpt-1-{users['operator'].pk}.pt").unlink()
    reply = client.post("/api/v1/evals/", {"benchmark_version": version.pk, "checkpoint": checkpoint.pk}, format="json")
    assert reply.status_code == 400 and "does not exist" in reply.json()["detail"]
    reply = client.post("/api/v1/evals/", {"benchmark_version": version.pk, "checkpoint": 999999}, format="json")
    assert reply.status_code == 400 and "checkpoint" in reply.json()["fields"]
    reply = client.post("/api/v1/evals/", {"benchmark_version": version.pk, "base_model": "x", "k": 0}, format="json")
    assert reply.status_code == 400 and "k" in reply.json()["fields"]
    assert not Eval.objects.exists() and not Run.objects.filter(kind=RunKind.EVAL).exists()


def test_an_eval_is_an_eval_run_with_a_self_contained_job_spec_and_is_reused(client_for, users, tmp_path) -> None:
    from apps.runs.services import worker_spec

    version = coding_version(owner=users["admin"])
    checkpoint = checkpoint_for(owner=users["operator"], tmp_path=tmp_path)
    client = client_for("operator")
    body = {"benchmark_version": version.pk, "checkpoint": checkpoint.pk, "k": 2}
    first = client.post("/api/v1/evals/", body, format="json")
    assert first.status_code == 201, first.json()
    evaluation = Eval.objects.get(pk=first.json()["id"])
    assert evaluation.base_model == "tiny-llama-smollm2-tokenizer" and evaluation.run.kind == RunKind.EVAL
    spec = worker_spec(evaluation.run)
    assert spec["config"]["checkpoint_uri"] == checkpoint.uri and spec["config"]["k"] == 2
    assert spec["config"]["temperature"] > 0  # k > 1 needs distinct attempts
    assert spec["config"]["score_field"] == "tests_passed" and spec["tasks_uri"].endswith(".jsonl")
    again = client.post("/api/v1/evals/", body, format="json")
    assert again.status_code == 200 and again.json()["id"] == evaluation.pk
    finish_eval(evaluation, {}, status="failed")
    retried = client.post("/api/v1/evals/", body, format="json")
    assert retried.status_code == 201 and retried.json()["id"] != evaluation.pk


def test_task_results_stream_in_once_and_the_finished_eval_gets_unbiased_pass_at_k(client_for, users) -> None:
    from workers.evals.stats import pass_at_k

    version = coding_version(owner=users["admin"])
    evaluation, _ = eval_launch(
        benchmark_version=version, base_model="tiny-llama-smollm2-tokenizer", k=4, created_by=users["operator"]
    )
    results = {row["id"]: (4, i % 5) for i, row in enumerate(CODING_ROWS)}
    finish_eval(evaluation, results)
    finish_eval(evaluation, results)  # a retried batch: stored once
    assert TaskResult.objects.filter(run_id=evaluation.run_id).count() == len(CODING_ROWS)
    evaluation.refresh_from_db()
    expected = sum(pass_at_k(4, c, 2) for _, c in results.values()) / len(results)
    assert evaluation.metrics["pass@2"] == pytest.approx(expected)
    assert evaluation.metrics["pass@1"] == pytest.approx(sum(c / 4 for _, c in results.values()) / len(results))
    reply = client_for("viewer").get(f"/api/v1/evals/{evaluation.pk}/tasks/")
    assert reply.status_code == 200 and reply.json()["count"] == len(CODING_ROWS)


def test_a_task_result_with_more_passes_than_samples_is_refused_at_ingest() -> None:
    from pydantic import ValidationError

    from workers.events import EVENTS_LIST

    with pytest.raises(ValidationError, match="cannot exceed samples"):
        EVENTS_LIST.validate_python(
            [{"seq": 1, "kind": "task_result", "task_id": "t", "samples": 1, "passed": 2, "score": 1}]
        )


def test_two_evals_compare_task_by_task_with_a_paired_test_per_slice(client_for, users) -> None:
    version = coding_version(owner=users["admin"])
    launch = {"benchmark_version": version, "created_by": users["operator"], "reuse": False}
    before, _ = eval_launch(**launch, base_model="tiny-llama-smollm2-tokenizer")
    after, _ = eval_launch(**launch, base_model="smollm2-135m-instruct")
    finish_eval(before, {row["id"]: (1, 1) for row in CODING_ROWS})
    finish_eval(after, {row["id"]: (1, 0 if "even" in row["tags"] else 1) for row in CODING_ROWS})
    reply = client_for("viewer").get(
        f"/api/v1/evals/compare/?before={before.pk}&after={after.pk}&slice_by=tag,difficulty"
    )
    assert reply.status_code == 200, reply.json()
    body = reply.json()
    overall = body["comparison"]["overall"]
    assert overall["n"] == 12 and overall["diff"] == pytest.approx(-0.5) and overall["test"].startswith("mcnemar")
    slices = {s["slice"]: s for s in body["comparison"]["slices"]}
    assert slices["tag:even"]["diff"] == pytest.approx(-1.0) and slices["tag:arith"]["n"] == 12
    assert [t["diff"] for t in body["tasks"] if t["task_id"] == "add-0"] == [-1.0]
    bad = client_for("viewer").get(f"/api/v1/evals/compare/?before={before.pk}&after={after.pk}&slice_by=color")
    assert bad.status_code == 400 and "slice" in bad.json()["detail"]
    missing = client_for("viewer").get(f"/api/v1/evals/compare/?before={before.pk}&after=999999")
    assert missing.status_code == 400 and "does not exist" in missing.json()["detail"]


def test_an_sft_checkpoint_is_evaluated_as_the_model_directory_it_is(users, tmp_path) -> None:
    from apps.runs.models import Checkpoint
    from apps.runs.services import worker_spec

    model_dir = tmp_path / "sft-model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    run = Run.objects.create(
        kind="sft", spec={"config": {"base_model": "smollm2-135m-instruct"}}, created_by=users["operator"]
    )
    checkpoint = Checkpoint.objects.create(run=run, step=2, uri=f"file://{model_dir}")
    evaluation, _ = eval_launch(
        benchmark_version=coding_version(owner=users["admin"]), checkpoint=checkpoint, created_by=users["operator"]
    )
    spec = worker_spec(evaluation.run)
    assert spec["config"]["base_model"] == str(model_dir) and spec["config"]["checkpoint_uri"] is None
