"""The trainer job runs DAPO's dynamic sampling on Ray (workers.jobs.train): a step whose groups have no signal is
refilled with extra rollouts up to `dynamic_sampling_max_rounds` rounds, then trains on what it has (here nothing:
a random tiny model never answers right) and reports what it took. Slow: a local Ray instance starts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import workers.jobs.train as train
from workers.envs.registry import arithmetic_tasks
from workers.specs import TrainSpec


class RecordingReporter:
    """Stands in for the ingest reporter: records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __enter__(self) -> RecordingReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self.calls.append((name, args, kwargs))


@pytest.mark.slow
def test_a_dapo_run_refills_each_step_up_to_its_max_rounds(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    reporter = RecordingReporter()
    monkeypatch.setattr(train, "reporter_for", lambda spec: reporter)
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in arithmetic_tasks(12, seed=0)))
    spec = TrainSpec(
        run_id=1,
        kind="train",
        ingest_url="http://127.0.0.1:9/",
        input_uri=f"file://{tmp_path}/tasks.jsonl",
        reward={"terms": [{"type": "exact_match"}]},
        output_prefix=f"file://{tmp_path}/out",
        config={
            "base_model": "tiny-llama-smollm2-tokenizer",
            "algorithm": "dapo",
            "steps": 1,
            "prompts_per_step": 2,
            "group_size": 2,
            "sampling": {"max_new_tokens": 4},
            "env_params": {"answer_format": "last_number"},
            "compute": {"cpus": 2, "memory_gb": 2},
            "dynamic_sampling_max_rounds": 3,
        },
    )

    train.run(spec)

    [(_, (step, metrics), _)] = [call for call in reporter.calls if call[0] == "metric"]
    assert step == 1
    assert metrics["dynamic_sampling/rounds"] == 3 and metrics["dynamic_sampling/generated_groups"] == 6
    assert metrics["dynamic_sampling/short_groups"] == 2 and metrics["trained_samples"] == 0
    logs = [args[0] for name, args, _ in reporter.calls if name == "log"]
    assert any(line.startswith("effective settings: scale_rewards=group, dynamic_sampling=true") for line in logs)
    assert any("dynamic sampling kept 0 of 2 groups after 3 rounds" in line for line in logs)
    trajectories = [kwargs["trajectory_id"] for name, _, kwargs in reporter.calls if name == "trajectory"]
    assert len(set(trajectories)) == 12  # every generated episode of the three rounds is reported, ids distinct
