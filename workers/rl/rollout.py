"""Rollouts: run groups of episodes of an environment with the policy and score them with the run's reward.

Token in, token out: a sample's `token_ids` are exactly the prompt tokens, the tokens the policy sampled and the
environment's observation tokens between turns, in order. `loss_mask` marks the sampled ones (the only tokens the
learner trains on) and `old_logprobs` holds their log-probabilities under the policy that sampled them.

An environment that rewrites earlier messages (the search environment's `prune_chunks`) cannot be appended to:
the worker then closes the current token sequence as a segment and re-encodes the rewritten conversation as the
next segment's prompt. A sample is one or more segments; the learner scores each segment in its own context and
trains on their completion tokens as one sequence, so the loss is the same as for an unsegmented episode.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workers.detectors.registry import DetectorConfig, default_detector_config, run_detectors
from workers.envs.base import Environment, Message
from workers.envs.registry import make_env
from workers.findings import Finding
from workers.models.base import PolicyBackend, SamplingParams
from workers.rewards.schema import RewardSpec, validate_reward_spec, with_f_beta
from workers.rewards.score import judgements_of, score_trajectory
from workers.rl.token_view import token_view
from workers.trajectories import Trajectory


@dataclass
class Sample:
    """One scored episode. `token_ids`/`completion_start` are its last segment and `prior_segments` the earlier
    ones (empty unless the environment rewrote its context); `loss_mask` and `old_logprobs` cover the segments'
    completion regions (`ids[start:]` of each), concatenated in order. `findings` are the trajectory detectors'
    flags on the episode (workers.detectors), at most one per detector."""

    task_id: str
    group: int
    token_ids: list[int]
    completion_start: int
    loss_mask: list[int]
    old_logprobs: list[float]
    reward: float
    terms: dict[str, float]
    policy_version: int
    num_turns: int
    malformed_tool_calls: int
    finish_reason: str
    error: str | None
    trajectory: dict[str, Any] = field(repr=False)
    prior_segments: list[tuple[list[int], int]] = field(default_factory=list, repr=False)
    episode_metrics: dict[str, float] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    # Token provenance: True when the ids the learner would train on (the loss-masked ones) are not exactly the
    # ids the engine returned, turn after turn (text re-encoded somewhere). The learner counts and skips these.
    provenance_mismatch: bool = False
    # The policy version that produced each token, aligned with `loss_mask` (only the sampled ones mean anything):
    # with partial rollouts an engine takes new weights between turns, so one episode's tokens can come from
    # several versions. Empty: every token is `policy_version`'s. `policy_version` is the oldest sampled token's.
    token_versions: list[int] = field(default_factory=list, repr=False)
    engine: int = 0  # the rollout engine (actor index) that sampled it: the mismatch is also measured per engine

    @property
    def sampled_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def segments(self) -> list[tuple[list[int], int]]:
        """(token ids, completion start) of every segment, in order."""
        return [*self.prior_segments, (self.token_ids, self.completion_start)]

    @property
    def total_tokens(self) -> int:
        return sum(len(ids) for ids, _ in self.segments)


@dataclass
class RolloutResult:
    """`policy_version` is the version the rollout started with (its oldest tokens'), `newest_version` the one its
    last turn sampled with (the same unless weights arrived between turns); `weight_apply_seconds` the time spent
    loading such weights inside the rollout (included in `generation_seconds`)."""

    samples: list[Sample]
    generation_seconds: float
    sampled_tokens: int
    policy_version: int
    newest_version: int
    weight_apply_seconds: float = 0.0


@dataclass
class _Episode:
    env: Environment
    group: int
    token_ids: list[int]
    completion_start: int
    loss_mask: list[int] = field(default_factory=list)
    old_logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "stop"
    prior_segments: list[tuple[list[int], int]] = field(default_factory=list)
    sampled_ids: list[int] = field(default_factory=list)  # what the engine returned, every turn, in order
    token_versions: list[int] = field(default_factory=list)  # aligned with loss_mask


def trained_ids(
    prior_segments: Sequence[tuple[list[int], int]], token_ids: list[int], completion_start: int, loss_mask: list[int]
) -> list[int]:
    """The token ids a sample's loss covers, in order: each segment's completion region (`ids[start:]`), those
    whose loss mask is 1. Token provenance compares them with the ids the engine returned."""
    region = [t for ids, start in [*prior_segments, (token_ids, completion_start)] for t in ids[start:]]
    return [t for t, m in zip(region, loss_mask, strict=False) if m]


def chatml_continuation(tokenizer: Any, messages: Sequence[Message], *, closed: bool) -> list[int]:
    """Token ids that follow a sampled assistant turn: close it (unless the policy already sampled its
    end-of-turn token), the observation messages, then the next assistant header. ChatML, as SmolLM2 and Qwen use:
    `<|im_start|>role\\ncontent<|im_end|>\\n`."""
    text = ("\n" if closed else "<|im_end|>\n") + "".join(
        f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages
    )
    ids: list[int] = tokenizer.encode(text + "<|im_start|>assistant\n", add_special_tokens=False)
    return ids


class RolloutWorker:
    """Generates and scores episodes with one policy backend. Plain Python: the trainer wraps it in a Ray actor."""

    def __init__(
        self,
        backend: PolicyBackend,
        *,
        environment: str,
        env_params: Mapping[str, Any],
        reward: Mapping[str, Any] | RewardSpec,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 64,
        max_context_tokens: int = 2048,
        detectors: DetectorConfig | Mapping[str, Any] | None = None,
    ) -> None:
        self.backend = backend
        self.environment = environment
        self.env_params = dict(env_params)
        self.reward = reward if isinstance(reward, RewardSpec) else validate_reward_spec(dict(reward))
        self.temperature, self.top_p, self.max_new_tokens = temperature, top_p, max_new_tokens
        self.max_context_tokens = max_context_tokens
        # Every scored episode goes through the enabled trajectory detectors (None: all, with their defaults).
        if not isinstance(detectors, DetectorConfig):
            detectors = default_detector_config() if detectors is None else DetectorConfig.model_validate(detectors)
        self.detectors = detectors
        make_env(environment, **self.env_params)  # fail now, not mid-run, on a bad name or parameter

    def rollout(
        self,
        task_rows: Sequence[Mapping[str, Any]],
        *,
        group_size: int,
        seed: int,
        id_prefix: str = "",
        f_beta: float | None = None,
        step: int | None = None,
        between_turns: Callable[[], float] | None = None,
    ) -> RolloutResult:
        """`group_size` episodes per task row, all turns batched across every live episode. Trajectory ids are
        `<id_prefix><task id>-<index>`: give each call a distinct prefix (the trainer uses step and worker).
        `f_beta`, when given, replaces the beta of the reward's f_beta terms (the X3 schedule); `step`, the training
        step (0-based), scales the weights of annealed terms (PARL's λ1, λ2). `between_turns`, when given, is
        called before every turn's generation and may load new weights into the backend (partial rollouts); it
        returns the seconds it spent. Each sampled token records the backend's `policy_version` at its turn."""
        # One function on purpose: the multi-turn loop: every live episode's state advances together, turn by turn.
        reward = self.reward if f_beta is None else with_f_beta(self.reward, f_beta)
        started = time.perf_counter()
        applied = 0.0
        version = self.backend.policy_version
        tokenizer = self.backend.tokenizer
        episodes: list[_Episode] = []
        for group, row in enumerate(task_rows):
            for _ in range(group_size):
                env = make_env(self.environment, **self.env_params)
                bind = getattr(env, "bind_token_counter", None)
                if bind is not None:
                    bind(self._count_tokens)
                task = env.validate_task_row(dict(row))
                prompt = self.backend.encode_chat(env.reset(task))
                episodes.append(_Episode(env=env, group=group, token_ids=prompt, completion_start=len(prompt)))
        live = list(episodes)
        turn = 0
        while live:
            if between_turns is not None:
                applied += between_turns()
            now = self.backend.policy_version
            params = SamplingParams(
                temperature=self.temperature,
                top_p=self.top_p,
                max_new_tokens=self.max_new_tokens,
                seed=seed * 1000 + turn,
            )
            generations = self.backend.generate([e.token_ids for e in live], params)
            still: list[_Episode] = []
            for episode, generation in zip(live, generations, strict=True):
                episode.token_ids += generation.token_ids
                episode.sampled_ids += generation.token_ids
                episode.loss_mask += [1] * len(generation.token_ids)
                episode.old_logprobs += generation.logprobs
                episode.token_versions += [now] * len(generation.token_ids)
                episode.finish_reason = generation.finish_reason
                result = episode.env.step(generation.text)
                if result.done:
                    continue
                limit = self._context_limit(episode.env)
                if getattr(episode.env, "view_changed", False):
                    # The environment rewrote earlier messages: close this segment after the sampled reply and
                    # start the next from the rewritten conversation.
                    prompt = self.backend.encode_chat(episode.env.messages)
                    if len(prompt) + self.max_new_tokens > limit:
                        episode.env.abort(f"context over {limit} tokens")
                        continue
                    episode.prior_segments.append((episode.token_ids, episode.completion_start))
                    episode.token_ids, episode.completion_start = list(prompt), len(prompt)
                    still.append(episode)
                    continue
                observation = result.observation.messages if result.observation else []
                more = chatml_continuation(tokenizer, observation, closed=generation.finish_reason == "stop")
                if len(episode.token_ids) + len(more) + self.max_new_tokens > limit:
                    episode.env.abort(f"context over {limit} tokens")
                    continue
                episode.token_ids += more
                episode.loss_mask += [0] * len(more)
                episode.old_logprobs += [0.0] * len(more)
                episode.token_versions += [now] * len(more)
                still.append(episode)
            live = still
            turn += 1
        samples = [
            self._score(e, f"{id_prefix}{e.env.task.id}-{i}", version, reward, step) for i, e in enumerate(episodes)
        ]
        return RolloutResult(
            samples=samples,
            generation_seconds=time.perf_counter() - started,
            sampled_tokens=sum(s.sampled_tokens for s in samples),
            policy_version=version,
            newest_version=self.backend.policy_version,
            weight_apply_seconds=applied,
        )

    def _count_tokens(self, text: str) -> int:
        return len(self.backend.tokenizer.encode(text, add_special_tokens=False))

    def _context_limit(self, env: Environment) -> int:
        """The worker's context limit, raised to the environment's own budget (plus a reply) when it has one."""
        budget = getattr(env, "context_limit", None)
        return max(self.max_context_tokens, int(budget) + self.max_new_tokens) if budget else self.max_context_tokens

    def _score(
        self, episode: _Episode, trajectory_id: str, version: int, reward: RewardSpec, step: int | None = None
    ) -> Sample:
        record = episode.env.trajectory(trajectory_id)
        parsed = Trajectory.model_validate(record)
        result = score_trajectory(reward, parsed, step=step)
        judged = judgements_of(reward, parsed)
        if judged:
            record["judgements"] = judged  # the evidence, and what the trajectory page re-scores with
        counts = record.get("counts", {})
        segments = [*episode.prior_segments, (episode.token_ids, episode.completion_start)]
        record["tokens"] = token_view(
            self.backend.tokenizer, segments, episode.loss_mask, episode.old_logprobs, episode.token_versions
        )
        sampled_versions = [v for v, m in zip(episode.token_versions, episode.loss_mask, strict=True) if m]
        return Sample(
            task_id=str(episode.env.task.id),
            group=episode.group,
            token_ids=episode.token_ids,
            completion_start=episode.completion_start,
            loss_mask=episode.loss_mask,
            old_logprobs=episode.old_logprobs,
            reward=float(result.reward),
            terms={k: float(v) for k, v in result.terms.items()},
            policy_version=min(sampled_versions, default=version),
            token_versions=episode.token_versions,
            num_turns=int(counts.get("turns", 0)),
            malformed_tool_calls=int(counts.get("malformed_tool_calls", 0)),
            finish_reason=episode.finish_reason,
            error=record.get("error"),
            trajectory=record,
            provenance_mismatch=trained_ids(
                episode.prior_segments, episode.token_ids, episode.completion_start, episode.loss_mask
            )
            != episode.sampled_ids,
            prior_segments=episode.prior_segments,
            episode_metrics=episode.env.episode_metrics(record),
            findings=run_detectors(record, self.detectors),
        )
