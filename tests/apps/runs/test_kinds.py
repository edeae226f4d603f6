"""The run-kind registry (apps.runs.kinds): every kind has a handler, what each launch builds is what its worker
parses, and a job input the worker would refuse is a 400 at launch that names the field and leaves no row."""

from __future__ import annotations

import importlib
import json

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from rest_framework.exceptions import ValidationError

from apps.runs import kinds
from apps.runs.checks import run_kinds_check
from apps.runs.models import Run, RunKind
from apps.runs.services import run_create, worker_spec
from tests.factories import context1_version, trajectories_version
from workers.jobs.specs import JOB_SPECS, RescoreSpec

pytestmark = pytest.mark.django_db


def test_every_run_kind_has_a_handler_and_the_system_check_passes() -> None:
    assert sorted(h.kind for h in kinds.handlers()) == sorted(RunKind.values)
    assert run_kinds_check(None) == []
    call_command("check")  # the same check through manage.py


def test_every_job_spec_names_a_module_that_parses_it() -> None:
    for spec in JOB_SPECS:
        module = importlib.util.find_spec(spec.entrypoint)
        assert module is not None, f"{spec.__name__}.entrypoint {spec.entrypoint} is not importable"
    assert {h.job_spec for h in kinds.handlers()} <= set(JOB_SPECS)


def test_a_kind_without_a_handler_fails_the_system_check(monkeypatch) -> None:
    monkeypatch.setattr(kinds, "_handlers", {k: v for k, v in kinds._handlers.items() if k != RunKind.EVAL})
    errors = run_kinds_check(None)
    assert [e.id for e in errors] == ["runs.E001"] and "'eval'" in errors[0].msg
    with pytest.raises(ImproperlyConfigured, match="AppConfig.ready"):
        kinds.handler_for(RunKind.EVAL)


def test_registering_a_kind_twice_or_an_unknown_kind_is_refused() -> None:
    handler = kinds.handler_for(RunKind.RESCORE)
    kinds.register(handler)  # the same handler again (a re-run ready()) is harmless
    with pytest.raises(ImproperlyConfigured, match="registered twice"):
        kinds.register(kinds.RunKindHandler(kind=RunKind.RESCORE, app="elsewhere", job_spec=RescoreSpec))
    with pytest.raises(ImproperlyConfigured, match="lowercase letters"):
        kinds.register(kinds.RunKindHandler(kind="Teleport Now", app="elsewhere", job_spec=RescoreSpec))


def test_each_launch_builds_what_its_worker_parses(run) -> None:
    """The launch services' job inputs, through run_create, validate against the worker's own spec (the fixture's
    rescore run; the other kinds' launches are exercised the same way in their apps' tests)."""
    spec = worker_spec(run)
    parsed = kinds.handler_for(run.kind).job_spec.model_validate(spec)
    assert parsed.run_id == run.pk and json.loads(parsed.model_dump_json())["kind"] == "rescore"


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
    assert [h.kind for h in kinds.handlers()][-1] == "distill"


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
