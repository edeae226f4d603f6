"""The example run `make run` starts on a fresh installation: a real training launch (checked like any), its
held-out benchmark and gate, started once."""

from __future__ import annotations

import pytest

from apps.benchmarks.models import BenchmarkVersion
from apps.gates.models import Gate
from apps.runs.models import Run
from apps.web.example import EXAMPLE_BENCHMARK, EXAMPLE_GATE, EXAMPLE_HELDOUT_TASKS, start_example_run
from tests.factories import exact_answer_version, tasks_version
from workers.envs.registry import arithmetic_tasks

pytestmark = pytest.mark.django_db


def test_the_example_run_is_launched_once_with_its_benchmark_and_gate(
    users, monkeypatch, client, django_capture_on_commit_callbacks
):  # type: ignore[no-untyped-def]
    queued: list[int] = []
    monkeypatch.setattr("apps.runs.tasks.dispatch_run.delay", queued.append)
    assert "crucible_demo first" in start_example_run()  # no demo data yet: nothing is created
    assert not Run.objects.exists()
    admin = users["admin"]
    tasks_version(owner=admin, rows=arithmetic_tasks(256, seed=0, difficulty=1), name="demo-arithmetic")
    exact_answer_version(owner=admin, name="exact-answer")
    with django_capture_on_commit_callbacks(execute=True):
        said = start_example_run()
    run = Run.objects.get(tags__contains=["example"])
    assert f"run {run.pk}" in said and queued == [run.pk]
    assert run.kind == "train" and run.spec["config"]["base_model"] == "smollm2-135m-instruct"
    version = BenchmarkVersion.objects.get(benchmark__name=EXAMPLE_BENCHMARK)
    assert run.spec["auto_eval"] == [version.pk] and version.task_count == EXAMPLE_HELDOUT_TASKS
    assert Gate.objects.filter(name=EXAMPLE_GATE).exists()
    assert start_example_run() == f"example run: run {run.pk} ({run.status})"  # idempotent
    assert Run.objects.count() == 1
    client.force_login(users["viewer"])
    assert "Example: GRPO of SmolLM2-135M" in client.get("/").content.decode()  # on the first screen


def test_the_example_holds_out_tasks_that_neither_its_training_set_nor_demo_arithmetic_holds() -> None:
    from apps.web.example import example_split

    training, held_out = example_split()
    prompts = {row["prompt"] for row in held_out}
    assert len(prompts) == len(held_out) == EXAMPLE_HELDOUT_TASKS
    assert not prompts & {row["prompt"] for row in training}
    assert not prompts & {row["prompt"] for row in arithmetic_tasks(256, seed=0, difficulty=1)}  # demo-arithmetic
    assert example_split() == (training, held_out)  # the same rows every time
