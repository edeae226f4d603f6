"""A scripted teacher's episodes as SFT samples: one loop for every teacher written as code (the search agent, the
coding agent, the swarm orchestrator), so each domain writes only its agent.

The samples are laid out exactly as a rollout of the student would be, in the student's tokenizer: the agent's
replies (each closed with `<|im_end|>`) are the trained tokens, the rest is context; when the environment rewrites
its conversation (a prune, a self-summary: `view_changed`), the segment so far is kept and the next one starts from
the rewritten conversation, as the rollout worker does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from workers.envs.base import Environment, Message
from workers.envs.registry import make_env
from workers.rewards.schema import RewardSpec, validate_reward_spec
from workers.rewards.score import score_trajectory
from workers.rl.rollout import Sample, chatml_continuation
from workers.trajectories import Trajectory


class ScriptedAgent(Protocol):
    """A teacher written as code: the next reply for a conversation (a new conversation starts a new episode)."""

    def reply(self, messages: Sequence[Message]) -> str: ...


AgentFor = Callable[[Mapping[str, Any], Environment], ScriptedAgent | None]
"""The teacher for one task row in its environment (already reset), or None to skip the row."""


def the_same_agent(agent: ScriptedAgent) -> AgentFor:
    """One agent instance for every row (an agent that starts over on a new conversation)."""
    return lambda row, env: agent


def teacher_rollout(
    agent_for: AgentFor,
    tokenizer: Any,
    encode_chat: Callable[[Sequence[Message]], list[int]],
    task_rows: Sequence[Mapping[str, Any]],
    *,
    environment: str,
    env_params: Mapping[str, Any],
    reward: Mapping[str, Any] | RewardSpec,
    bind: Callable[[Environment], None] | None = None,
) -> list[Sample]:
    """One episode of the teacher per task row, scored by `reward`, as token-level samples. `bind(env)` may prepare
    each environment (e.g. give it an index in memory)."""
    spec = reward if isinstance(reward, RewardSpec) else validate_reward_spec(dict(reward))
    samples: list[Sample] = []
    for group, row in enumerate(task_rows):
        env = make_env(environment, **dict(env_params))
        if bind is not None:
            bind(env)
        counter = getattr(env, "bind_token_counter", None)
        if counter is not None:
            counter(lambda text: len(tokenizer.encode(text, add_special_tokens=False)))
        env.reset(env.validate_task_row(dict(row)))
        agent = agent_for(row, env)
        if agent is None:
            continue
        samples.append(_episode(agent, env, tokenizer, encode_chat, spec, group))
    return samples


def _episode(
    agent: ScriptedAgent,
    env: Environment,
    tokenizer: Any,
    encode_chat: Callable[[Sequence[Message]], list[int]],
    spec: RewardSpec,
    group: int,
) -> Sample:
    ids: list[int] = list(encode_chat(env.messages))
    start = len(ids)
    mask: list[int] = []
    prior: list[tuple[list[int], int]] = []
    while True:
        text = agent.reply(env.messages)
        reply = tokenizer.encode(text + "<|im_end|>", add_special_tokens=False)
        ids += reply
        mask += [1] * len(reply)
        result = env.step(text)
        if result.done:
            break
        if getattr(env, "view_changed", False):
            prior.append((ids, start))
            ids = list(encode_chat(env.messages))
            start = len(ids)
            continue
        more = chatml_continuation(tokenizer, result.observation.messages if result.observation else [], closed=True)
        ids += more
        mask += [0] * len(more)
    record = env.trajectory(f"teacher-{env.task.id}")
    scored = score_trajectory(spec, Trajectory.model_validate(record))
    counts = record.get("counts", {})
    return Sample(
        task_id=env.task.id,
        group=group,
        token_ids=ids,
        completion_start=start,
        loss_mask=mask,
        old_logprobs=[0.0] * len(mask),
        reward=float(scored.reward),
        terms=dict(scored.terms),
        policy_version=0,
        num_turns=int(counts.get("turns", 0)),
        malformed_tool_calls=int(counts.get("malformed_tool_calls", 0)),
        finish_reason="stop",
        error=record.get("error"),
        trajectory=record,
        prior_segments=prior,
        episode_metrics=env.episode_metrics(record),
    )
