"""Sub-agents as Ray tasks: one reply's assign_task calls fan out on a real local Ray cluster, each task loading
the saved index itself, and a task still running at its time limit is cancelled and reported."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from workers.search.index import SearchIndex
from workers.search.index_store import save_index
from workers.swarm.subagents import SubagentJob, run_subagents


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="crucible-swarm-tests")
    yield
    if started:
        ray.shutdown()


def _jobs(uri: str, names: list[str]) -> list[SubagentJob]:
    return [
        SubagentJob(
            run_id=f"t1-{i}",
            agent="lookup",
            system_prompt="You look things up.",
            prompt=f"Find `{name}` in the corpus and report: document, kind.",
            checkpoint="scripted",
            max_steps=5,
            index_uri=uri,
        )
        for i, name in enumerate(names)
    ]


def test_sub_agents_run_as_ray_tasks_and_a_late_one_is_cut(
    ray_cluster: None, swarm_index: SearchIndex, tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setenv("CRUCIBLE_INDEX_CACHE", str(tmp_path / "cache"))
    uri = f"file://{tmp_path}/index"
    save_index(swarm_index, uri)

    results = run_subagents(_jobs(uri, ["alpha.open", "delta.Pool", "beta.merge"]), runner="ray", timeout_s=120)

    assert [r.finished for r in results] == [True, True, True], [r.message for r in results]
    assert "document: lib:alpha" in results[0].message and "kind: class" in results[1].message
    assert all(r.steps == 2 and r.turns for r in results)

    cut = run_subagents(_jobs(uri, ["gamma.encode"]), runner="ray", timeout_s=0.001)
    assert cut[0].cut and not cut[0].finished and "time limit" in cut[0].message
