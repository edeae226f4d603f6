"""The learner: advantages, the policy loss over packed micro-batches, AdamW; its weights and checkpoints come
from its mixin `workers.rl.learner_weights.LearnerWeights`.

Plain Python over a transformers causal LM (full parameters or LoRA through peft); the trainer job wraps it in a
Ray actor. One `train_step` is one optimizer step on one rollout batch (single epoch, as Composer 2 and
Context-1 train): micro-batches of at most `max_tokens_per_pack` tokens each run forward and backward with the
whole batch's normalisers, so their gradients add up to the batch's.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from workers.rl import distributed, mismatch
from workers.rl.advantages import dapo_overlong_penalty, group_advantages
from workers.rl.batching import (
    as_float,
    flatten_segments,
    given_advantages,
    micro_batches,
    minibatches,
    padded,
    per_sample,
)
from workers.rl.checkpoints import checkpoint_policy_state
from workers.rl.config import TrainConfig, settings_for
from workers.rl.learner_weights import LearnerWeights
from workers.rl.losses import policy_loss, sequence_kl
from workers.rl.packing import completion_logprobs
from workers.rl.placement import plan_resources
from workers.rl.rollout import Sample
from workers.rl.weightsync import WeightSyncSender


class Learner(LearnerWeights):
    def __init__(
        self,
        model_path: Path | str,
        config: TrainConfig,
        *,
        threads: int | None = None,
        device: str = "cpu",
        storage_options: Mapping[str, Any] | None = None,
        reader: bool = False,
    ) -> None:
        """`reader`: a single-process learner that only reads a checkpoint's policy (workers.rl.checkpoints), also
        inside a rank of a process group (a DDP run that starts from a single learner's checkpoint)."""
        # One function on purpose: the learner's state in the order it must be built (model, LoRA, reference,
        # optimizer, ranks).
        from transformers import AutoModelForCausalLM

        if threads:
            torch.set_num_threads(threads)
        torch.manual_seed(config.seed)
        self.config = config
        self.num_engines = plan_resources(config).engines  # the mismatch is also measured per engine
        self.settings = settings_for(config)  # the algorithm's defaults merged with the run's overrides
        self.loss_config = self.settings.loss
        model: Any = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32, local_files_only=True)
        if config.checkpoint_uri:  # start from another run's policy: before the reference copy and the adapters
            self._load_initial(model, config, storage_options, threads)
            torch.manual_seed(config.seed)  # the adapters' init draws as in a run from base_model's weights
        self.device = torch.device(device)
        self.model_path = str(model_path)
        model = model.to(self.device)
        self.reference: Any = None
        if self.loss_config.kl_coef > 0 and config.lora is None:
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        if config.lora is not None:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(
                model,
                LoraConfig(
                    r=config.lora.rank,
                    lora_alpha=config.lora.alpha,
                    lora_dropout=config.lora.dropout,
                    target_modules=list(config.lora.target_modules),
                ),
            )
        if config.gradient_checkpointing:
            model.gradient_checkpointing_enable()
            model.config.use_cache = False
        self.rank, self.world_size = (0, 1) if reader else distributed.rank_and_world()
        if config.learner.strategy != "single" and not torch.distributed.is_initialized():
            raise RuntimeError(
                f"learner.strategy {config.learner.strategy} runs in a process group: start it with "
                "workers.rl.learner_group.LearnerGroup (or init_process_group first)"
            )
        if config.learner.strategy == "single" and self.world_size > 1:
            raise RuntimeError("learner.strategy single in a process group of several ranks: use ddp or fsdp2")
        # The module forward runs through (DDP's wrapper or the FSDP2 root); `self.model` stays the transformers
        # model (sharded in place under FSDP2) for state dicts, LoRA and saving.
        self.engine: Any = distributed.wrap(model, config.learner, self.device)
        if self.reference is not None:
            self.reference = distributed.wrap(self.reference, config.learner, self.device, trainable=False)
        self.model: Any = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=config.learning_rate, weight_decay=config.weight_decay)
        self.version = 0
        self.step = 0
        # The last step's learner log-probs of each scored sample's completion tokens (index in that step's batch ->
        # one per position, as Sample.old_logprobs): π_old as the learner saw it, before the update. The trajectory
        # page's token view shows them beside the engine's (`scored_logprobs`).
        self.scored: dict[int, list[float]] = {}
        self.sender = WeightSyncSender()
        self._sent_version: int | None = None  # the policy version last gathered for the rollout workers
        self.temperature = config.sampling.temperature or 1.0

    @staticmethod
    def _load_initial(
        model: Any, config: TrainConfig, storage_options: Mapping[str, Any] | None, threads: int | None
    ) -> None:
        assert config.checkpoint_uri
        state, _ = checkpoint_policy_state(config.base_model, config.checkpoint_uri, storage_options, threads)
        _, unexpected = model.load_state_dict(state, strict=False)
        if unexpected:
            raise ValueError(
                f"checkpoint_uri {config.checkpoint_uri} holds weights {unexpected[:3]} that base_model "
                f"{config.base_model!r} does not have: it was trained from another model"
            )

    # --- training -------------------------------------------------------------------------------------------
    def train_step(
        self, samples: Sequence[Sample], advantages: Sequence[float] | Tensor | None = None
    ) -> dict[str, float]:
        """One optimizer step on one rollout batch (contiguous groups of `group_size` samples).

        Rewards are shaped first (DAPO's overlong penalty, the KL when it is a reward penalty), then turned into
        group advantages. What is trained and how it is normalised follows the algorithm (CONVENTIONS.md, "What
        each algorithm means"):

        - groups whose shaped rewards are all equal have advantage 0; with `drop_equal_groups` they skip the
          forward and backward. GRPO, Dr. GRPO, Composer and GSPO still count them in their normaliser (every
          sampled sequence, as P1/P2/P5 average over the whole batch), so skipping changes no gradient unless the
          KL is in the loss; DAPO and CISPO average over the tokens of the groups they train on (P3's filter);
        - an empty completion (no sampled token) keeps its reward in its group's mean and std and counts in the
          per-sequence normalisers; it has no token to carry a gradient, and `empty_completions` counts it;
        - an empty batch (dynamic sampling found no group with signal) takes no optimizer step but counts as a
          step, so checkpoints and the data order stay aligned.

        `advantages` ([N], one per sample, reward units) replaces all of that for samples that come in no groups
        (real-time RL's sessions, `workers.realtime.samples`, whose baseline the caller chose): no reward shaping
        and no group advantages; every sample with a sampled token is trained (an advantage of 0 included) and the
        per-sequence normalisers count every sample of the batch. The KL in the loss still applies.
        """
        # One function on purpose: the step's order is the method (shape rewards, advantages, select, minibatches,
        # metrics); each part it calls is its own function.
        started = time.perf_counter()
        cfg = self.config
        settings = self.settings
        rewards = torch.tensor([s.reward for s in samples], dtype=torch.float64)
        if advantages is None:
            shaped, metrics = self._shaped_rewards(samples, rewards)
            adv = group_advantages(
                shaped, cfg.group_size, scale=settings.scale_rewards, drop_equal_groups=settings.drop_equal_groups
            )
        else:
            adv, metrics = given_advantages(advantages, len(samples)), {}
        # Token provenance: a sample whose trained ids are not the engine's (re-encoded text) is counted, not trained.
        kept = [
            i
            for i in range(len(samples))
            if bool(adv.keep[i]) and samples[i].sampled_tokens > 0 and not samples[i].provenance_mismatch
        ]
        metrics.update(
            {
                "reward_mean": float(rewards.mean()) if len(samples) else 0.0,
                "reward_std": float(rewards.std()) if len(samples) > 1 else 0.0,
                "advantage_mean": float(adv.advantages[adv.keep].mean()) if bool(adv.keep.any()) else 0.0,
                "advantage_abs_mean": float(adv.advantages[adv.keep].abs().mean()) if bool(adv.keep.any()) else 0.0,
                "dropped_groups": float(adv.dropped_groups),
                "groups": float(adv.num_groups),
                "signal_groups": float(adv.signal_groups),
                "empty_completions": float(sum(1 for s in samples if s.sampled_tokens == 0)),
                "mismatch/provenance_mismatched_samples": float(sum(1 for s in samples if s.provenance_mismatch)),
                "response_length": float(np.mean([s.sampled_tokens for s in samples])) if len(samples) else 0.0,
            }
        )
        terms = sorted({k for s in samples for k in s.terms})
        for name in terms:
            metrics[f"term/{name}"] = float(np.mean([s.terms.get(name, 0.0) for s in samples]))
        # `substeps` minibatches of whole groups, one optimizer step each (Context-1's 4 gradient substeps); with
        # 1 the whole batch is one minibatch. Each minibatch is normalised as a batch of its own.
        parts = minibatches(len(samples), cfg.group_size if advantages is None else 1, cfg.substeps)
        totals = {"loss": 0.0, "policy_loss": 0.0, "entropy": 0.0, "grad_norm": 0.0}
        weighted = {"clip_fraction": 0.0, "ratio_mean": 0.0, "kl": 0.0}
        counts = {"ratio": 0.0, "kl": 0.0, "steps": 0.0}
        ratio_max = 0.0
        # Train-inference mismatch (docs/methods.md P7): with a correction, π_old is the learner's recomputation of
        # every trained token before any update, and the loss's ratio is against it; without one, the first minibatch's
        # forward (before this step's first update) is compared with the engine's log-probs, at no extra cost.
        recomputed = self._recompute_old(samples, kept) if cfg.mismatch.correction != "none" and kept else None
        gap: dict[str, float] = dict(recomputed[1]) if recomputed is not None else {}
        self.scored = dict(recomputed[0]) if recomputed is not None else {}
        corrected = 0.0
        self.model.train()
        for at, part in enumerate(parts):
            part_kept = [i for i in kept if part.start <= i < part.stop]
            out = self._substep(
                samples,
                adv.advantages,
                part_kept,
                sequences=len(part),
                learner_old=recomputed[0] if recomputed is not None else None,
                measure=recomputed is None and at == 0,
            )
            if out is None:
                continue
            gap = mismatch.add_sums(gap, out.pop("mismatch", {}))
            corrected += out.pop("corrected_tokens", 0.0)
            for name in totals:
                totals[name] += out[name]
            # Clip fraction and ratio are means over ratio units (tokens; sequences for GSPO), KL over KL tokens.
            for name in weighted:
                weighted[name] += out[name] * out["kl_units" if name == "kl" else "ratio_units"]
            counts["ratio"] += out["ratio_units"]
            counts["kl"] += out["kl_units"]
            counts["steps"] += 1
            ratio_max = max(ratio_max, out["ratio_max"])
        if kept:
            self.version += 1
        steps = max(counts["steps"], 1.0)
        # Loss, entropy and the gradient norm: the mean over the optimizer steps taken (each already a batch mean).
        metrics.update({name: totals[name] / steps for name in ("loss", "policy_loss", "entropy")})
        grad_norm = totals["grad_norm"] / steps
        metrics["clip_fraction"] = weighted["clip_fraction"] / max(counts["ratio"], 1.0)
        metrics["ratio_mean"] = weighted["ratio_mean"] / max(counts["ratio"], 1.0)
        if self.loss_config.kl_in_loss:
            metrics["kl"] = weighted["kl"] / max(counts["kl"], 1.0)
        metrics.setdefault("kl", 0.0)
        metrics["substeps"] = counts["steps"]
        metrics.update(mismatch.mismatch_metrics(gap))
        if cfg.mismatch.correction != "none":
            # Share of the trained tokens whose weight the correction truncated (at C) or masked (to 0).
            metrics["mismatch/corrected_share"] = corrected / max(gap.get("tokens", 0.0), 1.0)
        self.step += 1
        seconds = time.perf_counter() - started
        metrics.update(
            {
                "ratio_max": ratio_max,
                "grad_norm": grad_norm,
                "train_seconds": seconds,
                "train_tokens": float(sum(samples[i].total_tokens for i in kept)),
                "trained_samples": float(len(kept)),
            }
        )
        return metrics

    def scored_logprobs(self) -> dict[int, list[float]]:
        """The last step's learner log-probs per scored sample (index in its batch), rounded for storage. Each rank
        holds the samples it scored (its share of the batch; all of them with a mismatch correction, which every
        rank recomputes). Samples the step did not train (equal-reward groups dropped, no sampled token) and, with
        several minibatches, those after the first (the update already moved the weights) are absent."""
        return {i: [round(float(v), 4) for v in lps] for i, lps in self.scored.items()}

    def _substep(
        self,
        samples: Sequence[Sample],
        all_advantages: Tensor,
        kept: list[int],
        *,
        sequences: int,
        learner_old: dict[int, list[float]] | None = None,
        measure: bool = False,
    ) -> dict[str, Any] | None:
        """Forward, backward and one optimizer step over the trained samples `kept` of one minibatch of
        `sequences` samples; None when no rank had anything to train (no step taken).

        `learner_old`: the learner's recomputed log-probs per sample (a mismatch correction is on): the loss's π_old,
        and with the engine's the correction's weights. `measure`: compare this forward with the engine's
        log-probs (the step's first minibatch, before any update)."""
        # One function on purpose: forward, loss, backward and the optimizer step of one minibatch share its tensors;
        # split, they would pass a dozen of them around.
        mm = self.config.mismatch
        gap: dict[str, float] = {}
        corrected = 0.0
        cfg = self.config
        # The minibatch's normalisers (docs/methods.md P1-P5): every sampled sequence for the per-sequence and
        # constant normalisers, the tokens of the trained groups for the token-level ones.
        batch_tokens = float(sum(samples[i].sampled_tokens for i in kept))
        if int(distributed.all_reduce_max(float(len(kept)))) == 0:
            return None
        sums = {"loss": 0.0, "policy_loss": 0.0, "entropy": 0.0}
        weighted = {"clip_fraction": 0.0, "ratio_mean": 0.0, "kl": 0.0}
        ratio_count, kl_tokens = 0.0, 0.0
        ratio_max = 0.0
        self.optimizer.zero_grad(set_to_none=True)
        # This rank's share of the trained samples (all of them on one rank), in micro-batches; every rank runs as
        # many as the rank with the most, the extra ones on a stand-in sample whose loss counts zero.
        mine = kept
        if self.world_size > 1:
            shares = distributed.shard_by_tokens([samples[i].total_tokens for i in kept], self.world_size)
            mine = [kept[j] for j in shares[self.rank]]
        plan: list[list[int] | None] = [
            [mine[j] for j in group] for group in micro_batches([samples[i] for i in mine], cfg.max_tokens_per_pack)
        ]
        rounds = int(distributed.all_reduce_max(float(len(plan))))
        plan += [None] * (rounds - len(plan))
        stand_in = kept[:1] or [0]
        for at, members in enumerate(plan):
            real = members is not None
            indices = members if members is not None else stand_in
            batch = [samples[i] for i in indices]
            advantages = all_advantages[indices].to(torch.float32).to(self.device)
            seqs, starts, owners = flatten_segments(batch)
            # Rows as long as the longest sequence: on CPU attention costs L^2 per row whatever the block-diagonal
            # mask hides, so short rows packed first-fit beat one long row (helper measurement: 1.7x vs 0.17x).
            row = max(len(seq) for seq in seqs)
            with self._gradient_sync(last=at == rounds - 1):
                logps, entropy = self.engine(
                    seqs, starts, max_tokens_per_pack=row, temperature=self.temperature, with_entropy=True
                )
                logp = per_sample(list(logps), owners, len(batch))
                old = padded([s.old_logprobs for s in batch], torch.float32).to(self.device)
                mask = padded([[float(m) for m in s.loss_mask] for s in batch], torch.float32).to(self.device)
                weights = None
                if learner_old is not None:  # π_old is the learner's; the engine's log-probs set the correction
                    engine, old = old, padded([learner_old[i] for i in indices], torch.float32).to(self.device)
                    weights = mismatch.correction_weights(old, engine, mask, mm.correction, mm.cap)
                    if real:
                        corrected += mismatch.correction_share(weights, mask, mm.correction, mm.cap) * float(
                            (mask > 0).sum()
                        )
                elif measure and real:
                    engines = [s.engine for s in batch]
                    gap = mismatch.add_sums(
                        gap, mismatch.sums_by_engine(logp.detach(), old, mask, engines, self.num_engines, mm.cap)
                    )
                    for row, i in enumerate(indices):
                        self.scored[i] = logp[row, : len(samples[i].old_logprobs)].detach().float().cpu().tolist()
                ref = (
                    self._reference_logprobs(seqs, starts, owners, len(batch)) if self.loss_config.kl_in_loss else None
                )
                out = policy_loss(
                    logp,
                    old,
                    advantages,
                    mask,
                    self.loss_config,
                    ref,
                    batch_sequences=sequences,
                    batch_tokens=batch_tokens,
                    correction=weights,
                )
                # DDP and FSDP2 average gradients over ranks; the batch's gradient is their sum (each rank's loss
                # is already normalised by the whole batch), hence the world size. A stand-in counts zero.
                scale = float(self.world_size) if real else 0.0
                (out.loss * scale).backward()  # type: ignore[no-untyped-call]
            if not real:
                continue
            share = float(mask.sum()) / max(batch_tokens, 1.0)
            sums["loss"] += out.loss.item()
            sums["policy_loss"] += out.policy_loss  # already normalised by the whole batch, like `loss`
            sums["entropy"] += float(torch.nan_to_num(entropy).mean()) * share
            # Each metric is a mean over its own units (tokens; sequences for GSPO's ratio and clip): combine the
            # micro-batches weighted by those units, so the step's value is the mean over the whole batch.
            weighted["clip_fraction"] += out.clip_fraction * out.ratio_count
            weighted["ratio_mean"] += out.ratio_mean * out.ratio_count
            weighted["kl"] += out.kl * out.kl_tokens
            ratio_count += out.ratio_count
            kl_tokens += out.kl_tokens
            ratio_max = max(ratio_max, out.ratio_max)
        if self.world_size > 1:  # the step's metrics over every rank's share
            totals = distributed.all_reduce_sum([*sums.values(), *weighted.values(), ratio_count, kl_tokens])
            sums = dict(zip(sums, totals[: len(sums)], strict=True))
            weighted = dict(zip(weighted, totals[len(sums) : len(sums) + len(weighted)], strict=True))
            ratio_count, kl_tokens = totals[-2], totals[-1]
            ratio_max = distributed.all_reduce_max(ratio_max)
            corrected = distributed.all_reduce_sum([corrected])[0]
            if measure:  # every rank measured its share: add them up (the largest gap is the max)
                keys, maxima = mismatch.sum_keys(self.num_engines)
                summed = distributed.all_reduce_sum([gap.get(k, 0.0) for k in keys])
                biggest = {k: distributed.all_reduce_max(gap.get(k, 0.0)) for k in maxima}
                gap = {**dict(zip(keys, summed, strict=True)), **biggest}
        grad_norm = as_float(torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {
            **sums,
            "grad_norm": grad_norm,
            "clip_fraction": weighted["clip_fraction"] / max(ratio_count, 1.0),
            "ratio_mean": weighted["ratio_mean"] / max(ratio_count, 1.0),
            "kl": weighted["kl"] / max(kl_tokens, 1.0),
            "ratio_units": ratio_count,
            "kl_units": kl_tokens,
            "ratio_max": ratio_max,
            "mismatch": gap,
            "corrected_tokens": corrected,
        }

    @torch.no_grad()
    def _recompute_old(
        self, samples: Sequence[Sample], kept: list[int]
    ) -> tuple[dict[int, list[float]], dict[str, float]]:
        """π_old for a mismatch correction: the learner's log-probs of every trained sample's completion tokens
        with the weights that sampled them (before this step's update), and their gap to the engine's (sums).
        Every rank computes all of them, so the forwards line up across ranks and nothing needs reducing."""
        mm = self.config.mismatch
        out: dict[int, list[float]] = {}
        gap: dict[str, float] = {}
        self.model.eval()
        for group in micro_batches([samples[i] for i in kept], self.config.max_tokens_per_pack):
            indices = [kept[j] for j in group]
            batch = [samples[i] for i in indices]
            seqs, starts, owners = flatten_segments(batch)
            logps = self.engine(
                seqs, starts, max_tokens_per_pack=max(len(q) for q in seqs), temperature=self.temperature
            )
            logp = per_sample(list(logps), owners, len(batch)).float()
            engine = padded([s.old_logprobs for s in batch], torch.float32).to(self.device)
            mask = padded([[float(m) for m in s.loss_mask] for s in batch], torch.float32).to(self.device)
            owners_engine = [s.engine for s in batch]
            gap = mismatch.add_sums(
                gap, mismatch.sums_by_engine(logp, engine, mask, owners_engine, self.num_engines, mm.cap)
            )
            for row, i in enumerate(indices):
                out[i] = logp[row, : len(samples[i].old_logprobs)].cpu().tolist()
        self.model.train()
        return out, gap

    def _shaped_rewards(self, samples: Sequence[Sample], rewards: Tensor) -> tuple[Tensor, dict[str, float]]:
        """The rewards the advantages are computed from: the task reward, plus DAPO's overlong penalty (P3 eq. 13)
        on the episode's sampled tokens, minus β times the sequence KL when the KL is a reward penalty."""
        settings = self.settings
        shaped = rewards.clone()
        metrics: dict[str, float] = {}
        if settings.overlong_penalty:
            lengths = torch.tensor([s.sampled_tokens for s in samples], dtype=torch.float64)
            penalty = dapo_overlong_penalty(lengths, settings.overlong_max_tokens, settings.overlong_cache_tokens)
            shaped = shaped + penalty
            metrics["overlong_penalty_mean"] = float(penalty.mean()) if len(samples) else 0.0
            metrics["overlong_share"] = float((penalty < 0).double().mean()) if len(samples) else 0.0
        if self.loss_config.kl_in_reward:
            kl, tokens = self._sequence_kl(samples)
            shaped = shaped - self.loss_config.kl_coef * kl
            metrics["kl"] = float(kl.sum()) / max(tokens, 1.0)  # per token, like the loss placement's
            metrics["kl_penalty_mean"] = float(self.loss_config.kl_coef * kl.mean()) if len(samples) else 0.0
        if len(metrics):
            metrics["shaped_reward_mean"] = float(shaped.mean()) if len(samples) else 0.0
        return shaped, metrics

    def _sequence_kl(self, samples: Sequence[Sample]) -> tuple[Tensor, float]:
        """Each sample's KL estimate Σ_t k_t from the reference over its sampled tokens ([N], float64), and the
        number of those tokens."""
        out = torch.zeros(len(samples), dtype=torch.float64)
        with_tokens = [i for i, s in enumerate(samples) if s.sampled_tokens > 0]
        tokens = 0.0
        for group in micro_batches([samples[i] for i in with_tokens], self.config.max_tokens_per_pack):
            batch = [samples[with_tokens[j]] for j in group]
            seqs, starts, owners = flatten_segments(batch)
            ref = self._reference_logprobs(seqs, starts, owners, len(batch))
            old = padded([s.old_logprobs for s in batch], torch.float32).to(self.device)
            mask = padded([[float(m) for m in s.loss_mask] for s in batch], torch.float32).to(self.device)
            values = sequence_kl(old, ref.to(old.dtype), mask, self.loss_config.kl_estimator)
            out[[with_tokens[j] for j in group]] = values.double().cpu()
            tokens += float(mask.sum())
        return out, tokens

    @torch.no_grad()
    def _reference_logprobs(self, seqs: list[list[int]], starts: list[int], owners: list[int], samples: int) -> Tensor:
        row = max(len(s) for s in seqs)
        if self.reference is not None:  # a LogprobForward (sharded under FSDP2)
            logps = self.reference(seqs, starts, max_tokens_per_pack=row, temperature=self.temperature)
        else:  # LoRA: the reference policy is the base model, i.e. the adapters switched off
            with self.model.disable_adapter():
                logps = completion_logprobs(
                    self.model, seqs, starts, max_tokens_per_pack=row, temperature=self.temperature
                )
        return per_sample(list(logps), owners, samples)

    def _gradient_sync(self, *, last: bool) -> Any:
        """DDP reduces gradients on the last micro-batch only (the others accumulate locally); FSDP2 reduce-scatters
        on each, which keeps gradients sharded between micro-batches."""
        if self.config.learner.strategy == "ddp" and not last:
            return self.engine.no_sync()
        return contextlib.nullcontext()
