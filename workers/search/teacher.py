"""A search agent written as code, the teacher for the SFT warm-up when no larger model is at hand.

Context-1 warmed its policy up on trajectories of a large model (Kimi K2.5) running the same harness. A 135M model
on a CPU has no such teacher, and it does not call tools by itself, so RL from it sees reward 0 everywhere. This
agent plays the large model's part: it runs the real environment (the same tools, budget and output format) and
its trajectories go through the same rejection filter before the student is fine-tuned on them.

Its policy: search once for each quoted passage of the question (or the whole question when it quotes nothing),
then answer with the first passage of each search as `<Document>` items.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from workers.envs.base import Environment, Message
from workers.envs.registry import make_env
from workers.envs.toolcalls import format_tool_call
from workers.rewards.schema import RewardSpec, validate_reward_spec
from workers.rewards.score import score_trajectory
from workers.rl.rollout import Sample, chatml_continuation
from workers.trajectories import Trajectory

SCRIPTED_TEACHER = "scripted-search"
_QUOTED = re.compile(r"[“\"]([^”\"]{12,})[”\"]")
_LABEL = re.compile(r"\[chunk (\S+) \|")
MAX_QUERY_WORDS = 32


class ScriptedAgent(Protocol):
    """A teacher written as code: the next reply for a conversation (a new conversation starts a new episode)."""

    def reply(self, messages: Sequence[Message]) -> str: ...


class ScriptedSearchAgent:
    name = SCRIPTED_TEACHER

    def reply(self, messages: Sequence[Message]) -> str:
        question = next((m["content"] for m in messages if m["role"] == "user"), "")
        tool_messages = [m["content"] for m in messages if m["role"] == "tool"]
        if not tool_messages:
            quotes = _QUOTED.findall(question) or [question]
            calls = [
                format_tool_call("search_corpus", {"query": " ".join(q.split()[:MAX_QUERY_WORDS])}) for q in quotes[:3]
            ]
            return "\n".join(calls)
        picked: list[str] = []
        for content in tool_messages:
            labels = _LABEL.findall(content)
            if labels and labels[0] not in picked:
                picked.append(labels[0])
        items = "".join(
            f"<Document id={chunk_id}><Justification>matches a passage the question quotes</Justification></Document>"
            for chunk_id in picked
        )
        return items or "I found no passage."


def scripted_rollout(
    agent: ScriptedAgent,
    tokenizer: Any,
    encode_chat: Any,
    task_rows: Sequence[Mapping[str, Any]],
    *,
    environment: str,
    env_params: Mapping[str, Any],
    reward: Mapping[str, Any] | RewardSpec,
    bind: Any = None,
) -> list[Sample]:
    """One episode of `agent` per task, as token-level samples in the student's tokenizer: the agent's replies
    are the trained tokens (each closed with `<|im_end|>`), the rest is context, exactly as a rollout of the
    student would lay them out. `bind(env)` may prepare each environment (e.g. give it an index in memory)."""
    spec = reward if isinstance(reward, RewardSpec) else validate_reward_spec(dict(reward))
    samples: list[Sample] = []
    for group, row in enumerate(task_rows):
        env: Environment = make_env(environment, **dict(env_params))
        if bind is not None:
            bind(env)
        counter = getattr(env, "bind_token_counter", None)
        if counter is not None:
            counter(lambda text: len(tokenizer.encode(text, add_special_tokens=False)))
        env.reset(env.validate_task_row(dict(row)))
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
            more = chatml_continuation(
                tokenizer, result.observation.messages if result.observation else [], closed=True
            )
            ids += more
            mask += [0] * len(more)
        record = env.trajectory(f"teacher-{env.task.id}")
        scored = score_trajectory(spec, Trajectory.model_validate(record))
        counts = record.get("counts", {})
        samples.append(
            Sample(
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
        )
    return samples
