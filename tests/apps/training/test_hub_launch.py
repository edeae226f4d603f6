"""A launch naming a Hub id or a path: the control plane checks what it can see (the Hub's config when it answers)
and leaves the rest to the worker's preflight (tests/workers/jobs/test_preflight.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apps.runs.models import Run
from tests.factories import exact_answer_version, tasks_version
from tests.hub_standin import HubStandin, isolate_hub_client
from workers.envs.registry import arithmetic_tasks

pytestmark = pytest.mark.django_db

TINY_SHAPE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "vocab_size": 49152,
}
# 8B parameters' worth of shape: far over the default 8 GB a run asks for.
HUGE_SHAPE = {**TINY_SHAPE, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32}


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    refused = isolate_hub_client(monkeypatch, tmp_path / "cache")
    with HubStandin() as server:
        server.add_repo("crucible-test/tiny", {"config.json": json.dumps(TINY_SHAPE).encode()})
        server.add_repo("crucible-test/huge", {"config.json": json.dumps(HUGE_SHAPE).encode()})
        server.add_repo("crucible-test/gated", {"config.json": b"{}"}, gated=True, token="hf_secret")
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE"):
            monkeypatch.delenv(name, raising=False)
        yield server
    assert not refused


@pytest.fixture
def launch(users, client_for, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr("apps.runs.tasks.dispatch_run.delay", lambda run_id: None)
    owner = users["operator"]
    tasks = tasks_version(owner=owner, rows=arithmetic_tasks(8, seed=0))
    reward = exact_answer_version(owner=owner)

    def post(base_model: str):  # type: ignore[no-untyped-def]
        config = {"base_model": base_model, "steps": 2, "prompts_per_step": 2, "group_size": 2}
        body = {"kind": "train", "dataset_version": tasks.pk, "reward_version": reward.pk, "config": config}
        return client_for("operator").post("/api/v1/runs/", body, format="json")

    return post


def test_a_hub_id_the_hub_knows_is_launched_with_its_revision(standin: HubStandin, launch) -> None:  # type: ignore[no-untyped-def]
    for name in ("crucible-test/tiny", "crucible-test/tiny@main"):
        reply = launch(name)
        assert reply.status_code == 201, reply.json()
        assert Run.objects.get(pk=reply.json()["id"]).spec["config"]["base_model"] == name
    assert ("GET", "/crucible-test/tiny/resolve/main/config.json") in standin.requests


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("crucible-test/tinny", "no model 'crucible-test/tinny' on http://127.0.0.1"),
        ("crucible-test/tiny@v9", "has no revision 'v9'"),
        ("crucible-test/huge", "needs about"),
        ("tiny", "a Hub id (org/name or org/name@revision)"),
        ("org/na me", "unknown model"),
    ],
)
def test_a_hub_id_the_hub_refuses_or_a_malformed_name_is_a_400_and_stores_nothing(
    standin: HubStandin, launch, name: str, words: str
) -> None:  # type: ignore[no-untyped-def]
    reply = launch(name)
    assert reply.status_code == 400, reply.json()
    fields = reply.json()["fields"]
    field = "config.compute.memory_gb" if name.endswith("huge") else "config.base_model"
    assert words in " ".join(fields[field]), fields
    assert not Run.objects.exists()


def test_what_the_control_plane_cannot_see_is_left_to_the_workers(
    standin: HubStandin, launch, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    # A gated repository (the workers may hold the token), a path that is not on this host, an unreachable Hub.
    assert launch("crucible-test/gated").status_code == 201
    assert launch("/models/only-on-the-workers").status_code == 201
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    assert launch("crucible-test/anything").status_code == 201
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert launch("crucible-test/tinny").status_code == 201
    assert Run.objects.count() == 4
