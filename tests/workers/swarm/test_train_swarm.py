"""The trainer job on the agent swarm (issue 19), on a local Ray: sub-agents run as Ray tasks from the rollout
actor, the PARL weights anneal and are charted, the swarm's metrics reach the run, Kimi's loss trains, and the
Toggle's budgets are fixed by a pass before step 1 and stored for a resume. Slow: a local Ray instance starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import workers.jobs.train as train
from tests.workers.jobs.test_train_dynamic_sampling import RecordingReporter
from workers.rewards.schema import parl_spec
from workers.rl.steps import TOGGLE_BUDGETS_FILE
from workers.search.index import SearchIndex
from workers.search.index_store import save_index
from workers.search.types import Chunk
from workers.specs import TrainSpec


@pytest.mark.slow
def test_a_parl_run_on_the_swarm_with_kimis_loss_and_the_toggle(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    swarm_index: SearchIndex,
    wide_task: dict,
    swarm_chunks: list[Chunk],
) -> None:
    reporter = RecordingReporter()
    monkeypatch.setattr(train, "reporter_for", lambda spec: reporter)
    monkeypatch.setenv("CRUCIBLE_INDEX_CACHE", str(tmp_path / "cache"))
    uri = f"file://{tmp_path}/index"
    save_index(swarm_index, uri)
    (tmp_path / "tasks.jsonl").write_text(json.dumps(wide_task) + "\n")
    spec = TrainSpec(
        run_id=1,
        kind="train",
        ingest_url="http://127.0.0.1:9/",
        input_uri=f"file://{tmp_path}/tasks.jsonl",
        reward=parl_spec(lambda_parallel=0.2, lambda_finish=0.2, anneal_steps=2).model_dump(mode="json"),
        output_prefix=f"file://{tmp_path}/out",
        config={
            "base_model": "tiny-llama-smollm2-tokenizer",
            "environment": "swarm",
            "env_params": {"index_uri": uri, "max_turns": 2, "subagent_runner": "ray"},
            "algorithm": "kimi",
            "steps": 2,
            "prompts_per_step": 1,
            "group_size": 2,
            "sampling": {"max_new_tokens": 8},
            "compute": {"cpus": 2, "memory_gb": 2},
            "toggle": {"correct_at": 0.0, "m": 1},
        },
    )

    train.run(spec)

    metrics = {args[0]: args[1] for name, args, _ in reporter.calls if name == "metric" and len(args) == 2}
    assert sorted(metrics) == [1, 2]
    assert metrics[1]["reward/lambda/parallel_instantiation"] == pytest.approx(0.2)
    assert metrics[2]["reward/lambda/parallel_instantiation"] == pytest.approx(0.1)
    assert metrics[1]["toggle/phase"] == 0.0 and metrics[2]["toggle/phase"] == 1.0
    assert "env/critical_steps" in metrics[1] and metrics[1]["env/critical_steps"] >= 1
    budgets = json.loads((tmp_path / "out" / TOGGLE_BUDGETS_FILE).read_text())
    assert list(budgets) == [wide_task["id"]]  # every sample counts as correct at correct_at 0
    logs = [args[0] for name, args, _ in reporter.calls if name == "log"]
    assert any("toggle: rolling out 1 tasks once" in line for line in logs)
