"""The agent-swarm environment: sub-agents in parallel, critical steps, bad input, hangs, and what it records.

The index is real (BM25 over a small Markdown corpus); the orchestrator is scripted replies or the scripted
orchestrator; sub-agents are the scripted searcher, or test policies registered in `POLICIES` (threads runner)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from workers.envs.base import Message
from workers.envs.registry import make_env
from workers.envs.toolcalls import format_tool_call
from workers.rewards.schema import parl_spec
from workers.rewards.score import score_trajectory
from workers.search.index import SearchIndex
from workers.swarm import subagents
from workers.swarm.environment import ASSIGN_TOOL, CREATE_TOOL, SwarmEnv
from workers.swarm.metrics import swarm_episode_metrics
from workers.swarm.scripted import ScriptedOrchestrator, run_episode
from workers.trajectories import Trajectory


def _env(index: SearchIndex, **params: Any) -> SwarmEnv:
    env = make_env("swarm", index_uri="memory://swarm-test", **{"subagent_runner": "threads", **params})
    assert isinstance(env, SwarmEnv)
    env.bind_index(index)
    return env


def _create(name: str = "finder", prompt: str = "You find things.") -> str:
    return format_tool_call(CREATE_TOOL, {"name": name, "system_prompt": prompt})


def _assign(agent: str, prompt: str) -> str:
    return format_tool_call(ASSIGN_TOOL, {"agent": agent, "prompt": prompt})


@pytest.fixture
def policy() -> Iterator[dict[str, Any]]:
    """Register test policies under checkpoint names; removed afterwards."""
    added: dict[str, Any] = {}

    def register(name: str, act: Any) -> None:
        class _Policy:
            tokens = 0

            def __init__(self, job: subagents.SubagentJob) -> None:
                self.job = job

            def act(self, messages: Sequence[Message]) -> str:
                return str(act(self.job, messages))

        subagents.POLICIES[name] = _Policy
        added[name] = _Policy

    yield {"register": register}
    for name in added:
        subagents.POLICIES.pop(name, None)


def test_the_scripted_swarm_solves_a_wide_task_with_fewer_critical_steps_than_one_agent(
    swarm_index: SearchIndex, wide_task: dict[str, Any]
) -> None:
    swarm = run_episode(_env(swarm_index), ScriptedOrchestrator("swarm"), wide_task)
    single = run_episode(_env(swarm_index), ScriptedOrchestrator("single"), wide_task)

    on_swarm, on_single = swarm_episode_metrics(swarm), swarm_episode_metrics(single)
    assert on_swarm["item_f1"] == 1.0 and on_single["item_f1"] == 1.0
    # stage 1: create + 4 assigns in parallel (1 + the slowest sub-agent's 2 steps); stage 2: the table
    assert swarm["swarm"]["stages"][0]["subagent_steps"] == [2, 2, 2, 2]
    assert on_swarm["critical_steps"] == (1 + 2) + 1
    assert on_swarm["total_steps"] == 2 + 4 * 2
    assert on_single["critical_steps"] == 4 + 1 and on_single["subagents"] == 0
    assert on_swarm["parallelism"] == 4 and on_swarm["finish_rate"] == 1.0
    # each sub-agent's conversation is stored with the trajectory, and the record validates
    first = swarm["swarm"]["subagents"][0]
    assert first["finished"] and first["turns"][-1]["role"] == "assistant" and "name:" in first["message"]
    assert Trajectory.model_validate(swarm).swarm is not None


def test_assign_task_calls_of_one_reply_run_at_the_same_time(swarm_index: SearchIndex, policy: dict[str, Any]) -> None:
    barrier = threading.Barrier(3, timeout=10)

    def together(job: subagents.SubagentJob, messages: Sequence[Message]) -> str:
        barrier.wait()  # raises BrokenBarrierError unless all three sub-agents are running at once
        return f"done: {job.prompt}"

    policy["register"]("together", together)
    env = _env(swarm_index, subagent_checkpoint="together")
    env.reset(env.validate_task_row({"id": "t", "prompt": "q", "gold_chunk_ids": ["lib:alpha#1"]}))
    result = env.step("\n".join([_create(), *(_assign("finder", f"task {i}") for i in range(3))]))

    assert result.observation is not None
    texts = [m["content"] for m in result.observation.messages]
    assert [t.splitlines()[1] for t in texts[1:4]] == ["done: task 0", "done: task 1", "done: task 2"]
    record = env.swarm_record()
    assert [s["finished"] for s in record["subagents"]] == [True, True, True]
    assert record["stages"][0]["cost"] == 1 + 1


def test_bad_orchestration_gets_clear_errors_and_is_counted(swarm_index: SearchIndex) -> None:
    env = _env(swarm_index, max_subagents=1, max_parallel=2)
    env.reset(env.validate_task_row({"id": "t", "prompt": "q", "gold_chunk_ids": ["lib:alpha#1"]}))
    reply = "\n".join(
        [
            _assign("ghost", "find `alpha.open`"),  # before any agent exists
            _create(),
            _create(),  # duplicate name
            _create("second"),  # over max_subagents
            _assign("finder", "  "),  # blank task
            '<tool_call>{"name": "assign_task", "arguments": {"agent": "finder"}}</tool_call>',  # no prompt
        ]
    )
    result = env.step(reply)
    assert result.observation is not None
    texts = [m["content"] for m in result.observation.messages]
    # creates run before the reply's assigns, so only 'ghost' is unknown
    assert "unknown sub-agent 'ghost'; create it first with create_subagent (agents: finder)" in texts[0]
    assert "already exists" in texts[2] and "at most 1 sub-agents" in texts[3] and "blank" in texts[4]
    assert "error" in texts[5] and "prompt" in texts[5]
    env.step("\n".join(_assign("finder", f"find `alpha.open` {i}") for i in range(3)))  # over max_parallel
    env.step("\n".join([_assign("finder", "find `alpha.open` 0")]))  # repeats an earlier task
    env.step("done")
    record = env.trajectory()
    errors = record["swarm"]["errors"]
    assert (errors["unknown_agent"], errors["duplicate_agent"], errors["over_cap"], errors["empty_task"]) == (
        1,
        1,
        2,
        1,
    )
    assert errors["duplicate_tasks"] == 1
    assert record["counts"]["malformed_tool_calls"] == 1
    assert swarm_episode_metrics(record)["orchestration_errors"] == 5


def test_a_hanging_sub_agent_is_cut_at_its_limit_and_reported(swarm_index: SearchIndex, policy: dict[str, Any]) -> None:
    release = threading.Event()

    def hang(job: subagents.SubagentJob, messages: Sequence[Message]) -> str:
        release.wait(30)
        return "too late"

    policy["register"]("hang", hang)
    env = _env(swarm_index, subagent_checkpoint="hang", subagent_timeout_s=0.2)
    env.reset(env.validate_task_row({"id": "t", "prompt": "q", "gold_chunk_ids": ["lib:alpha#1"]}))
    started = time.perf_counter()
    result = env.step(_create() + _assign("finder", "wait"))
    release.set()
    assert time.perf_counter() - started < 20
    assert result.observation is not None
    assert "cut at its time limit of 0.2s" in result.observation.messages[-1]["content"]
    record = env.swarm_record()
    assert record["errors"]["timeouts"] == 1 and record["subagents"][0]["cut"] is True
    assert record["subagents"][0]["finished"] is False


def test_failing_and_step_limited_sub_agents_count_as_unfinished(
    swarm_index: SearchIndex, policy: dict[str, Any]
) -> None:
    def crash(job: subagents.SubagentJob, messages: Sequence[Message]) -> str:
        raise RuntimeError("model server went away")

    def search_forever(job: subagents.SubagentJob, messages: Sequence[Message]) -> str:
        return format_tool_call("search_corpus", {"query": f"alpha {len(messages)}"})

    policy["register"]("crash", crash)
    policy["register"]("forever", search_forever)
    for checkpoint, expected in (("crash", "model server went away"), ("forever", "ran out of its 3 steps")):
        env = _env(swarm_index, subagent_checkpoint=checkpoint, subagent_max_steps=3)
        env.reset(env.validate_task_row({"id": "t", "prompt": "q", "gold_chunk_ids": ["lib:alpha#1"]}))
        result = env.step(_create() + _assign("finder", "look"))
        assert result.observation is not None and expected in result.observation.messages[-1]["content"]
        env.step("answer")
        record = env.trajectory()
        assert swarm_episode_metrics(record)["finish_rate"] == 0.0
        r_finish = score_trajectory(parl_spec(), Trajectory.model_validate(record)).terms["subagent_finish"]
        assert r_finish == 0.0


def test_the_critical_step_cap_ends_the_episode(swarm_index: SearchIndex) -> None:
    env = _env(swarm_index, max_critical_steps=2)
    env.reset(env.validate_task_row({"id": "t", "prompt": "q", "gold_chunk_ids": ["lib:alpha#1"]}))
    assert not env.step(format_tool_call("search_corpus", {"query": "alpha"})).done
    assert not env.step(format_tool_call("search_corpus", {"query": "beta"})).done
    result = env.step(format_tool_call("search_corpus", {"query": "gamma"}))
    assert result.done and env.trajectory()["error"] == "over the critical step limit of 2"


def test_step_limits_come_from_presets_unless_given(swarm_index: SearchIndex) -> None:
    env = _env(swarm_index, step_preset="browsecomp")
    assert (env.max_turns, env.subagent_max_steps) == (15, 100)
    env = _env(swarm_index, step_preset="widesearch", subagent_max_steps=7)
    assert (env.max_turns, env.subagent_max_steps) == (100, 7)
    with pytest.raises(ValueError, match="step_preset must be one of browsecomp, widesearch, in_house"):
        _env(swarm_index, step_preset="fast")
    with pytest.raises(ValueError, match="subagent_runner must be one of"):
        _env(swarm_index, subagent_runner="gpu")


def test_a_task_row_with_a_malformed_table_is_refused_naming_the_field() -> None:
    from workers.envs.base import TaskFieldError

    with pytest.raises(TaskFieldError, match="field 'table'.*key_columns"):
        SwarmEnv.validate_task_row(
            {
                "id": "t",
                "prompt": "q",
                "gold_chunk_ids": ["c"],
                "table": {"columns": ["a"], "key_columns": ["b"], "rows": [{"a": "1"}]},
            },
            index=3,
        )


def test_a_deep_task_is_scored_by_its_answer(swarm_index: SearchIndex) -> None:
    row = {
        "id": "deep",
        "prompt": "Which function merges two sorted lists?",
        "answer": "beta.merge",
        "gold_chunk_ids": ["lib:beta#1"],
        "answer_chunk_ids": ["lib:beta#1"],
    }
    record = run_episode(_env(swarm_index), ScriptedOrchestrator("swarm"), row)
    assert record["task_kind"] == "deep" and record["swarm"]["subagents"]
    metrics = swarm_episode_metrics(record)
    assert metrics["task_score"] == metrics["final_answer_found"]


def test_a_small_sub_agent_budget_still_runs_and_serial_runs_one_at_a_time(swarm_index: SearchIndex) -> None:
    env = _env(swarm_index, subagent_token_budget=2048, subagent_runner="serial")
    env.reset(env.validate_task_row({"id": "t", "prompt": "q", "gold_chunk_ids": ["lib:alpha#1"]}))
    env.step(_create() + _assign("finder", "Find `alpha.open` and report: document."))
    [sub] = env.swarm_record()["subagents"]
    assert sub["finished"] and "document: lib:alpha" in sub["message"]
