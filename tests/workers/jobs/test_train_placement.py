"""Where a training run's actors go (workers.rl.placement): the plan's arithmetic and its refusals, the engines'
sleep on the transformers backend, and two real runs on a local Ray instance, one colocated (the engines share
the learner's bundle and sleep while it trains) and one split (engines with their own resources, steered by a
custom resource), each reporting every actor's placement and the run's effective resources (slow: the default
suite sees both placements in tests/test_e2e.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

import workers.jobs.train as train
from workers.envs.registry import arithmetic_tasks
from workers.models import SamplingParams, make_backend
from workers.rl.config import TrainConfig
from workers.rl.placement import GB, plan_resources, shortfall
from workers.specs import TrainSpec

from .test_train_dynamic_sampling import RecordingReporter

TINY = "tiny-llama-smollm2-tokenizer"


def test_by_default_a_sync_run_is_colocated_and_an_async_run_is_split_with_the_totals_shared() -> None:
    sync = plan_resources(TrainConfig(compute={"cpus": 4, "gpus": 2, "memory_gb": 8, "rollout_workers": 3}))
    assert sync.placement == "colocated" and sync.rank == {"CPU": 4.0, "GPU": 2.0, "memory": 8.0 * GB}
    assert sync.total() == sync.rank  # the engines add nothing: they share the rank's bundle
    assert sync.members(0) == 4 and sync.engine_claim(2) == sync.rank_claim(0) == {
        "CPU": 1.0,
        "GPU": 0.5,
        "memory": 2.0 * GB,
    }
    assert sync.engine_threads() == sync.rank_threads() == 4  # they take turns on the whole bundle
    split = plan_resources(TrainConfig(mode="async", max_staleness=1, compute={"cpus": 4, "rollout_workers": 3}))
    assert split.placement == "split" and split.rank["CPU"] == split.engine["CPU"] == 1.0
    assert split.total()["CPU"] == 4.0 and len(split.every_bundle()) == 4


def test_per_role_resources_with_a_custom_resource_and_two_ranks() -> None:
    config = TrainConfig(
        learner={"strategy": "ddp", "ranks": 2},
        compute={
            "placement": "split",
            "rollout_workers": 2,
            "per_rank": {"cpus": 2, "gpus": 1, "memory_gb": 16},
            "per_engine": {"cpus": 1, "gpus": 1, "custom": {"engine_node": 1}},
        },
    )
    plan = plan_resources(config)
    assert plan.total() == {"CPU": 6.0, "GPU": 4.0, "memory": 32.0 * GB, "engine_node": 2.0}
    assert plan.summary()["per_engine"] == {"CPU": 1.0, "engine_node": 1.0, "GPU": 1.0}
    assert "2 learner rank(s) x [2 CPU, 1 GPU, 16 GB memory] + 2 engine(s)" in plan.need_text()


@pytest.mark.parametrize(
    ("compute", "extra", "words"),
    [
        ({"cpus": 4, "per_rank": {"cpus": 2}}, {}, "compute.cpus is a total"),
        ({"placement": "colocated", "per_engine": {"cpus": 1}}, {}, "colocated engines share"),
        ({"placement": "colocated"}, {"mode": "async", "max_staleness": 1}, "use placement split"),
        ({"per_rank": {"cpus": 1, "custom": {"GPU": 1}}}, {}, "custom resource 'GPU'"),
        ({"per_rank": {"cpus": 1, "custom": {"node_a": 0}}}, {}, "must be in (0, 1000000]"),
        ({"cpus": 2}, {"backend": "vllm"}, "backend 'vllm' needs a GPU"),
    ],
)
def test_an_incoherent_compute_request_is_refused_naming_what_to_change(
    compute: dict[str, Any], extra: dict[str, Any], words: str
) -> None:
    with pytest.raises(ValidationError, match="compute|backend") as caught:
        TrainConfig(compute=compute, **extra)
    assert words in str(caught.value)


def test_shortfall_names_the_resource_no_node_has_and_packs_bundles_like_ray() -> None:
    nodes = [{"CPU": 8.0, "GPU": 1.0}, {"CPU": 8.0, "GPU": 1.0}]
    assert shortfall([{"CPU": 2.0, "GPU": 1.0}] * 2, nodes) == ""
    whole = shortfall([{"CPU": 2.0, "GPU": 2.0}], nodes)
    assert "no node has that much GPU" in whole and "the cluster 2 GPU in 2 node(s)" in whole
    assert "cannot hold them all at once" in shortfall([{"CPU": 2.0, "GPU": 1.0}] * 3, nodes)
    assert "no node has that much engine_node" in shortfall([{"CPU": 1.0, "engine_node": 1.0}], nodes)


def test_a_sleeping_transformers_engine_refuses_to_generate_until_it_wakes() -> None:
    backend = make_backend("transformers", TINY)
    assert backend.sleep() == 0  # on CPU the weights are in host memory already: nothing to release
    params = SamplingParams(max_new_tokens=2, temperature=0.0)
    with pytest.raises(RuntimeError, match="asleep"):
        backend.generate([[1, 2, 3]], params)
    backend.wake()
    assert len(backend.generate([[1, 2, 3]], params)) == 1


@pytest.fixture(scope="module")
def ray_with_an_engine_resource() -> Iterator[None]:
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(
            num_cpus=4,
            resources={"engine_node": 2},
            include_dashboard=False,
            log_to_driver=False,
            namespace="crucible-tests",
        )
    yield
    if started:
        ray.shutdown()


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, **config: Any) -> list[tuple[str, Any, Any]]:
    reporter = RecordingReporter()
    monkeypatch.setattr(train, "reporter_for", lambda spec: reporter)
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in arithmetic_tasks(8, seed=0)))
    train.run(
        TrainSpec(
            run_id=1,
            kind="train",
            ingest_url="http://127.0.0.1:9/",
            input_uri=f"file://{tmp_path}/tasks.jsonl",
            reward={"terms": [{"type": "exact_match"}]},
            output_prefix=f"file://{tmp_path}/{name}",
            config={
                "base_model": TINY,
                "steps": 2,
                "prompts_per_step": 2,
                "group_size": 2,
                "checkpoint_every": 10,
                "sampling": {"max_new_tokens": 4},
                "env_params": {"answer_format": "last_number"},
                **config,
            },
        )
    )
    return reporter.calls


def _summary(calls: list[tuple[str, Any, Any]], key: str) -> Any:
    [value] = [args[0][key] for name, args, _ in calls if name == "summary" and key in args[0]]
    return value


@pytest.mark.slow  # the default suite runs both placements through the real stack: tests/test_e2e.py
def test_a_colocated_and_a_split_run_each_finish_and_show_where_every_actor_ran(
    ray_with_an_engine_resource: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _run(tmp_path, monkeypatch, "colocated", compute={"cpus": 2, "memory_gb": 2, "rollout_workers": 2})
    placement = _summary(calls, "placement")
    assert [(p["role"], p["rank"]) for p in placement] == [("learner", 0), ("engine", 0), ("engine", 1)]
    assert len({p["node_id"] for p in placement}) == 1 and len({p["pid"] for p in placement}) == 3
    assert all(p["resources"]["CPU"] == pytest.approx(2 / 3, abs=1e-3) for p in placement)  # a third of the bundle each
    assert _summary(calls, "resources")["placement"] == "colocated"
    metrics = [args[1] for name, args, _ in calls if name == "metric"]
    assert len(metrics) == 2 and all(m["placement/engine_sleep_seconds"] > 0 for m in metrics)
    assert all(m["placement/released_gb"] == 0 for m in metrics)  # CPU: nothing to release (documented)

    calls = _run(
        tmp_path,
        monkeypatch,
        "split",
        mode="async",
        max_staleness=1,
        compute={
            "placement": "split",
            "rollout_workers": 2,
            "per_rank": {"cpus": 1, "memory_gb": 1},
            "per_engine": {"cpus": 1, "custom": {"engine_node": 1}},
        },
    )
    placement = _summary(calls, "placement")
    engines = [p for p in placement if p["role"] == "engine"]
    assert len(engines) == 2 and all(p["resources"] == {"CPU": 1.0, "engine_node": 1.0} for p in engines)
    [learner] = [p for p in placement if p["role"] == "learner"]
    assert learner["resources"] == {"CPU": 1.0, "memory_gb": 1.0}
    resources = _summary(calls, "resources")
    assert resources["placement"] == "split" and resources["total"] == {
        "CPU": 3.0,
        "memory_gb": 1.0,
        "engine_node": 2.0,
    }
    metrics = [args[1] for name, args, _ in calls if name == "metric"]
    assert len(metrics) == 2 and not any("placement/engine_sleep_seconds" in m for m in metrics)
