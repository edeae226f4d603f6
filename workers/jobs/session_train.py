"""The real-time RL update (`python -m workers.jobs.session_train`, kind `sessiontrain`): one epoch over the
sessions a cycle collected, from the deployed checkpoint (docs/methods.md section 2, "Real-time RL").

1. Read the `session/v1` rows (a malformed row fails the job naming its line and field) and turn each served turn
   into a sample exactly as it was served, rewarded by the session reward and given an advantage by the
   spec's baseline (`workers.realtime.samples.session_samples`); sessions the reward drops are left out. With no
   trainable turn the job fails: a cycle never trains on nothing.
2. Build the learner on the base model and load the deployed checkpoint: the model's structure (LoRA or full
   parameters) is the checkpoint's, the optimiser settings (learning rate, weight decay, clipping, the loss) the
   spec's. The recorded log-probabilities are the behaviour policy of the importance ratio, so the turns served
   by an older version are corrected like any off-policy sample.
3. Single epoch: the turns in a seeded shuffle, `config.prompts_per_step x config.group_size` per optimizer step
   (the number of sequences an offline step trains on), the advantages computed once over the whole batch. Each
   step's metrics and the progress go to the run.
4. Write one checkpoint (`<output_prefix>/checkpoints/step-<steps>.pt`, with its checksum), report it, and a
   summary: sessions, used, dropped, turns, tokens, the on-policy share, the reward mean and the baseline.
"""

from __future__ import annotations

import io
import logging
import random
import time
from typing import Any

from workers.jobs.common import load_spec, reporter_for
from workers.jobs.preflight import preflight_models
from workers.models.registry import resolve_base_model
from workers.realtime.samples import SessionRowError, parse_sessions_jsonl, session_samples
from workers.reporting import configure_logging
from workers.rewards.schema import RewardSpec, RewardSpecError, spec_hash, validate_reward_spec
from workers.rewards.score import histogram
from workers.rewards.term_feedback import SessionFeedbackTerm
from workers.rl.algorithms import CONSTANT_NORMALISER
from workers.rl.config import TrainConfig
from workers.rl.learner import Learner
from workers.rl.rollout import Sample
from workers.specs import SessionTrainSpec
from workers.storage import read_bytes, write_checkpoint

log = logging.getLogger("crucible.session_train")


def session_reward(data: dict[str, Any]) -> RewardSpec:
    """The spec's reward, which must hold a session_feedback term; SystemExit naming the problem otherwise."""
    try:
        spec = validate_reward_spec(data)
    except RewardSpecError as exc:
        raise SystemExit(f"reward: {exc}") from None
    if not any(isinstance(term, SessionFeedbackTerm) for term in spec.terms):
        raise SystemExit(
            "reward: a session reward needs a session_feedback term (the users' signals); add "
            '{"type": "session_feedback"} to its terms'
        )
    return spec


def training_config(spec: SessionTrainSpec, checkpoint: dict[str, Any] | None) -> TrainConfig:
    """The learner's config: the spec's, on the spec's base model, with the checkpoint's model structure (its LoRA
    adapters, or none) when one is loaded."""
    update: dict[str, Any] = {"base_model": spec.base_model}
    if checkpoint is not None:
        update["lora"] = TrainConfig.model_validate(checkpoint["config"]).lora
    return spec.config.model_copy(update=update)


def batches(
    samples: list[Sample], advantages: list[float], size: int, seed: int
) -> list[tuple[list[Sample], list[float]]]:
    """The epoch's optimizer steps: every sample once, in a shuffle seeded by `seed`, `size` per step (the last
    step takes the rest)."""
    order = list(range(len(samples)))
    random.Random(seed).shuffle(order)
    return [
        ([samples[i] for i in order[at : at + size]], [advantages[i] for i in order[at : at + size]])
        for at in range(0, len(order), size)
    ]


def _check_fits(samples: list[Sample], learner: Any) -> None:
    """Refuse turns the model cannot score: token ids beyond its vocabulary, or (Dr. GRPO, Composer) a completion
    longer than the constant normaliser."""

    vocab = int(learner.model.get_input_embeddings().num_embeddings)
    for sample in samples:
        top = max(sample.token_ids)
        if top >= vocab or min(sample.token_ids) < 0:
            raise SystemExit(
                f"session {sample.trajectory['session_id']!r} turn {sample.trajectory['turn_index']}: token id {top} "
                f"is outside the model's vocabulary of {vocab}: the sessions were served by another model"
            )
    loss = learner.loss_config
    if loss.algorithm in CONSTANT_NORMALISER and loss.max_completion_length is not None:
        longest = max(s.sampled_tokens for s in samples)
        if longest > loss.max_completion_length:
            raise SystemExit(
                f"a served completion has {longest} tokens, more than {loss.algorithm}'s constant normaliser "
                f"max_completion_length={loss.max_completion_length} (config.sampling.max_new_tokens x the "
                "environment's max_turns): raise config.sampling.max_new_tokens, or train with grpo or dapo"
            )


def run(spec: SessionTrainSpec) -> dict[str, Any]:
    # One function on purpose: a job's wiring, read top to bottom (read the sessions, build the samples, one learner
    # step, checkpoint, report).
    import torch

    started = time.monotonic()
    opts = spec.storage_options
    config = spec.config
    reward = session_reward(spec.reward)
    with reporter_for(spec) as reporter:
        preflight_models(spec, reporter)  # the models it names are here, or the run fails now
        reporter.log(f"reading sessions from {spec.sessions_uri}")
        try:
            records = parse_sessions_jsonl(read_bytes(spec.sessions_uri, opts))
        except SessionRowError as exc:
            raise SystemExit(f"{spec.sessions_uri}: {exc}") from None
        policy_version = spec.policy_version
        if policy_version is None and spec.checkpoint_uri is None:
            policy_version = 0
        samples, advantages, stats = session_samples(
            records, reward, spec.baseline, policy_version=policy_version, max_samples=spec.max_samples
        )
        reporter.log(
            f"{stats.sessions} sessions: {stats.used} used, {stats.dropped} dropped by the reward; {stats.turns} turns "
            f"({stats.dropped_turns} without feedback, {stats.empty_turns} empty, {stats.cut_turns} beyond "
            f"max_samples), {stats.tokens} tokens; baseline {spec.baseline}"
        )
        if not samples:
            raise SystemExit(
                f"no trainable session among {stats.sessions}: {stats.dropped} dropped by the reward (no feedback "
                f"under no_feedback='drop'), {stats.empty_turns} turns with no completion token; a cycle never trains "
                "on nothing"
            )
        hist = histogram([s.reward for s in samples])
        reporter.histogram("reward", hist["edges"], hist["counts"])

        checkpoint: dict[str, Any] | None = None
        blob = b""
        if spec.checkpoint_uri:
            blob = read_bytes(spec.checkpoint_uri, opts)
            checkpoint = torch.load(io.BytesIO(blob), weights_only=False)
        train_config = training_config(spec, checkpoint)
        device = "cuda" if config.compute.gpus > 0 and torch.cuda.is_available() else "cpu"
        learner = Learner(
            str(resolve_base_model(spec.base_model)),
            train_config,
            threads=max(1, int(config.compute.cpus)),
            device=device,
            storage_options=opts,
        )
        if spec.checkpoint_uri:
            learner.load_checkpoint(blob)
            for group in learner.optimizer.param_groups:  # the spec's optimiser settings, not the checkpoint's
                group["lr"] = train_config.learning_rate
                group["weight_decay"] = train_config.weight_decay
            structure = f"LoRA rank {train_config.lora.rank}" if train_config.lora else "full parameters"
            reporter.log(
                f"from checkpoint {spec.checkpoint_uri} (policy version {learner.version}, {structure}); "
                f"{stats.on_policy_share if stats.on_policy_share is not None else 'unknown'} of the turns on-policy"
            )
        _check_fits(samples, learner)

        per_step = config.prompts_per_step * config.group_size
        steps = batches(samples, advantages, per_step, config.seed)
        reporter.log(f"{len(samples)} turns in {len(steps)} steps of at most {per_step}, {config.algorithm}")
        reporter.progress(0, len(steps))
        metrics: dict[str, float] = {}
        for step, (batch, batch_advantages) in enumerate(steps, start=1):
            metrics = learner.train_step(batch, batch_advantages)
            metrics["learner_version"] = float(learner.version)
            reporter.metric(step, metrics)
            reporter.progress(step, len(steps))
            reporter.log(
                f"step {step}/{len(steps)}: {len(batch)} turns, reward {metrics['reward_mean']:.3f}, "
                f"advantage |mean| {metrics['advantage_abs_mean']:.3f}, loss {metrics['loss']:.4f}, "
                f"ratio {metrics['ratio_mean']:.3f}"
            )

        checkpoint_blob = learner.checkpoint_bytes(data_position=len(samples))
        uri = f"{spec.output_prefix}/checkpoints/step-{len(steps):06d}.pt"
        write_checkpoint(uri, checkpoint_blob, opts)
        reporter.checkpoint(len(steps), uri, {"reward_mean": stats.reward_mean or 0.0, "loss": metrics["loss"]})
        reporter.log(f"checkpoint {uri} ({len(checkpoint_blob) / 1e6:.1f} MB)")
        summary: dict[str, Any] = {
            "sessions": stats.sessions,
            "used": stats.used,
            "dropped": stats.dropped,
            "turns": stats.turns,
            "dropped_turns": stats.dropped_turns,
            "empty_turns": stats.empty_turns,
            "cut_turns": stats.cut_turns,
            "tokens": stats.tokens,
            "completion_tokens": stats.completion_tokens,
            "on_policy_share": stats.on_policy_share,
            "reward_mean": stats.reward_mean,
            "baseline": spec.baseline,
            "baseline_values": stats.baseline_values,
            "reward_hash": spec_hash(reward),
            "steps": len(steps),
            "learner_version": learner.version,
            "trained_from_policy_version": policy_version,
            "checkpoint_uri": uri,
            "seconds": round(time.monotonic() - started, 3),
        }
        reporter.summary(summary)
    return summary


def main() -> None:
    configure_logging()
    run(load_spec(SessionTrainSpec))


if __name__ == "__main__":
    main()
