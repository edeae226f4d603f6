"""Serial collapse and spurious parallelism on real swarm episodes (scripted orchestrators, BM25 index)."""

from __future__ import annotations

from typing import Any

from workers.detectors.registry import DetectorConfig, run_detectors
from workers.envs.registry import make_env
from workers.envs.toolcalls import format_tool_call
from workers.search.index import SearchIndex
from workers.swarm.detectors.serial_collapse import SerialCollapse
from workers.swarm.detectors.spurious_parallelism import SpuriousParallelism
from workers.swarm.environment import ASSIGN_TOOL, CREATE_TOOL
from workers.swarm.scripted import ScriptedOrchestrator, run_episode


def _env(index: SearchIndex) -> Any:
    env = make_env("swarm", index_uri="memory://d", subagent_runner="threads")
    env.bind_index(index)
    return env


def _only(detector: str) -> DetectorConfig:
    from workers.detectors.registry import discover

    return DetectorConfig.model_validate({name: {"enabled": name == detector} for name in discover()})


def test_serial_collapse_flags_a_wide_task_done_alone_and_not_one_done_by_the_swarm(
    swarm_index: SearchIndex, wide_task: dict[str, Any]
) -> None:
    alone = run_episode(_env(swarm_index), ScriptedOrchestrator("single"), wide_task, "alone")
    swarm = run_episode(_env(swarm_index), ScriptedOrchestrator("swarm"), wide_task, "swarm")

    flags = run_detectors(alone, _only("serial_collapse"))
    assert [f.detector for f in flags] == ["serial_collapse"]
    assert flags[0].evidence["rows"] == 4 and flags[0].evidence["value"] == 0
    assert run_detectors(swarm, _only("serial_collapse")) == []
    proposed, reason = SerialCollapse().suggest({"terms": [{"type": "item_f1"}]})
    assert proposed["terms"][-1]["type"] == "parallel_instantiation" and "parallel_instantiation" in reason


def test_spurious_parallelism_flags_repeated_tasks_and_spares_a_real_decomposition(
    swarm_index: SearchIndex, wide_task: dict[str, Any]
) -> None:
    env = _env(swarm_index)
    env.reset(env.validate_task_row(wide_task))
    create = format_tool_call(CREATE_TOOL, {"name": "a", "system_prompt": "look"})
    same = format_tool_call(ASSIGN_TOOL, {"agent": "a", "prompt": "find `alpha.open`"})
    env.step("\n".join([create, same, same, same, same, same]))
    env.step("| name |\n|---|\n| alpha.open |")
    record = env.trajectory("spam")

    flags = run_detectors(record, _only("spurious_parallelism"))
    assert [f.detector for f in flags] == ["spurious_parallelism"]
    assert flags[0].evidence["wasted_tasks"] == 4 and flags[0].evidence["measure"] == "wasted_share"
    honest = run_episode(_env(swarm_index), ScriptedOrchestrator("swarm"), wide_task, "honest")
    assert run_detectors(honest, _only("spurious_parallelism")) == []
    proposed, _ = SpuriousParallelism().suggest({"terms": [{"type": "subagent_finish", "weight": 0.1}]})
    assert proposed["terms"][0]["weight"] == 0.15


def test_records_without_a_swarm_are_never_judged() -> None:
    record = {"id": "x", "turns": [{"role": "assistant", "content": "hi"}], "gold_table": {"rows": [{}] * 5}}
    assert SerialCollapse().detect(record, SerialCollapse.Params()) == []
    assert SpuriousParallelism().detect(record, SpuriousParallelism.Params()) == []
