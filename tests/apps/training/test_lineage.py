"""SFT → RL → RFT → RL as one lineage (Kimi K2.5): one request checks every stage and launches the first; each later
stage starts when the one before succeeds, from that stage's model, as its child; a stage that cannot start stops
the lineage and says why."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from apps.runs.models import Checkpoint, Run, RunStatus, TrajectorySummary
from apps.runs.storage import storage_uri
from apps.training.lineage import lineage_advance
from tests.apps.training.test_train_launch import search_world  # noqa: F401  (the fixture)
from workers.models.registry import TINY_LLAMA, resolve_base_model

pytestmark = pytest.mark.django_db

TINY = {"base_model": TINY_LLAMA}


def _body(world: dict[str, Any], **stages: Any) -> dict[str, Any]:
    return {
        "dataset_version": world["tasks"].pk,
        "reward_version": world["reward"].pk,
        "corpus_version": world["corpus"].pk,
        "name": "kimi-chain",
        "sft": {"teacher_model": "scripted-search", **TINY, "environment": "search"},
        "rl": {"steps": 1, "algorithm": "cispo", "prompts_per_step": 2, "env_params": {"max_turns": 2}},
        "rft": {"min_reward": 0.5},
        "rl2": {"steps": 1, "algorithm": "cispo", "prompts_per_step": 2, "env_params": {"max_turns": 2}},
        **stages,
    }


def _succeed(run: Run, **summary: Any) -> None:
    run.status = RunStatus.SUCCEEDED
    run.summary = {**(run.summary or {}), **summary}
    run.save(update_fields=["status", "summary"])


def _child(run: Run) -> Run:
    run.refresh_from_db()
    children = list(Run.objects.filter(parent=run))
    assert len(children) == 1, (run.summary or {}).get("lineage")
    return children[0]


def test_a_lineage_runs_its_four_stages_each_from_the_model_before(client_for, search_world) -> None:  # noqa: F811
    search_world["ready"]()
    model_dir = str(resolve_base_model(TINY_LLAMA))
    launched = client_for("operator").post("/api/v1/lineages/", _body(search_world), format="json")
    assert launched.status_code == 201, launched.json()
    sft = Run.objects.get(pk=launched.json()["id"])
    assert sft.kind == "sft" and sft.spec["lineage"]["stage"] == "sft" and sft.name == "kimi-chain: 1/4 SFT"

    _succeed(sft, model_uri=f"file://{model_dir}")
    lineage_advance(run_id=sft.pk)
    lineage_advance(run_id=sft.pk)  # idempotent: one child only
    rl = _child(sft)
    assert rl.kind == "train" and rl.spec["config"]["base_model"] == model_dir and rl.spec["lineage"]["stage"] == "rl"

    name = default_storage.save(
        f"runs/{rl.pk}/trajectories/step-000001.jsonl",
        ContentFile(
            json.dumps(
                {
                    "id": "t-1",
                    "task_id": "t0",
                    "turns": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
                }
            )
            + "\n"
        ),
    )
    TrajectorySummary.objects.create(
        run=rl, trajectory_id="t-1", task_id="t0", reward=0.9, storage_uri=storage_uri(name)
    )
    Checkpoint.objects.create(run=rl, step=1, uri="file:///tmp/ckpt-step-1.pt")
    _succeed(rl)
    lineage_advance(run_id=rl.pk)
    rft = _child(rl)
    config = rft.spec["job"]["config"]
    assert rft.kind == "sft" and config["teacher_model"] == "records" and config["checkpoint_uri"].endswith("step-1.pt")
    assert rft.dataset_version.dataset.name.endswith("-rft") and rft.dataset_version.row_count == 1

    _succeed(rft, model_uri=f"file://{model_dir}")
    lineage_advance(run_id=rft.pk)
    rl2 = _child(rft)
    assert rl2.kind == "train" and rl2.spec["lineage"]["stage"] == "rl2" and rl2.name == "kimi-chain: 4/4 RL"
    _succeed(rl2)
    lineage_advance(run_id=rl2.pk)
    rl2.refresh_from_db()
    assert rl2.summary["lineage"]["complete"] is True and not Run.objects.filter(parent=rl2).exists()


def test_a_stage_with_nothing_to_export_stops_the_lineage_saying_why(client_for, search_world) -> None:  # noqa: F811
    search_world["ready"]()
    sft = Run.objects.get(
        pk=client_for("operator").post("/api/v1/lineages/", _body(search_world), format="json").json()["id"]
    )
    _succeed(sft, model_uri=f"file://{resolve_base_model(TINY_LLAMA)}")
    lineage_advance(run_id=sft.pk)
    rl = _child(sft)
    Checkpoint.objects.create(run=rl, step=1, uri="file:///tmp/ckpt.pt")
    _succeed(rl)
    lineage_advance(run_id=rl.pk)
    rl.refresh_from_db()
    assert "reported no trajectories" in rl.summary["lineage"]["stopped"] and not Run.objects.filter(parent=rl).exists()


@pytest.mark.parametrize(
    ("stages", "field"),
    [
        ({"rl": {"base_model": "x"}}, "rl.base_model"),
        ({"rl2": {"steps": 0}}, "rl2.steps"),
        ({"rft": {"keep": 3}}, "rft"),
        ({"sft": {"epochs": 0}}, "sft.epochs"),
        ({"rl": "fast"}, "rl"),
        ({"rl2": {"prompts_per_step": 50}}, "rl2.prompts_per_step"),
    ],
)
def test_every_stage_is_checked_before_anything_starts(client_for, search_world, stages, field) -> None:  # noqa: F811
    search_world["ready"]()
    response = client_for("operator").post("/api/v1/lineages/", _body(search_world, **stages), format="json")
    assert response.status_code == 400 and field in response.json()["fields"], response.json()
    assert not Run.objects.filter(kind__in=["sft", "train"]).exists()


def test_a_viewer_may_not_launch_a_lineage(client_for, search_world) -> None:  # noqa: F811
    assert client_for("viewer").post("/api/v1/lineages/", _body(search_world), format="json").status_code == 403
