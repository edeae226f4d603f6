"""A swarm episode through the trainer's rollout worker and learner: sub-agent messages are observations (loss
mask 0), the PARL terms anneal with the training step, and Kimi's loss trains on the orchestrator's tokens only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.workers.jobs.test_flags_in_jobs import ScriptedBackend
from workers.envs.toolcalls import format_tool_call
from workers.models.registry import TINY_LLAMA, resolve_base_model
from workers.rewards.schema import parl_spec
from workers.rl.config import TrainConfig
from workers.rl.learner import Learner
from workers.rl.rollout import RolloutWorker
from workers.search.index import SearchIndex
from workers.search.index_store import save_index
from workers.swarm.environment import ASSIGN_TOOL, CREATE_TOOL


def test_a_swarm_rollout_anneals_parl_and_trains_with_kimis_loss(
    swarm_index: SearchIndex, wide_task: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRUCIBLE_INDEX_CACHE", str(tmp_path / "cache"))
    uri = f"file://{tmp_path}/index"
    save_index(swarm_index, uri)
    names = [row["name"] for row in wide_task["table"]["rows"]]
    fan_out = "\n".join(
        [
            format_tool_call(CREATE_TOOL, {"name": "lookup", "system_prompt": "Look one item up."}),
            *(
                format_tool_call(ASSIGN_TOOL, {"agent": "lookup", "prompt": f"Find `{n}` and report: document."})
                for n in names
            ),
        ]
    )
    reward = parl_spec(lambda_parallel=0.4, lambda_finish=0.2, anneal_steps=4).model_dump(mode="json")

    def rollout(step: int) -> Any:
        worker = RolloutWorker(
            ScriptedBackend([fan_out, "| name |\n|---|\n" + "\n".join(f"| {n} |" for n in names)]),  # type: ignore[arg-type]
            environment="swarm",
            env_params={"index_uri": uri, "subagent_runner": "threads", "max_turns": 4},
            reward=reward,
            max_new_tokens=512,
        )
        return worker.rollout([wide_task], group_size=2, seed=0, step=step).samples

    early, late = rollout(0), rollout(2)
    sample = early[0]
    assert sample.trajectory["swarm"]["critical_steps"] == (1 + 2) + 1
    assert sample.terms["parallel_instantiation"] == 1.0 and sample.terms["subagent_finish"] == 1.0
    # a name-only table lacks the task's other columns: 0 (WideSearch's required-columns rule), not 1/|C| per row
    assert sample.terms["item_f1"] == 0.0
    assert sample.reward == pytest.approx(sample.terms["item_f1"] + 0.4 + 0.2)
    assert late[0].reward == pytest.approx(sample.terms["item_f1"] + (0.4 + 0.2) * 0.5)  # step 2 of 4: halfway
    assert sample.episode_metrics["parallelism"] == len(names)
    # the sub-agents' messages sit between the orchestrator's two replies with loss mask 0
    runs = [m for i, m in enumerate(sample.loss_mask) if i == 0 or m != sample.loss_mask[i - 1]]
    assert runs == [1, 0, 1]
    first = sample.loss_mask.index(0)
    observation = sample.token_ids[sample.completion_start + first : sample.completion_start + first + 400]
    assert "[sub-agent lookup" in ScriptedBackend([]).tokenizer.decode(observation)

    config = TrainConfig(base_model=TINY_LLAMA, algorithm="kimi", prompts_per_step=1, group_size=2)
    learner = Learner(resolve_base_model(TINY_LLAMA), config)
    early[1].reward = 0.0  # a group with signal
    metrics = learner.train_step(early)
    assert metrics["loss"] == metrics["loss"] and learner.version == 1  # finite, one optimizer step taken


def test_the_scripted_swarm_teacher_gives_sft_samples_of_the_orchestrators_replies_only(
    swarm_index: SearchIndex, wide_task: dict[str, Any]
) -> None:
    from workers.models.base import encode_chat
    from workers.rl.teacher import teacher_rollout, the_same_agent
    from workers.swarm.scripted import ScriptedOrchestrator

    tokenizer = ScriptedBackend([]).tokenizer
    teacher = ScriptedOrchestrator()
    samples = teacher_rollout(
        the_same_agent(teacher),
        tokenizer,
        lambda messages: encode_chat(tokenizer, messages),
        [wide_task, wide_task],  # one instance plays both episodes: it starts over on a new conversation
        environment="swarm",
        env_params={"index_uri": "memory://teacher", "subagent_runner": "threads"},
        reward=parl_spec().model_dump(mode="json"),
        bind=lambda env: env.bind_index(swarm_index),
    )
    assert [s.terms["item_f1"] for s in samples] == [1.0, 1.0]
    for sample in samples:
        trained = tokenizer.decode(
            [t for t, m in zip(sample.token_ids[sample.completion_start :], sample.loss_mask, strict=True) if m]
        )
        assert "create_subagent" in trained and "| name |" in trained
        assert "[sub-agent lookup" not in trained  # the sub-agents' messages are context, not targets
