"""The trainer job (`python -m workers.jobs.train`): policy-gradient RL of a language model on Ray.

Rollout actors generate groups of G completions per prompt with the current policy, run the environment's
episodes and score them with the run's reward config; the learner actor computes advantages and the loss, steps
AdamW and sends the new weights to the rollout actors (a delta-compressed update by default). In async mode the
rollouts of step t+1 are generated while step t trains, and every sample's policy version is checked against
`max_staleness`. Checkpoints go to object storage every `checkpoint_every` steps and are registered with the
control plane; a run created with `resume_from` continues the step counter, optimizer, RNG and data order.

Which prompts a step rolls out: by default epochs of a seeded shuffle (`data_order`), every task once per epoch.
With `upsample_hard` on (Composer 2's hard-data upsampling, `workers.rl.sampling.HardUpsampler`) each step draws
its prompts with weights from the turns or tokens each task's past rollouts needed: distinct within a step, but a
task can recur across steps and an easy one can wait longer than an epoch (the trainer never enforced single-epoch
training: `data_order` cycles epochs). The needs are saved beside each checkpoint (`<checkpoint>.sampling.json`),
so a resumed run draws as the original would have.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from workers.detectors.registry import flag_metrics
from workers.jobs.common import configure_logging, load_spec, report_flags, reporter_for
from workers.jobs.specs import TrainSpec
from workers.reporting import Reporter
from workers.rewards.schema import validate_reward_spec
from workers.rewards.score import annealed_weights, histogram
from workers.rl.config import TrainConfig, settings_for
from workers.rl.placement import ResourcePlan, describe, plan_resources, ray_options
from workers.rl.rollout import RolloutResult, Sample
from workers.rl.sampling import Curriculum, FilledBatch, HardUpsampler, dynamic_sampling_batch
from workers.rl.staleness import bound_staleness
from workers.search.metrics import mean_metrics
from workers.storage import (
    SHARDED_SUFFIX,
    is_sharded_checkpoint,
    read_bytes,
    write_bytes,
    write_checkpoint,
    write_sharded_checksum,
)

log = logging.getLogger("crucible.train")
RESOURCE_WAIT_REPORT_SECONDS = 10.0
UPSAMPLE_STATE_SUFFIX = ".sampling.json"
"""Beside a checkpoint: the hard-data upsampler's per-task needs at that step (JSON), read back on resume."""


def data_order(num_rows: int, seed: int, step: int, per_step: int) -> list[int]:
    """Row indices for `step`: epochs of a seeded permutation, so a resumed run continues the same order."""
    out: list[int] = []
    position = step * per_step
    while len(out) < per_step:
        epoch, offset = divmod(position, num_rows)
        order = list(range(num_rows))
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        take = min(per_step - len(out), num_rows - offset)
        out += order[offset : offset + take]
        position += take
    return out


def annealed_beta(config: TrainConfig, step: int, num_rows: int) -> float | None:
    """docs/methods.md X3: the F-beta of `step` (0-based) under `config.beta_schedule`, moved between epochs (an epoch
    is `num_rows` prompts, `prompts_per_step` a step); None without a schedule."""
    schedule = config.beta_schedule
    return schedule.beta(step * config.prompts_per_step // num_rows) if schedule else None


def step_prompts(
    num_rows: int, seed: int, step: int, per_step: int, upsampler: HardUpsampler | Curriculum | None
) -> tuple[list[int], list[float]]:
    """`step`'s prompt rows and, with hard-data upsampling, the weights they were drawn with: the data order
    (`data_order`, every task once per epoch; no weights) when `upsampler` is None, else its weighted draw."""
    if upsampler is None:
        return data_order(num_rows, seed, step, per_step), []
    return upsampler.draw(step, per_step)


class _RolloutActor:
    def __init__(
        self,
        model_path: str,
        config: TrainConfig,
        reward: dict[str, Any],
        threads: int,
        storage_options: dict[str, Any] | None = None,
        index: int = 0,
    ) -> None:
        import torch

        from workers.envs.registry import configure_storage

        configure_storage(storage_options or {})  # search loads its index, coding_agent its snapshots with them

        from workers.models import make_backend
        from workers.rl.rollout import RolloutWorker
        from workers.rl.weightsync import WeightSyncReceiver

        torch.set_num_threads(threads)
        plan = plan_resources(config)
        self.index = index
        options: dict[str, Any] = {}
        if config.backend == "transformers" and plan.engine_gpus > 0:
            options["device"] = "cuda"
        if config.backend == "vllm" and plan.placement == "colocated":
            options["enable_sleep_mode"] = True  # it sleeps while the learner trains on the same GPU
        if config.backend == "vllm" and plan.engine_gpus >= 2:
            options["tensor_parallel_size"] = int(plan.engine_gpus)  # one engine per tensor-parallel group
        backend = make_backend(config.backend, model_path, **options)
        self.worker = RolloutWorker(
            backend,
            environment=config.environment,
            env_params=config.env_params,
            reward=reward,
            temperature=config.sampling.temperature,
            top_p=config.sampling.top_p,
            max_new_tokens=config.sampling.max_new_tokens,
            detectors=config.detectors,
        )
        self.receiver = WeightSyncReceiver()
        # Partial rollouts: a threaded actor (max_concurrency 2) whose `apply` may run beside `rollout`.
        self.partial = config.partial_rollout
        self._lock = threading.Lock()
        self._rolling = False
        self._pending: list[tuple[bytes, int]] = []

    def ready(self) -> bool:
        return True

    def placement(self) -> dict[str, Any]:
        from workers.rl.learner_group import placement_of

        return placement_of("engine", self.index)

    def sleep(self) -> int:
        return self.worker.backend.sleep()

    def wake(self) -> None:
        self.worker.backend.wake()

    def rollout(
        self,
        rows: list[dict[str, Any]],
        group_size: int,
        seed: int,
        id_prefix: str,
        f_beta: float | None = None,
        step: int | None = None,
    ) -> RolloutResult:
        with self._lock:
            self._rolling = True
        try:
            result = self.worker.rollout(
                rows,
                group_size=group_size,
                seed=seed,
                id_prefix=id_prefix,
                f_beta=f_beta,
                step=step,
                between_turns=self._take_pending if self.partial else None,
            )
            for sample in result.samples:
                sample.engine = self.index
            return result
        finally:
            with self._lock:
                self._rolling = False
            self._take_pending()  # weights that came during the last turn

    def apply(self, blob: bytes, version: int) -> float:
        """Load new weights; returns the seconds the load took. With partial rollouts (a threaded actor) weights
        that arrive while a rollout runs are queued, in order (a delta is decoded against the previous version),
        and the rollout takes them before its next turn; this call then returns 0 at once. Otherwise Ray runs it
        after the running rollout."""
        started = time.perf_counter()
        with self._lock:
            if self._rolling:
                self._pending.append((blob, version))
                return 0.0
            self._load(blob, version)
        return time.perf_counter() - started

    def _take_pending(self) -> float:
        started = time.perf_counter()
        with self._lock:
            while self._pending:
                self._load(*self._pending.pop(0))
        return time.perf_counter() - started

    def _load(self, blob: bytes, version: int) -> None:
        state = self.receiver.receive(blob)
        self.worker.backend.load_state_dict(state, version)


class _LearnerActor:
    def __init__(
        self, model_path: str, config: TrainConfig, threads: int, device: str, storage_options: dict[str, Any]
    ) -> None:
        from workers.rl.learner import Learner

        self.learner = Learner(model_path, config, threads=threads, device=device, storage_options=storage_options)

    def ready(self) -> bool:
        return True

    def placement(self) -> list[dict[str, Any]]:
        from workers.rl.learner_group import placement_of

        return [placement_of("learner")]

    def state(self) -> tuple[int, int]:
        return self.learner.step, self.learner.version

    def train_step(self, samples: list[Sample]) -> dict[str, float]:
        return self.learner.train_step(samples)

    def weight_update(self) -> tuple[bytes | None, dict[str, float], int]:
        blob, stats = self.learner.weight_update()
        return blob, stats, self.learner.version

    def checkpoint(self, data_position: int) -> bytes:
        return self.learner.checkpoint_bytes(data_position=data_position)

    def load_checkpoint(self, blob: bytes) -> dict[str, Any]:
        payload = self.learner.load_checkpoint(blob)
        return {"step": payload["step"], "version": payload["version"]}

    def load_sharded(self, uri: str, storage_options: dict[str, Any]) -> dict[str, Any]:
        return self.learner.load_sharded(uri, storage_options)


class _SingleLearner:
    """One learner actor behind the interface of `workers.rl.learner_group.LearnerGroup`."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def ready(self) -> list[Any]:
        return [self.actor.ready.remote()]

    def start(self) -> list[dict[str, Any]]:
        placement: list[dict[str, Any]] = ray.get(self.actor.placement.remote())
        return placement

    def train_step(self, samples: list[Sample]) -> dict[str, float]:
        metrics: dict[str, float] = ray.get(self.actor.train_step.remote(samples))
        return metrics

    def weight_update(self) -> tuple[bytes | None, dict[str, float], int]:
        return ray.get(self.actor.weight_update.remote())  # type: ignore[no-any-return]

    def checkpoint_bytes(self, data_position: int) -> bytes:
        return ray.get(self.actor.checkpoint.remote(data_position))  # type: ignore[no-any-return]

    def load_checkpoint(self, blob: bytes) -> dict[str, Any]:
        return ray.get(self.actor.load_checkpoint.remote(blob))  # type: ignore[no-any-return]

    def load_sharded(self, uri: str, storage_options: dict[str, Any]) -> dict[str, Any]:
        return ray.get(self.actor.load_sharded.remote(uri, storage_options))  # type: ignore[no-any-return]

    def shutdown(self) -> None:
        ray.kill(self.actor)


def _wait_for_resources(pending: list[Any], reporter: Reporter, plan: ResourcePlan) -> None:
    """Actors whose resources the cluster cannot give yet stay pending: say so on the run's page while waiting."""
    started = time.monotonic()
    reported = False
    while pending:
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=RESOURCE_WAIT_REPORT_SECONDS)
        if pending:
            free = ray.available_resources()  # type: ignore[no-untyped-call]
            message = (
                f"waiting for resources: this run asks for {plan.need_text()} ({describe(plan.total())} in all); "
                f"the cluster has {describe({k: free.get(k, 0.0) for k in plan.total()})} free (another run or "
                f"another user of the cluster may hold them); waited {time.monotonic() - started:.0f}s"
            )
            reporter.log(message)
            reporter.summary({"waiting_for_resources": message})
            reported = True
    if reported:
        reporter.summary({"waiting_for_resources": None})
        reporter.log("resources granted; starting")


TOGGLE_BUDGETS_FILE = "toggle-budgets.json"


def _toggle_budgets(
    spec: TrainSpec, rows: list[dict[str, Any]], rollouts: list[Any], reporter: Reporter
) -> dict[str, float]:
    """K5's budgets, computed once and stored beside the run's outputs (a resumed run reads them back). With
    `budget_from="prepass"` every task is rolled out once (`group_size` samples) with the initial policy now; with
    "first_rollout" the budgets fill in as tasks are first rolled out (`_toggled`)."""
    from workers.rl.toggle import task_budgets

    config = spec.config
    assert config.toggle is not None
    uri = f"{spec.output_prefix}/{TOGGLE_BUDGETS_FILE}"
    try:
        stored = json.loads(read_bytes(uri, spec.storage_options))
        reporter.log(f"toggle: {len(stored)} task budgets read back from {uri}")
        return {str(k): float(v) for k, v in stored.items()}
    except (OSError, ValueError):
        pass
    if config.toggle.budget_from != "prepass":
        return {}
    reporter.log(f"toggle: rolling out {len(rows)} tasks once to fix their length budgets (K5)")
    futures = [
        worker.rollout.remote(rows[i :: len(rollouts)], config.group_size, config.seed + 7_919, f"budget-w{i}-")
        for i, worker in enumerate(rollouts)
        if rows[i :: len(rollouts)]
    ]
    samples = [s for result in ray.get(futures) for s in result.samples]
    budgets = task_budgets(samples, rho=config.toggle.rho, correct_at=config.toggle.correct_at)
    write_bytes(uri, json.dumps(budgets).encode(), spec.storage_options)
    reporter.log(f"toggle: budgets for {len(budgets)} of {len(rows)} tasks (the others had no correct sample)")
    return budgets


def _toggled(
    batch: list[Sample], config: TrainConfig, step: int, budgets: dict[str, float]
) -> tuple[list[Sample], dict[str, float]]:
    """The batch with K4's rewards for `step` (copies: the rolled-out samples keep their task reward)."""
    import dataclasses

    from workers.rl.toggle import apply_toggle, task_budgets

    toggle = config.toggle
    assert toggle is not None
    if toggle.budget_from == "first_rollout":
        fresh = [s for s in batch if s.task_id not in budgets]
        for task, budget in task_budgets(fresh, rho=toggle.rho, correct_at=toggle.correct_at).items():
            budgets.setdefault(task, budget)
    rewards, metrics = apply_toggle(batch, config.group_size, step=step, config=toggle, budgets=budgets)
    metrics["toggle/task_reward_mean"] = sum(s.reward for s in batch) / max(len(batch), 1)
    return [dataclasses.replace(s, reward=r) for s, r in zip(batch, rewards, strict=True)], metrics


def _trajectory_summary(sample: Sample, step: int) -> dict[str, Any]:
    return {
        "trajectory_id": sample.trajectory["id"],
        "task_id": sample.task_id,
        "step": step,
        "reward": sample.reward,
        "terms": sample.terms,
        "num_turns": sample.num_turns,
        "completion_tokens": sample.sampled_tokens,
        "error": sample.error,
    }


def _learner(
    model_path: str, config: TrainConfig, plan: ResourcePlan, group: PlacementGroup, opts: dict[str, Any]
) -> Any:
    """One learner actor (strategy single) or a group of ranks (ddp, fsdp2), rank i in bundle i of `group`; `opts`
    (storage options) read `config.checkpoint_uri`, the policy a run from another run's checkpoint starts from."""
    device = "cuda" if plan.rank_gpus > 0 else "cpu"
    if config.learner.strategy == "single":
        actor = (
            ray.remote(_LearnerActor)
            .options(**ray_options(plan.rank_claim(0)), scheduling_strategy=_in_bundle(group, 0))
            .remote(model_path, config, plan.rank_threads(), device, opts)
        )
        return _SingleLearner(actor)
    from workers.rl.learner_group import LearnerGroup

    claims = [plan.rank_claim(rank) for rank in range(plan.ranks)]
    return LearnerGroup(
        model_path, config, plan.rank_threads(), group=group, claims=claims, device=device, storage_options=opts
    )


def _in_bundle(group: PlacementGroup, index: int) -> PlacementGroupSchedulingStrategy:
    return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)


def _engines(model_path: str, spec: TrainSpec, plan: ResourcePlan, group: PlacementGroup) -> list[Any]:
    """The rollout engines: in split, actors with their own resources anywhere on the cluster; in colocated, in
    the rank bundles (engine j in bundle j mod ranks) with an equal share of it."""
    cls: Any = ray.remote(_RolloutActor)
    engines = []
    for index in range(plan.engines):
        options = ray_options(plan.engine_claim(index))
        if spec.config.partial_rollout:
            options["max_concurrency"] = 2  # `apply` queues weights while `rollout` runs (_RolloutActor.apply)
        if plan.placement == "colocated":
            options["scheduling_strategy"] = _in_bundle(group, plan.bundle_of_engine(index))
        engines.append(
            cls.options(**options).remote(
                model_path, spec.config, spec.reward, plan.engine_threads(), spec.storage_options, index
            )
        )
    return engines


def run(spec: TrainSpec) -> dict[str, Any]:
    from workers.envs.registry import get_environment
    from workers.models.registry import resolve_base_model

    config = spec.config
    opts = spec.storage_options
    reward_spec = validate_reward_spec(spec.reward)
    with reporter_for(spec) as reporter:
        env_cls = get_environment(config.environment)
        raw = read_bytes(spec.input_uri, opts)
        rows = [json.loads(line) for line in raw.split(b"\n") if line.strip()][: spec.max_rows]
        if spec.exclude_task_ids:
            excluded = set(spec.exclude_task_ids)
            kept = [row for row in rows if str(row.get("id")) not in excluded]
            reporter.log(f"{len(rows) - len(kept)} excluded task(s) left out of training")
            rows = kept
        task_ids = [env_cls.validate_task_row(row, index=index).id for index, row in enumerate(rows, start=1)]
        model_path = str(resolve_base_model(config.base_model))
        settings = settings_for(config)  # the algorithm's defaults merged with the run's overrides
        algorithm = config.algorithm + (
            f" (the default of environment {config.algorithm_default_of})" if config.algorithm_default_of else ""
        )
        reporter.log(f"{len(rows)} tasks, base model {config.base_model}, {algorithm}, mode {config.mode}")
        reporter.log(
            "effective settings: "
            + ", ".join(f"{row.name}={row.value}" for row in settings.rows)
            + "".join(f"; note: {note}" for note in settings.notes)
        )

        ray.init(ignore_reinit_error=True, log_to_driver=False)
        plan = plan_resources(config)
        workers = plan.engines
        group = placement_group(plan.bundles(), strategy="PACK")
        learner = _learner(model_path, config, plan, group, opts)
        if config.checkpoint_uri:
            reporter.log(
                f"starting from checkpoint {config.checkpoint_uri} (its policy, LoRA merged, on {config.base_model})"
            )
        rollouts = _engines(model_path, spec, plan, group)
        _wait_for_resources([group.ready(), *learner.ready(), *[r.ready.remote() for r in rollouts]], reporter, plan)
        placement = learner.start() + ray.get([r.placement.remote() for r in rollouts])
        reporter.summary({"placement": placement, "resources": plan.summary()})
        nodes = sorted({str(p["node_ip"]) for p in placement})
        reporter.log(
            f"placement {plan.placement}: learner {config.learner.strategy} on {plan.ranks} rank(s), "
            f"{plan.engines} engine(s), on node(s) {', '.join(nodes)} ({plan.need_text()})"
        )
        sleeps = plan.placement == "colocated"

        start_step = 0
        if spec.resume_from:
            if is_sharded_checkpoint(spec.resume_from):
                state = learner.load_sharded(spec.resume_from, opts)
            else:
                state = learner.load_checkpoint(read_bytes(spec.resume_from, opts))
            start_step = int(state["step"])
            reporter.log(f"resumed from {spec.resume_from} at step {start_step} (policy version {state['version']})")
        upsample = config.upsample_hard
        upsampler: HardUpsampler | Curriculum | None = None
        if config.curriculum.by != "off":
            upsampler = Curriculum.from_rows(rows, config.curriculum, config.steps, config.seed)
            reporter.log(
                f"curriculum by hops: {sum(upsampler.easy)} easy and {len(rows) - sum(upsampler.easy)} hard tasks, "
                f"easy-skewed until step {upsampler.switch_step}"
            )
        elif upsample.by != "off":
            upsampler = HardUpsampler(
                task_ids, by=upsample.by, strength=upsample.strength, max_weight=upsample.max_weight, seed=config.seed
            )
            if spec.resume_from:
                try:
                    upsampler.load(json.loads(read_bytes(spec.resume_from + UPSAMPLE_STATE_SUFFIX, opts)))
                    reporter.log(f"upsample_hard: the needs of {len(upsampler.needs.counts)} tasks restored")
                except (OSError, ValueError) as exc:
                    reporter.log(f"upsample_hard: no needs stored beside the checkpoint ({exc}); weights start at 1")
        reporter.progress(start_step, config.steps)
        blob, stats, version = learner.weight_update()
        blob_ref = ray.put(blob)
        ray.get([r.apply.remote(blob_ref, version) for r in rollouts])

        per_step = config.prompts_per_step
        shares = [per_step // workers + (1 if i < per_step % workers else 0) for i in range(workers)]
        budgets = _toggle_budgets(spec, rows, rollouts, reporter) if config.toggle is not None else {}

        def f_beta(step: int) -> float | None:
            return annealed_beta(config, step, len(rows))

        orders: dict[int, list[int]] = {}
        drawn_weights: dict[int, list[float]] = {}

        def step_order(step: int) -> list[int]:
            """`step`'s prompts: the data order, or the upsampler's weighted draw (drawn once per step, so a
            regenerated rollout and dynamic sampling see the same rows)."""
            if step not in orders:
                orders[step], drawn_weights[step] = step_prompts(len(rows), config.seed, step, per_step, upsampler)
            return orders[step]

        def launch(step: int, order: list[int] | None = None, round_: int = 0) -> list[Any]:
            """Rollouts of `step`'s prompts (`step_order`), or of `order` for refill round `round_` (> 0)."""
            order = step_order(step) if order is None else order
            futures: list[Any] = []
            at = 0
            for worker, share in zip(rollouts, shares, strict=True):
                if share:
                    chunk = [rows[i] for i in order[at : at + share]]
                    futures.append(
                        worker.rollout.remote(
                            chunk,
                            config.group_size,
                            config.seed * 100_003 + step + 1_000_003 * round_,
                            f"s{step + 1}-{f'r{round_}-' if round_ else ''}w{len(futures)}-",
                            f_beta(step),
                            step,
                        )
                    )
                    at += share
            return futures

        def refill(step: int, first: list[RolloutResult]) -> tuple[list[RolloutResult], FilledBatch, float]:
            """DAPO's dynamic sampling (P3, `workers.rl.sampling`): keep the groups with signal, generate more
            rounds from fresh prompts until the batch has `prompts_per_step` of them or
            `dynamic_sampling_max_rounds` rounds ran. Returns every round's results, the filled batch and the
            rounds' generation seconds (a round's workers run in parallel, rounds one after the other)."""
            results = list(first)
            seconds = [max(r.generation_seconds for r in first)]

            row_weights = upsampler.weights() if upsampler is not None else None

            def generate(order: list[int], round_: int) -> list[Sample]:
                if row_weights is not None:
                    drawn_weights.setdefault(step, []).extend(row_weights[i] for i in order)
                extra: list[RolloutResult] = ray.get(launch(step, order, round_))
                results.extend(extra)
                seconds.append(max(r.generation_seconds for r in extra))
                return [s for r in extra for s in r.samples]

            filled = dynamic_sampling_batch(
                [s for r in first for s in r.samples],
                generate,
                num_rows=len(rows),
                seed=config.seed,
                step=step,
                first_rows=step_order(step),
                target_groups=per_step,
                group_size=config.group_size,
                max_rounds=settings.dynamic_sampling_max_rounds,
                weights=row_weights,
            )
            if filled.short_groups:
                reporter.log(
                    f"step {step + 1}: dynamic sampling kept {per_step - filled.short_groups} of {per_step} groups "
                    f"after {filled.rounds} rounds (dynamic_sampling_max_rounds); training on a smaller batch"
                )
            return results, filled, sum(seconds)

        pending = launch(start_step) if start_step < config.steps else []
        last_metrics: dict[str, float] = {}
        flag_counts: dict[str, int] = {}
        step = start_step
        step_started = time.perf_counter()
        for step in range(start_step, config.steps):
            # Each phase is reported as it starts: the stall watchdog applies its limit (config.stall_limits).
            reporter.progress(step, config.steps, phase="generation")
            wait_started = time.perf_counter()
            results: list[RolloutResult] = ray.get(pending)
            wait_seconds = time.perf_counter() - wait_started
            samples = [s for r in results for s in r.samples]
            newest_lag = max(version - r.newest_version for r in results)
            if newest_lag > config.max_staleness:
                # Even the newest tokens are too old to train on (only if an update overtook a queued rollout):
                # regenerate. Older tokens of partial rollouts leave the loss one by one (bound_staleness below).
                reporter.log(f"step {step}: samples {newest_lag} versions old > max_staleness; regenerating")
                pending = launch(step)
                results = ray.get(pending)
                samples = [s for r in results for s in r.samples]
            batch, filled = samples, None
            generation_seconds = max(r.generation_seconds for r in results)
            if settings.dynamic_sampling:
                results, filled, generation_seconds = refill(step, results)
                batch, samples = filled.samples, filled.generated
            orders.pop(step, None)
            sampling_metrics: dict[str, float] = {}
            if upsampler is not None:
                # The step's draws are reported with the weights they had; its episodes then update the needs
                # before the next step's prompts are drawn (in async mode too: the draw comes just below).
                sampling_metrics = upsampler.metrics(drawn_weights.pop(step, []))
                upsampler.record(samples)
            if config.mode == "async" and step + 1 < config.steps:
                pending = launch(step + 1)  # generated with the current weights while this step trains
            toggle_metrics: dict[str, float] = {}
            if config.toggle is not None:
                batch, toggle_metrics = _toggled(batch, config, step, budgets)
            version_metrics = bound_staleness(batch, version, config.max_staleness)
            staleness = version_metrics["versions/max_lag"]
            reporter.progress(step, config.steps, phase="training")
            slept = time.perf_counter()
            released = sum(ray.get([r.sleep.remote() for r in rollouts])) if sleeps else 0
            metrics = learner.train_step(batch)
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
            new_blob, sync, new_version = learner.weight_update()
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
                version = new_version
            if config.mode == "sync" and step + 1 < config.steps:
                pending = launch(step + 1)
            sampled = sum(r.sampled_tokens for r in results)
            metrics.update(sync)
            metrics.update(version_metrics)
            metrics.update(sampling_metrics)
            metrics.update({f"env/{k}": v for k, v in mean_metrics(s.episode_metrics for s in samples).items()})
            metrics.update(flag_metrics([s.findings for s in samples], config.detectors))
            beta = f_beta(step)
            if beta is not None:
                metrics["f_beta"] = beta
            metrics.update(annealed_weights(reward_spec, step))
            metrics.update(
                {
                    "staleness": float(staleness),
                    "generation_seconds": generation_seconds,
                    "rollout_wait_seconds": wait_seconds,
                    # Learner to engines: the update's encode, the object store and the slowest engine's load
                    # (with partial rollouts the loads happen between turns: engine_weight_apply_seconds).
                    "weight_sync_seconds": sync_seconds,
                    "engine_weight_apply_seconds": max(r.weight_apply_seconds for r in results),
                    "step_seconds": time.perf_counter() - step_started,  # wall time since the last step's end
                    "tokens_per_second": sampled / max(generation_seconds + metrics["train_seconds"], 1e-9),
                    "sampled_tokens": float(sampled),
                    "policy_version": float(version),
                }
            )
            reporter.metric(step + 1, metrics)
            step_started = time.perf_counter()
            hist = histogram([s.reward for s in samples])  # the run page's reward distribution, latest step
            reporter.histogram("reward", hist["edges"], hist["counts"])
            keep = samples[: config.trajectory_samples_per_step]
            stored_uri = f"{spec.output_prefix}/trajectories/step-{step + 1:06d}.jsonl"
            if keep:
                payload = "".join(json.dumps(s.trajectory) + "\n" for s in keep).encode()
                write_bytes(stored_uri, payload, opts)
            for index, sample in enumerate(samples):
                # Full records are kept for the first few of each step; the trajectory page opens them.
                where = stored_uri if index < len(keep) else ""
                reporter.trajectory(**_trajectory_summary(sample, step + 1), storage_uri=where)
                report_flags(reporter, sample.findings, step=step + 1)  # after its trajectory, so ingest links them
                for finding in sample.findings:
                    flag_counts[finding.detector] = flag_counts.get(finding.detector, 0) + 1
            reporter.progress(step + 1, config.steps)
            reporter.log(
                f"step {step + 1}/{config.steps}: reward {metrics['reward_mean']:.3f} loss {metrics['loss']:.4f} "
                f"dropped groups {metrics['dropped_groups']:.0f} flagged {metrics.get('flags/rate', 0.0):.0%} "
                f"({generation_seconds:.1f}s gen, {metrics['train_seconds']:.1f}s train)"
            )
            last_metrics = metrics
            if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps:
                sharded = config.learner.strategy != "single"
                uri = f"{spec.output_prefix}/checkpoints/step-{step + 1:06d}" + (SHARDED_SUFFIX if sharded else ".pt")
                if config.toggle is not None and budgets:  # first_rollout budgets grow: keep them for a resume
                    write_bytes(f"{spec.output_prefix}/{TOGGLE_BUDGETS_FILE}", json.dumps(budgets).encode(), opts)
                # Before the checkpoint: a checkpoint with its checksum is complete.
                if isinstance(upsampler, HardUpsampler):
                    write_bytes(uri + UPSAMPLE_STATE_SUFFIX, json.dumps(upsampler.state()).encode(), opts)
                if sharded:  # every rank writes its shards, then the manifest of checksums goes last
                    learner.save_sharded(uri, (step + 1) * per_step, opts)
                    size = write_sharded_checksum(uri, opts)
                else:
                    blob = learner.checkpoint_bytes((step + 1) * per_step)
                    write_checkpoint(uri, blob, opts)
                    size = len(blob)
                reporter.checkpoint(
                    step + 1, uri, {k: last_metrics[k] for k in ("reward_mean", "loss") if k in last_metrics}
                )
                reporter.log(f"checkpoint {uri} ({size / 1e6:.1f} MB)")
        summary = {
            "steps": config.steps,
            "start_step": start_step,
            "final_reward_mean": last_metrics.get("reward_mean"),
            "policy_version": version,
            "flag_counts": flag_counts,
        }
        reporter.summary(summary)
        learner.shutdown()  # the run's actors give their resources back now, not when the driver exits
        for worker in rollouts:
            ray.kill(worker)
        remove_placement_group(group)
    return summary


def main() -> None:
    configure_logging()
    run(load_spec(TrainSpec))


if __name__ == "__main__":
    main()
