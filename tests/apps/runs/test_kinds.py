"""The run-kind registry (apps.runs.kinds): every kind has a handler, what each launch builds is what its worker
parses, and a job input the worker would refuse is a 400 at launch that names the field and leaves no row."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from rest_framework.exceptions import ValidationError

from apps.benchmarks.services import eval_launch
from apps.coding.services import codegen_launch, repo_import_launch, repo_mine_launch
from apps.datasets.models import DatasetKind
from apps.datasets.services import dataset_create, dataset_version_create
from apps.realtime.services.serving import session_train_launch, simulate_launch
from apps.rewards.services import reward_config_create
from apps.runs import kinds
from apps.runs.checks import run_kinds_check
from apps.runs.models import Run, RunKind
from apps.runs.services import run_create, worker_spec
from apps.search.services.datagen import datagen_launch
from apps.search.services.indexes import index_launch
from apps.training.services import run_launch_sft, run_launch_train
from tests.apps.coding.test_import import jsonl, task_row
from tests.apps.realtime.session_factories import serve_run, turn_event
from tests.apps.realtime.test_launches import _repo_tasks_version as repo_tasks_version
from tests.factories import coding_version, context1_version, exact_answer_version, tasks_version, trajectories_version
from workers.envs.registry import arithmetic_tasks
from workers.search.types import Chunk, dump_chunks_jsonl
from workers.specs import JOB_SPECS, RescoreSpec

pytestmark = pytest.mark.django_db


def test_every_run_kind_has_a_handler_and_the_system_check_passes() -> None:
    # Every built-in kind has its handler; apps add kinds of their own (apps.coding: repoimport) without RunKind.
    assert set(RunKind.values) <= {h.kind for h in kinds.handlers()}
    assert "repoimport" in {h.kind for h in kinds.handlers()}
    assert run_kinds_check(None) == []
    call_command("check")  # the same check through manage.py


def test_every_job_spec_names_a_module_that_parses_it() -> None:
    for spec in JOB_SPECS:
        module = importlib.util.find_spec(spec.entrypoint)
        assert module is not None, f"{spec.__name__}.entrypoint {spec.entrypoint} is not importable"
    assert {h.job_spec for h in kinds.handlers() if h.job_spec is not None} <= set(JOB_SPECS)
    assert kinds.external_kinds() == ["external"]  # the one kind trained elsewhere (the SDK's)


def test_a_kind_without_a_handler_fails_the_system_check(monkeypatch) -> None:
    monkeypatch.setattr(kinds, "_handlers", {k: v for k, v in kinds._handlers.items() if k != RunKind.EVAL})
    errors = run_kinds_check(None)
    assert [e.id for e in errors] == ["runs.E001"] and "'eval'" in errors[0].msg
    with pytest.raises(ImproperlyConfigured, match="hooks. module"):
        kinds.handler_for(RunKind.EVAL)


def test_registering_a_kind_twice_or_an_unknown_kind_is_refused() -> None:
    handler = kinds.handler_for(RunKind.RESCORE)
    kinds.register(handler)  # the same handler again (a module imported twice) is harmless
    with pytest.raises(ImproperlyConfigured, match="registered twice"):
        kinds.register(kinds.RunKindHandler(kind=RunKind.RESCORE, app="elsewhere", job_spec=RescoreSpec))
    with pytest.raises(ImproperlyConfigured, match="lowercase letters"):
        kinds.register(kinds.RunKindHandler(kind="Teleport Now", app="elsewhere", job_spec=RescoreSpec))


def test_each_kinds_launch_builds_what_its_worker_parses(run, users, settings, tmp_path, monkeypatch) -> None:
    """One launch of every registered kind through its owner's own service: the job input each stores is what the
    kind's worker spec parses. The kinds come from the registry, so a kind an app adds without a launch here fails
    this test instead of going unchecked."""
    settings.MEDIA_ROOT = tmp_path
    monkeypatch.setattr("apps.runs.tasks.dispatch_run.delay", lambda run_id: None)
    owner, model = users["operator"], "tiny-llama-smollm2-tokenizer"
    tasks, exact = tasks_version(owner=owner, rows=arithmetic_tasks(8, seed=0)), exact_answer_version(owner=owner)
    corpus_dataset = dataset_create(name="notes", kind=DatasetKind.CORPUS, owner=owner)
    chunks = [Chunk(chunk_id=f"d{i}#0", doc_id=f"d{i}", position=0, text=f"note {i} on tides") for i in range(3)]
    corpus = dataset_version_create(
        dataset=corpus_dataset, data=dump_chunks_jsonl(chunks), filename="notes.jsonl", created_by=owner
    )
    common = {"created_by": owner, "dataset_version": tasks, "reward_version": exact}
    serving = serve_run(owner)
    sessions = dataset_create(name="kind-sessions", kind=DatasetKind.SESSIONS, owner=owner)
    session = {"session_id": "s-1", "serve_run_id": serving.pk, "turns": [turn_event("s-1", 0)["turn"]]}
    session.update(started_at=1.0, ended_at=2.0)
    sessions_version = dataset_version_create(
        dataset=sessions, data=(json.dumps(session) + "\n").encode(), filename="s.jsonl", created_by=owner
    )
    feedback = reward_config_create(
        name="kind-feedback", description="", spec={"terms": [{"type": "session_feedback"}]}, owner=owner
    )
    launches: dict[str, Callable[[], Run]] = {
        "rescore": lambda: run,
        "train": lambda: run_launch_train(
            **common, config={"base_model": model, "steps": 2, "prompts_per_step": 2, "group_size": 2}
        ),
        "sft": lambda: run_launch_sft(
            **common, config={"environment": "exact_answer", "teacher_model": model, "base_model": model}
        ),
        "eval": lambda: (
            eval_launch(benchmark_version=coding_version(owner=owner), base_model=model, created_by=owner)[0].run
        ),
        "index": lambda: index_launch(corpus_version=corpus, config={"dense": False}, user=owner).run,
        "datagen": lambda: datagen_launch(corpus_version=corpus, target_dataset="notes-tasks", params={}, user=owner),
        "repoimport": lambda: repo_import_launch(
            target_dataset="kind-tasks", data=jsonl(task_row()), filename="t.jsonl", user=owner
        ),
        "codegen": lambda: codegen_launch(target_dataset="kind-gen", params={"sources": ["toolz"]}, user=owner),
        "repomine": lambda: repo_mine_launch(
            target_dataset="kind-mined", source="/srv/git/toolz", repo="pytoolz/toolz", params={}, user=owner
        ),
        "serve": lambda: serving,
        "simulate": lambda: simulate_launch(user=owner, serve_run=serving, dataset_version=repo_tasks_version(owner)),
        "sessiontrain": lambda: session_train_launch(
            user=owner, dataset_version=sessions_version, reward_version=feedback.versions.get(), base_model=model
        ),
    }
    registered = {h.kind for h in kinds.handlers() if h.job_spec is not None}  # `external` runs no job
    assert set(launches) == registered, f"kinds without a launch here: {sorted(registered - set(launches))}"
    for kind, launch in launches.items():
        launched_run = launch()
        assert launched_run.kind == kind
        spec = kinds.job_spec_for(kind).model_validate(worker_spec(launched_run))
        assert spec.run_id == launched_run.pk and spec.kind == kind


def test_a_kind_an_app_adds_needs_no_change_in_runs(users, monkeypatch) -> None:
    """A new kind is a registration: Run.kind takes it, run_create validates against its spec, no migration."""
    monkeypatch.setattr(kinds, "_handlers", dict(kinds._handlers))
    kinds.register(kinds.RunKindHandler(kind="distill", app="tests", job_spec=RescoreSpec))
    run = run_create(
        kind="distill",
        created_by=users["operator"],
        name="a new kind",
        job={"input_uri": "file:///in.jsonl", "output_uri": "file:///out.jsonl", "reward": {}},
    )
    run.refresh_from_db()
    assert run.kind == "distill" and RescoreSpec.model_validate(worker_spec(run)).kind == "distill"
    assert "distill" in [h.kind for h in kinds.handlers()][len(RunKind.values) :]  # after the built-in kinds


def test_a_job_the_worker_would_refuse_is_a_400_naming_the_field_and_leaves_no_row(users) -> None:
    owner = users["operator"]
    before = Run.objects.count()
    with pytest.raises(ValidationError) as refused:
        run_create(
            kind=RunKind.RESCORE,
            created_by=owner,
            name="mis-built",
            job={"input_uri": "file:///x", "reward": {}, "shard_size": "many"},  # no output_uri; shard_size not int
        )
    fields = refused.value.detail
    assert set(fields) == {"job.output_uri", "job.shard_size"}, fields
    assert Run.objects.count() == before


def test_a_row_from_before_the_job_was_stored_still_dispatches(users, trajectories_jsonl) -> None:
    """Rows made by an older version keep only their spec: the kind's job_from_row rebuilds the job input."""
    owner = users["operator"]
    dataset, reward = trajectories_version(owner=owner, data=trajectories_jsonl), context1_version(owner=owner)
    old = Run.objects.create(
        kind=RunKind.RESCORE, spec={}, dataset_version=dataset, reward_version=reward, created_by=owner
    )
    spec = RescoreSpec.model_validate(worker_spec(old))
    assert spec.output_uri.endswith(f"runs/{old.pk}/scores.jsonl")


def test_posting_a_kind_not_launched_here_names_the_ones_that_are(client_for) -> None:
    reply = client_for("operator").post("/api/v1/runs/", {"kind": "eval"}, format="json")
    assert reply.status_code == 400
    assert "rescore" in reply.json()["fields"]["kind"][0] and "train" in reply.json()["fields"]["kind"][0]
