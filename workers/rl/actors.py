"""The Ray actors of a training run (`workers.rl.trainer.Trainer`): rollout engines, the learner (one actor, or a
group of ranks: `workers.rl.learner_group`), where each goes in the run's placement group, and the wait for
resources the cluster cannot give yet."""

from __future__ import annotations

import threading
import time
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from workers.envs.registry import configure_storage
from workers.models import make_backend
from workers.reporting import Reporter
from workers.rl.config import TrainConfig
from workers.rl.learner import Learner
from workers.rl.learner_group import LearnerGroup, placement_of
from workers.rl.placement import ResourcePlan, describe, plan_resources, ray_options
from workers.rl.rollout import RolloutResult, RolloutWorker, Sample
from workers.rl.weightsync import WeightSyncReceiver

RESOURCE_WAIT_REPORT_SECONDS = 10.0


class RolloutActor:
    """One rollout engine: a `RolloutWorker` on its backend, taking weight updates (queued between turns with
    partial rollouts)."""

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

        configure_storage(storage_options or {})  # search loads its index, coding_agent its snapshots with them

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


class LearnerActor:
    """The learner of a single-process run (strategy single), as a Ray actor."""

    def __init__(
        self, model_path: str, config: TrainConfig, threads: int, device: str, storage_options: dict[str, Any]
    ) -> None:
        self.learner = Learner(model_path, config, threads=threads, device=device, storage_options=storage_options)

    def ready(self) -> bool:
        return True

    def placement(self) -> list[dict[str, Any]]:
        return [placement_of("learner")]

    def state(self) -> tuple[int, int]:
        return self.learner.step, self.learner.version

    def train_step(self, samples: list[Sample]) -> dict[str, float]:
        return self.learner.train_step(samples)

    def scored_logprobs(self) -> dict[int, list[float]]:
        return self.learner.scored_logprobs()

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


class SingleLearner:
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

    def scored_logprobs(self) -> dict[int, list[float]]:
        return ray.get(self.actor.scored_logprobs.remote())  # type: ignore[no-any-return]

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


def wait_for_resources(pending: list[Any], reporter: Reporter, plan: ResourcePlan) -> None:
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


def learner_for(
    model_path: str, config: TrainConfig, plan: ResourcePlan, group: PlacementGroup, opts: dict[str, Any]
) -> Any:
    """One learner actor (strategy single) or a group of ranks (ddp, fsdp2), rank i in bundle i of `group`; `opts`
    (storage options) read `config.checkpoint_uri`, the policy a run from another run's checkpoint starts from."""
    device = "cuda" if plan.rank_gpus > 0 else "cpu"
    if config.learner.strategy == "single":
        actor = (
            ray.remote(LearnerActor)
            .options(**ray_options(plan.rank_claim(0)), scheduling_strategy=in_bundle(group, 0))
            .remote(model_path, config, plan.rank_threads(), device, opts)
        )
        return SingleLearner(actor)

    claims = [plan.rank_claim(rank) for rank in range(plan.ranks)]
    return LearnerGroup(
        model_path, config, plan.rank_threads(), group=group, claims=claims, device=device, storage_options=opts
    )


def in_bundle(group: PlacementGroup, index: int) -> PlacementGroupSchedulingStrategy:
    return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)


def engines_for(
    model_path: str,
    config: TrainConfig,
    reward: dict[str, Any],
    storage_options: dict[str, Any],
    plan: ResourcePlan,
    group: PlacementGroup,
) -> list[Any]:
    """The rollout engines: in split, actors with their own resources anywhere on the cluster; in colocated, in
    the rank bundles (engine j in bundle j mod ranks) with an equal share of it."""
    cls: Any = ray.remote(RolloutActor)
    engines = []
    for index in range(plan.engines):
        options = ray_options(plan.engine_claim(index))
        if config.partial_rollout:
            options["max_concurrency"] = 2  # `apply` queues weights while `rollout` runs (RolloutActor.apply)
        if plan.placement == "colocated":
            options["scheduling_strategy"] = in_bundle(group, plan.bundle_of_engine(index))
        engines.append(
            cls.options(**options).remote(model_path, config, reward, plan.engine_threads(), storage_options, index)
        )
    return engines
