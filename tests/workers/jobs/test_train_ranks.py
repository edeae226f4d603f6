"""A training run whose learner is two FSDP2 ranks on Ray (workers.rl.learner_group): it finishes, reports where
every rank ran, writes sharded checkpoints with a checksum manifest, and a single-learner run resumes from one
(2 -> 1); an eval loads the sharded checkpoint's weights on one process. Slow: a local Ray instance starts and
three learner processes load a model (the world-size equivalence itself is in the default suite:
tests/workers/rl/test_distributed_learner.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import workers.jobs.train as train
from workers.envs.registry import arithmetic_tasks
from workers.rl.checkpoints import checkpoint_policy_state
from workers.specs import TrainSpec
from workers.storage import CHECKSUM_SUFFIX, sharded_manifest

from .test_train_dynamic_sampling import RecordingReporter

TINY = "tiny-llama-smollm2-tokenizer"


def _spec(tmp_path: Path, out: str, learner: dict[str, Any], steps: int, resume_from: str | None = None) -> TrainSpec:
    return TrainSpec(
        run_id=1,
        kind="train",
        ingest_url="http://127.0.0.1:9/",
        input_uri=f"file://{tmp_path}/tasks.jsonl",
        reward={"terms": [{"type": "exact_match"}]},
        output_prefix=f"file://{tmp_path}/{out}",
        resume_from=resume_from,
        config={
            "base_model": TINY,
            "algorithm": "grpo",
            "steps": steps,
            "prompts_per_step": 2,
            "group_size": 2,
            "learning_rate": 1e-3,
            "checkpoint_every": 1,
            "sampling": {"max_new_tokens": 4},
            "env_params": {"answer_format": "last_number"},
            "compute": {"cpus": 2, "memory_gb": 2},
            "learner": learner,
        },
    )


@pytest.mark.slow
def test_a_two_rank_fsdp2_run_places_its_ranks_checkpoints_in_shards_and_resumes_on_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reporters: list[RecordingReporter] = []

    def reporter_for(spec: TrainSpec) -> RecordingReporter:
        reporters.append(RecordingReporter())
        return reporters[-1]

    monkeypatch.setattr(train, "reporter_for", reporter_for)
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in arithmetic_tasks(8, seed=0)))

    train.run(_spec(tmp_path, "ranks", {"strategy": "fsdp2", "ranks": 2}, steps=2))

    calls = reporters[0].calls
    [placement] = [kw for name, args, _ in calls if name == "summary" for kw in args if "placement" in kw]
    ranks = [p for p in placement["placement"] if p["role"] == "learner"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert [p["role"] for p in placement["placement"]] == ["learner", "learner", "engine"]
    assert all(r["node_id"] and r["resources"].get("CPU", 0) > 0 for r in ranks)
    assert len({r["pid"] for r in ranks}) == 2  # two processes, not one
    checkpoints = [args for name, args, _ in calls if name == "checkpoint"]
    assert [(step, uri.rsplit("/", 1)[-1]) for step, uri, _ in checkpoints] == [
        (1, "step-000001.dcp"),
        (2, "step-000002.dcp"),
    ]
    first = checkpoints[0][1]
    manifest = json.loads(Path(first.removeprefix("file://") + CHECKSUM_SUFFIX).read_text())
    assert manifest["files"] == sharded_manifest(first, {})  # every file, with its checksum
    assert any(name.endswith(".distcp") for name in manifest["files"]) and "crucible.json" in manifest["files"]

    train.run(_spec(tmp_path, "resumed", {"strategy": "single"}, steps=2, resume_from=first))
    logs = [args[0] for name, args, _ in reporters[1].calls if name == "log"]
    assert any(line.startswith(f"resumed from {first} at step 1") for line in logs)
    assert [args[0] for name, args, _ in reporters[1].calls if name == "metric"] == [2]

    state, version = checkpoint_policy_state(TINY, checkpoints[1][1], {}, threads=1)
    assert version == 2 and all(torch.isfinite(v).all() for v in state.values())


@pytest.mark.slow
def test_a_run_from_another_runs_checkpoint_starts_from_its_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SFT → RL → RL in the job: a run names another run's checkpoint as `checkpoint_uri` (here one whose policy
    differs from the base model in one tensor); it starts from that policy at step 0 (not a resume), and its own
    checkpoint reads back on top of it, not on top of the base model."""
    from workers.models.registry import resolve_base_model
    from workers.rl.config import TrainConfig
    from workers.rl.learner import Learner

    reporters: list[RecordingReporter] = []
    monkeypatch.setattr(train, "reporter_for", lambda spec: reporters.append(RecordingReporter()) or reporters[-1])
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in arithmetic_tasks(8, seed=0)))
    spec = _spec(tmp_path, "second", {"strategy": "single"}, steps=1)
    earlier = Learner(str(resolve_base_model(TINY)), TrainConfig.model_validate(spec.config.model_dump()))
    name, tensor = next(iter(earlier.model.named_parameters()))
    with torch.no_grad():
        tensor.add_(0.5)  # "what run 1 learned"
    (tmp_path / "first.pt").write_bytes(earlier.checkpoint_bytes(data_position=0))
    first = f"file://{tmp_path}/first.pt"

    train.run(spec.model_copy(update={"config": spec.config.model_copy(update={"checkpoint_uri": first})}))
    logs = [args[0] for name, args, _ in reporters[0].calls if name == "log"]
    assert any(line.startswith(f"starting from checkpoint {first}") for line in logs)
    assert not any(line.startswith("resumed from") for line in logs)
    [(step, second, _)] = [args for name, args, _ in reporters[0].calls if name == "checkpoint"]
    start, _ = checkpoint_policy_state(TINY, first, {}, threads=1)
    after, version = checkpoint_policy_state(TINY, second, {}, threads=1)
    base = dict(Learner(str(resolve_base_model(TINY)), TrainConfig(base_model=TINY)).model.named_parameters())
    assert step == 1 and version == 1
    assert not torch.equal(after[name], base[name].detach())  # run 1's change is in run 2's policy
    assert torch.allclose(after[name], start[name], atol=0.05)  # one small step from where it started
