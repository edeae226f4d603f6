"""RFT's second half: an SFT run on stored trajectories (an RFT export) trains the student on the orchestrator's
replies of each record, with the sub-agents' messages and every observation as context only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import workers.jobs.sft as sft
from tests.workers.jobs.test_train_dynamic_sampling import RecordingReporter
from workers.envs.registry import make_env
from workers.models.registry import TINY_LLAMA, load_tokenizer, resolve_base_model
from workers.search.index import SearchIndex
from workers.specs import SFTSpec
from workers.swarm.scripted import ScriptedOrchestrator, run_episode


def _records(index: SearchIndex, task: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for i in range(2):
        env = make_env("swarm", index_uri="memory://rft", subagent_runner="threads")
        env.bind_index(index)
        out.append(run_episode(env, ScriptedOrchestrator(), task, f"r{i}"))
    return out


def _records_spec(tmp_path: Path, records: list[dict[str, Any]], **config: Any) -> SFTSpec:
    """An SFT job on `records` (written to rft.jsonl) with teacher "records" and the tiny model, one epoch."""
    (tmp_path / "rft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return SFTSpec(
        run_id=1,
        kind="sft",
        ingest_url="http://127.0.0.1:9/",
        input_uri=f"file://{tmp_path}/rft.jsonl",
        reward={"terms": [{"type": "item_f1"}]},
        output_prefix=f"file://{tmp_path}/out",
        config={"teacher_model": "records", "base_model": TINY_LLAMA, "environment": "swarm", "epochs": 1, **config},
    )


def test_record_samples_train_the_replies_only(swarm_index: SearchIndex, wide_task: dict[str, Any]) -> None:
    tokenizer = load_tokenizer(resolve_base_model(TINY_LLAMA))
    [sample, _] = sft.record_samples(_records(swarm_index, wide_task), tokenizer)
    completion = sample.token_ids[sample.completion_start :]
    trained = tokenizer.decode([t for t, m in zip(completion, sample.loss_mask, strict=True) if m])
    context = tokenizer.decode([t for t, m in zip(completion, sample.loss_mask, strict=True) if not m])
    assert trained.count("<tool_call>") == 1 + len(wide_task["table"]["rows"]) and "| name |" in trained
    assert "[sub-agent lookup" in context and "<tool_call>" not in context
    assert tokenizer.decode(sample.token_ids[: sample.completion_start]).count(wide_task["prompt"][:40]) == 1


def test_an_sft_run_on_records_fine_tunes_without_a_teacher(
    swarm_index: SearchIndex, wide_task: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reporter = RecordingReporter()
    monkeypatch.setattr(sft, "reporter_for", lambda spec: reporter)

    summary = sft.run(_records_spec(tmp_path, _records(swarm_index, wide_task), learning_rate=1e-4))

    assert summary["fine_tuned"] is True and summary["sft_filter"]["source"] == "records"
    assert summary["sft_filter"]["kept"] == 2
    assert (tmp_path / "out" / "sft" / "model" / "config.json").is_file()


def test_rft_fine_tunes_from_a_trainer_checkpoint(
    swarm_index: SearchIndex, wide_task: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The RFT stage of a lineage starts from the RL run's checkpoint, not from the base model."""
    import torch

    from workers.rl.config import TrainConfig
    from workers.rl.learner import Learner

    learner = Learner(resolve_base_model(TINY_LLAMA), TrainConfig(base_model=TINY_LLAMA, learning_rate=0.0))
    with torch.no_grad():
        next(learner.model.parameters()).add_(0.5)  # weights the base model does not have
    (tmp_path / "ckpt.pt").write_bytes(learner.checkpoint_bytes(data_position=0))
    reporter = RecordingReporter()
    monkeypatch.setattr(sft, "reporter_for", lambda spec: reporter)
    spec = _records_spec(
        tmp_path, _records(swarm_index, wide_task), learning_rate=1e-9, checkpoint_uri=f"file://{tmp_path}/ckpt.pt"
    )
    assert sft.run(spec)["fine_tuned"] is True
    logs = [args[0] for name, args, _ in reporter.calls if name == "log"]
    assert any(line.startswith(f"starting from file://{tmp_path}/ckpt.pt") for line in logs)
    from transformers import AutoModelForCausalLM

    tuned = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out" / "sft" / "model"), local_files_only=True)
    expected = next(learner.model.parameters()).detach()
    assert torch.allclose(next(tuned.parameters()).detach(), expected, atol=1e-4)  # the checkpoint's, not the base's
