"""The trainer: policy-gradient RL of a language model on Ray, as a training run's job builds and runs it
(`workers.jobs.train` is its wiring).

Rollout actors (`workers.rl.actors`) generate groups of G completions per prompt with the current policy, run the
environment's episodes and score them with the run's reward config; the learner computes advantages and the loss,
steps AdamW and sends the new weights to the rollout actors (a delta-compressed update by default). In async mode
the rollouts of step t+1 are generated while step t trains, and every sample's policy version is checked against
`max_staleness`. Checkpoints go to object storage every `checkpoint_every` steps and are registered with the
control plane; a run created with `resume_from` continues the step counter, optimizer, RNG and data order.

Which prompts a step rolls out (`workers.rl.steps`): by default epochs of a seeded shuffle (`data_order`), every
task once per epoch. With `upsample_hard` on (Composer 2's hard-data upsampling,
`workers.rl.sampling.HardUpsampler`) each step draws its prompts with weights from the turns or tokens each task's
past rollouts needed: distinct within a step, but a task can recur across steps and an easy one can wait longer than
an epoch (the trainer never enforced single-epoch training: `data_order` cycles epochs). The needs are saved beside
each checkpoint (`<checkpoint>.sampling.json`), so a resumed run draws as the original would have.
"""

from __future__ import annotations

import json
import time
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group

from workers.detectors.registry import flag_metrics
from workers.models.registry import resolve_base_model
from workers.reporting import Reporter, report_flags
from workers.rewards.schema import validate_reward_spec
from workers.rewards.score import annealed_weights, histogram
from workers.rl.actors import engines_for, learner_for, wait_for_resources
from workers.rl.config import settings_for
from workers.rl.placement import plan_resources
from workers.rl.rollout import RolloutResult, Sample
from workers.rl.sampling import Curriculum, FilledBatch, HardUpsampler, dynamic_sampling_batch
from workers.rl.staleness import bound_staleness
from workers.rl.steps import (
    TOGGLE_BUDGETS_FILE,
    UPSAMPLE_STATE_SUFFIX,
    TrainJob,
    annealed_beta,
    shown_advantages,
    step_prompts,
    toggle_budgets,
    toggled,
    trajectory_summary,
)
from workers.rl.token_view import full_record, stored_indices
from workers.search.metrics import mean_metrics
from workers.storage import (
    SHARDED_SUFFIX,
    is_sharded_checkpoint,
    read_bytes,
    write_bytes,
    write_checkpoint,
    write_sharded_checksum,
)


class Trainer:
    """One training run on Ray: rollout engines generate each step's groups with the current policy, the learner
    trains on them and sends the new weights back, and every step is reported (metrics, trajectories, flags,
    progress by phase) and checkpointed every `checkpoint_every` steps. `rows` are the run's task rows, already
    read and filtered; `task_ids` their ids in the environment's own validation."""

    def __init__(self, job: TrainJob, rows: list[dict[str, Any]], task_ids: list[str], reporter: Reporter) -> None:
        self.job, self.rows, self.task_ids, self.reporter = job, rows, task_ids, reporter
        self.config = job.config
        self.opts = job.storage_options
        self.reward_spec = validate_reward_spec(job.reward)
        self.settings = settings_for(self.config)  # the algorithm's defaults merged with the run's overrides
        self.upsampler: HardUpsampler | Curriculum | None = None
        self.budgets: dict[str, float] = {}
        self.orders: dict[int, list[int]] = {}
        self.drawn_weights: dict[int, list[float]] = {}
        self.version = 0
        self.scored: dict[int, list[float]] = {}  # id(Sample) -> the learner's log-probs of its tokens, last step
        self.last_metrics: dict[str, float] = {}
        self.flag_counts: dict[str, int] = {}

    # --- the run ---------------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        config = self.config
        self._log_settings()
        ray.init(ignore_reinit_error=True, log_to_driver=False)
        self.plan = plan_resources(config)
        self.group = placement_group(self.plan.bundles(), strategy="PACK")
        model_path = str(resolve_base_model(config.base_model))
        self.learner = learner_for(model_path, config, self.plan, self.group, self.opts)
        if config.checkpoint_uri:
            self.reporter.log(
                f"starting from checkpoint {config.checkpoint_uri} (its policy, LoRA merged, on {config.base_model})"
            )
        self.rollouts = engines_for(model_path, config, self.job.reward, self.opts, self.plan, self.group)
        self._place()
        start_step = self._resume()
        self.upsampler = self._sampler()
        self.reporter.progress(start_step, config.steps)
        blob, _, self.version = self.learner.weight_update()
        blob_ref = ray.put(blob)
        ray.get([r.apply.remote(blob_ref, self.version) for r in self.rollouts])
        per_step, workers = config.prompts_per_step, self.plan.engines
        self.shares = [per_step // workers + (1 if i < per_step % workers else 0) for i in range(workers)]
        has_toggle = config.toggle is not None
        self.budgets = toggle_budgets(self.job, self.rows, self.rollouts, self.reporter) if has_toggle else {}
        pending = self._launch(start_step) if start_step < config.steps else []
        step_started = time.perf_counter()
        for step in range(start_step, config.steps):
            pending = self._step(step, pending, step_started)
            step_started = time.perf_counter()
        summary = {
            "steps": config.steps,
            "start_step": start_step,
            "final_reward_mean": self.last_metrics.get("reward_mean"),
            "policy_version": self.version,
            "flag_counts": self.flag_counts,
        }
        self.reporter.summary(summary)
        self.learner.shutdown()  # the run's actors give their resources back now, not when the driver exits
        for worker in self.rollouts:
            ray.kill(worker)
        remove_placement_group(self.group)
        return summary

    def _log_settings(self) -> None:
        config = self.config
        algorithm = config.algorithm + (
            f" (the default of environment {config.algorithm_default_of})" if config.algorithm_default_of else ""
        )
        self.reporter.log(f"{len(self.rows)} tasks, base model {config.base_model}, {algorithm}, mode {config.mode}")
        self.reporter.log(
            "effective settings: "
            + ", ".join(f"{row.name}={row.value}" for row in self.settings.rows)
            + "".join(f"; note: {note}" for note in self.settings.notes)
        )

    def _place(self) -> None:
        """Wait until every actor has its resources, then report where each one runs."""
        plan, learner, rollouts = self.plan, self.learner, self.rollouts
        pending = [self.group.ready(), *learner.ready(), *[r.ready.remote() for r in rollouts]]
        wait_for_resources(pending, self.reporter, plan)
        placement = learner.start() + ray.get([r.placement.remote() for r in rollouts])
        self.reporter.summary({"placement": placement, "resources": plan.summary()})
        nodes = sorted({str(p["node_ip"]) for p in placement})
        self.reporter.log(
            f"placement {plan.placement}: learner {self.config.learner.strategy} on {plan.ranks} rank(s), "
            f"{plan.engines} engine(s), on node(s) {', '.join(nodes)} ({plan.need_text()})"
        )

    def _resume(self) -> int:
        """The step a run created with `resume_from` continues at (its learner state loaded), else 0."""
        resume_from = self.job.resume_from
        if not resume_from:
            return 0
        if is_sharded_checkpoint(resume_from):
            state = self.learner.load_sharded(resume_from, self.opts)
        else:
            state = self.learner.load_checkpoint(read_bytes(resume_from, self.opts))
        self.reporter.log(f"resumed from {resume_from} at step {state['step']} (policy version {state['version']})")
        return int(state["step"])

    def _sampler(self) -> HardUpsampler | Curriculum | None:
        """The curriculum or the hard-data upsampler that draws each step's prompts (None: the data order)."""
        config, rows = self.config, self.rows
        if config.curriculum.by != "off":
            curriculum = Curriculum.from_rows(rows, config.curriculum, config.steps, config.seed)
            self.reporter.log(
                f"curriculum by hops: {sum(curriculum.easy)} easy and {len(rows) - sum(curriculum.easy)} hard tasks, "
                f"easy-skewed until step {curriculum.switch_step}"
            )
            return curriculum
        upsample = config.upsample_hard
        if upsample.by == "off":
            return None
        upsampler = HardUpsampler(
            self.task_ids, by=upsample.by, strength=upsample.strength, max_weight=upsample.max_weight, seed=config.seed
        )
        if self.job.resume_from:
            try:
                upsampler.load(json.loads(read_bytes(self.job.resume_from + UPSAMPLE_STATE_SUFFIX, self.opts)))
                self.reporter.log(f"upsample_hard: the needs of {len(upsampler.needs.counts)} tasks restored")
            except (OSError, ValueError) as exc:
                self.reporter.log(f"upsample_hard: no needs stored beside the checkpoint ({exc}); weights start at 1")
        return upsampler

    # --- generation --------------------------------------------------------------------------------------------
    def f_beta(self, step: int) -> float | None:
        return annealed_beta(self.config, step, len(self.rows))

    def _step_order(self, step: int) -> list[int]:
        """`step`'s prompts: the data order, or the upsampler's weighted draw (drawn once per step, so a regenerated
        rollout and dynamic sampling see the same rows)."""
        if step not in self.orders:
            per_step = self.config.prompts_per_step
            self.orders[step], self.drawn_weights[step] = step_prompts(
                len(self.rows), self.config.seed, step, per_step, self.upsampler
            )
        return self.orders[step]

    def _launch(self, step: int, order: list[int] | None = None, round_: int = 0) -> list[Any]:
        """Rollouts of `step`'s prompts (`_step_order`), or of `order` for refill round `round_` (> 0)."""
        config = self.config
        order = self._step_order(step) if order is None else order
        futures: list[Any] = []
        at = 0
        for worker, share in zip(self.rollouts, self.shares, strict=True):
            if share:
                chunk = [self.rows[i] for i in order[at : at + share]]
                futures.append(
                    worker.rollout.remote(
                        chunk,
                        config.group_size,
                        config.seed * 100_003 + step + 1_000_003 * round_,
                        f"s{step + 1}-{f'r{round_}-' if round_ else ''}w{len(futures)}-",
                        self.f_beta(step),
                        step,
                    )
                )
                at += share
        return futures

    def _refill(self, step: int, first: list[RolloutResult]) -> tuple[list[RolloutResult], FilledBatch, float]:
        """DAPO's dynamic sampling (P3, `workers.rl.sampling`): keep the groups with signal, generate more rounds
        from fresh prompts until the batch has `prompts_per_step` of them or `dynamic_sampling_max_rounds` rounds
        ran. Returns every round's results, the filled batch and the rounds' generation seconds (a round's workers
        run in parallel, rounds one after the other)."""
        config, per_step = self.config, self.config.prompts_per_step
        results = list(first)
        seconds = [max(r.generation_seconds for r in first)]
        row_weights = self.upsampler.weights() if self.upsampler is not None else None

        def generate(order: list[int], round_: int) -> list[Sample]:
            if row_weights is not None:
                self.drawn_weights.setdefault(step, []).extend(row_weights[i] for i in order)
            extra: list[RolloutResult] = ray.get(self._launch(step, order, round_))
            results.extend(extra)
            seconds.append(max(r.generation_seconds for r in extra))
            return [s for r in extra for s in r.samples]

        filled = dynamic_sampling_batch(
            [s for r in first for s in r.samples],
            generate,
            num_rows=len(self.rows),
            seed=config.seed,
            step=step,
            first_rows=self._step_order(step),
            target_groups=per_step,
            group_size=config.group_size,
            max_rounds=self.settings.dynamic_sampling_max_rounds,
            weights=row_weights,
        )
        if filled.short_groups:
            self.reporter.log(
                f"step {step + 1}: dynamic sampling kept {per_step - filled.short_groups} of {per_step} groups "
                f"after {filled.rounds} rounds (dynamic_sampling_max_rounds); training on a smaller batch"
            )
        return results, filled, sum(seconds)

    # --- one step ----------------------------------------------------------------------------------------------
    def _step(self, step: int, pending: list[Any], step_started: float) -> list[Any]:
        """Generate (or take the rollouts already running), train, sync the weights, report and checkpoint step
        `step`; returns the next step's rollouts when they are already launched. Each phase is reported as it
        starts: the stall watchdog applies its limit (config.stall_limits)."""
        # One function on purpose: one training step's phases in order (generate, train, sync, report, checkpoint),
        # each reported as it starts.
        config, reporter = self.config, self.reporter
        reporter.progress(step, config.steps, phase="generation")
        wait_started = time.perf_counter()
        results: list[RolloutResult] = ray.get(pending)
        wait_seconds = time.perf_counter() - wait_started
        samples = [s for r in results for s in r.samples]
        newest_lag = max(self.version - r.newest_version for r in results)
        if newest_lag > config.max_staleness:
            # Even the newest tokens are too old to train on (only if an update overtook a queued rollout):
            # regenerate. Older tokens of partial rollouts leave the loss one by one (bound_staleness below).
            reporter.log(f"step {step}: samples {newest_lag} versions old > max_staleness; regenerating")
            results = ray.get(self._launch(step))
            samples = [s for r in results for s in r.samples]
        batch, filled = samples, None
        generation_seconds = max(r.generation_seconds for r in results)
        if self.settings.dynamic_sampling:
            results, filled, generation_seconds = self._refill(step, results)
            batch, samples = filled.samples, filled.generated
        self.orders.pop(step, None)
        sampling_metrics: dict[str, float] = {}
        if self.upsampler is not None:
            # The step's draws are reported with the weights they had; its episodes then update the needs before
            # the next step's prompts are drawn (in async mode too: the draw comes just below).
            sampling_metrics = self.upsampler.metrics(self.drawn_weights.pop(step, []))
            self.upsampler.record(samples)
        pending = []
        if config.mode == "async" and step + 1 < config.steps:
            pending = self._launch(step + 1)  # generated with the current weights while this step trains
        toggle_metrics: dict[str, float] = {}
        if config.toggle is not None:
            batch, toggle_metrics = toggled(batch, config, step, self.budgets)
        version_metrics = bound_staleness(batch, self.version, config.max_staleness)
        metrics = self._train(step, batch, samples, toggle_metrics, filled)
        if config.mode == "sync" and step + 1 < config.steps:
            pending = self._launch(step + 1)
        sampled = sum(r.sampled_tokens for r in results)
        metrics.update(version_metrics)
        metrics.update(sampling_metrics)
        metrics.update({f"env/{k}": v for k, v in mean_metrics(s.episode_metrics for s in samples).items()})
        metrics.update(flag_metrics([s.findings for s in samples], config.detectors))
        beta = self.f_beta(step)
        if beta is not None:
            metrics["f_beta"] = beta
        metrics.update(annealed_weights(self.reward_spec, step))
        metrics.update(
            {
                "staleness": float(version_metrics["versions/max_lag"]),
                "generation_seconds": generation_seconds,
                "rollout_wait_seconds": wait_seconds,
                "engine_weight_apply_seconds": max(r.weight_apply_seconds for r in results),
                "step_seconds": time.perf_counter() - step_started,  # wall time since the last step's end
                "tokens_per_second": sampled / max(generation_seconds + metrics["train_seconds"], 1e-9),
                "sampled_tokens": float(sampled),
                "policy_version": float(self.version),
            }
        )
        self._report(step, metrics, samples, generation_seconds)
        if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps:
            self._checkpoint(step)
        return pending

    def _train(
        self,
        step: int,
        batch: list[Sample],
        samples: list[Sample],
        toggle_metrics: dict[str, float],
        filled: FilledBatch | None,
    ) -> dict[str, float]:
        """The learner's step on `batch`, then the new weights to every engine (colocated engines sleep while the
        learner trains). `samples` are every episode generated (reward_mean is theirs)."""
        config, reporter, rollouts = self.config, self.reporter, self.rollouts
        sleeps = self.plan.placement == "colocated"
        reporter.progress(step, config.steps, phase="training")
        slept = time.perf_counter()
        released = sum(ray.get([r.sleep.remote() for r in rollouts])) if sleeps else 0
        metrics: dict[str, float] = self.learner.train_step(batch)
        # The learner's log-probs of the tokens it scored, by sample (the batch holds the step's own Sample objects;
        # a toggled batch holds copies and is left out): the token view shows them beside the engine's.
        self.scored = {id(batch[i]): lps for i, lps in self.learner.scored_logprobs().items() if i < len(batch)}
        if toggle_metrics:
            # reward_mean stays the task reward; the learner trained on the toggled one
            metrics["toggled_reward_mean"] = metrics["reward_mean"]
            metrics["reward_mean"] = toggle_metrics.pop("toggle/task_reward_mean")
            metrics.update(toggle_metrics)
        if filled is not None:
            # reward_mean stays the policy's reward on fresh prompts (every generated episode); the filtered
            # batch it trained on is biased towards groups with signal.
            metrics["trained_reward_mean"] = metrics["reward_mean"]
            metrics["reward_mean"] = sum(s.reward for s in samples) / max(len(samples), 1)
            metrics.update(filled.metrics())
        reporter.progress(step, config.steps, phase="weight_sync")
        sync_started = time.perf_counter()
        new_blob, sync, new_version = self.learner.weight_update()
        sync_seconds = time.perf_counter() - sync_started
        if sleeps:  # the engines take the device back, then the new weights
            ray.get([r.wake.remote() for r in rollouts])
            metrics["placement/engine_sleep_seconds"] = time.perf_counter() - slept
            metrics["placement/released_gb"] = released / 1024**3
        if new_blob is not None:
            # One object in the store for every engine (Ray fetches it to a node once for all its workers).
            # Without partial rollouts an engine busy generating takes the weights after its rollout, and this
            # waits for it; with them the weights are queued and taken between turns.
            pushed = time.perf_counter()
            ref = ray.put(new_blob)
            sync_seconds += time.perf_counter() - pushed
            # The engines' own load time, not the wait for a rollout still running ahead of it.
            sync_seconds += max(ray.get([r.apply.remote(ref, new_version) for r in rollouts]))
            self.version = new_version
        metrics.update(sync)
        # Learner to engines: the update's encode, the object store and the slowest engine's load (with partial
        # rollouts the loads happen between turns: engine_weight_apply_seconds).
        metrics["weight_sync_seconds"] = sync_seconds
        return metrics

    def _report(self, step: int, metrics: dict[str, float], samples: list[Sample], generation_seconds: float) -> None:
        config, reporter = self.config, self.reporter
        reporter.metric(step + 1, metrics)
        hist = histogram([s.reward for s in samples])  # the run page's reward distribution, latest step
        reporter.histogram("reward", hist["edges"], hist["counts"])
        stored = set(
            stored_indices(
                [bool(s.findings) for s in samples],
                config.group_size,
                config.trajectory_sample_rate,
                config.trajectory_samples_per_step,
            )
        )
        stored_uri = f"{self.job.output_prefix}/trajectories/step-{step + 1:06d}.jsonl"
        if stored:
            advantages = shown_advantages(samples, config.group_size, self.settings.scale_rewards)
            payload = "".join(
                json.dumps(
                    full_record(
                        s.trajectory,
                        step=step + 1,
                        group=i // config.group_size,
                        reward=s.reward,
                        terms=s.terms,
                        advantage=advantages[i],
                        policy_version=s.policy_version,
                        sampled_tokens=s.sampled_tokens,
                        flags=[{"detector": f.detector, "severity": f.severity} for f in s.findings],
                        learner_logprobs=self.scored.get(id(s)),
                        mismatch_cap=config.mismatch.cap,
                    )
                )
                + "\n"
                for i, s in enumerate(samples)
                if i in stored
            ).encode()
            write_bytes(stored_uri, payload, self.opts)
        for index, sample in enumerate(samples):
            # Full records (every one by default, config.trajectory_sample_rate): the trajectory page opens them.
            where = stored_uri if index in stored else ""
            reporter.trajectory(**trajectory_summary(sample, step + 1), storage_uri=where)
            report_flags(reporter, sample.findings, step=step + 1)  # after its trajectory, so ingest links them
            for finding in sample.findings:
                self.flag_counts[finding.detector] = self.flag_counts.get(finding.detector, 0) + 1
        reporter.progress(step + 1, config.steps)
        reporter.log(
            f"step {step + 1}/{config.steps}: reward {metrics['reward_mean']:.3f} loss {metrics['loss']:.4f} "
            f"dropped groups {metrics['dropped_groups']:.0f} flagged {metrics.get('flags/rate', 0.0):.0%} "
            f"({generation_seconds:.1f}s gen, {metrics['train_seconds']:.1f}s train)"
        )
        self.last_metrics = metrics

    def _checkpoint(self, step: int) -> None:
        """The learner's state after `step`: one file (single) or a sharded directory (ddp, fsdp2), each with its
        checksum written last, plus the toggle budgets and the upsampler's needs a resume reads back."""
        config, opts, prefix = self.config, self.opts, self.job.output_prefix
        sharded = config.learner.strategy != "single"
        uri = f"{prefix}/checkpoints/step-{step + 1:06d}" + (SHARDED_SUFFIX if sharded else ".pt")
        if config.toggle is not None and self.budgets:  # first_rollout budgets grow: keep them for a resume
            write_bytes(f"{prefix}/{TOGGLE_BUDGETS_FILE}", json.dumps(self.budgets).encode(), opts)
        # Before the checkpoint: a checkpoint with its checksum is complete.
        if isinstance(self.upsampler, HardUpsampler):
            write_bytes(uri + UPSAMPLE_STATE_SUFFIX, json.dumps(self.upsampler.state()).encode(), opts)
        data_position = (step + 1) * config.prompts_per_step
        if sharded:  # every rank writes its shards, then the manifest of checksums goes last
            self.learner.save_sharded(uri, data_position, opts)
            size = write_sharded_checksum(uri, opts)
        else:
            blob = self.learner.checkpoint_bytes(data_position)
            write_checkpoint(uri, blob, opts)
            size = len(blob)
        self.reporter.checkpoint(
            step + 1, uri, {k: self.last_metrics[k] for k in ("reward_mean", "loss") if k in self.last_metrics}
        )
        self.reporter.log(f"checkpoint {uri} ({size / 1e6:.1f} MB)")
