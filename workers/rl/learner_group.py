"""The learner as a group of Ray actors, one per rank, in one placement group, forming one torch.distributed
process group (gloo on CPU, NCCL on GPU).

Why our own actors and not Ray Train's `TorchTrainer`: the trainer job drives the learner step by step between
rollouts (train, gather the weights, push them to the engines, checkpoint), while `TorchTrainer.fit()` runs one
training function to its end and owns the loop. Actors keep the job's loop, and they are what OpenRLHF and verl
use for the same reason. The job's placement group has a bundle per rank (`PACK`, so they share a node where
they fit; `workers.rl.placement`); torch.distributed does every collective.

Every method here is called on all ranks at once (the ranks meet in collectives inside it) and returns rank 0's
answer: the step's metrics are already reduced over the ranks, the weights gathered to rank 0.
"""

from __future__ import annotations

import os
import time
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from workers.rl.config import TrainConfig
from workers.rl.distributed import free_port, init_process_group
from workers.rl.learner import Learner
from workers.rl.placement import ray_options, readable

__all__ = ["LearnerGroup", "RankActor", "placement_of"]


def placement_of(role: str, rank: int = 0) -> dict[str, Any]:
    """Where the calling Ray actor runs: its role, rank, node, process, resources and devices."""
    context = ray.get_runtime_context()
    assigned = context.get_assigned_resources()  # type: ignore[no-untyped-call]
    return {
        "role": role,
        "rank": rank,
        "node_id": context.get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
        "pid": os.getpid(),
        "resources": readable({k: v for k, v in assigned.items() if v}),
        "devices": [str(d) for d in context.get_accelerator_ids().get("GPU", [])] or ["cpu"],
    }


class RankActor:
    """One rank of the learner: joins the process group, then holds a `workers.rl.learner.Learner`."""

    def __init__(
        self,
        model_path: str,
        config: TrainConfig,
        threads: int,
        device: str = "cpu",
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        import torch

        self.model_path, self.config, self.threads, self.device = model_path, config, threads, device
        self.storage_options = storage_options or {}
        torch.set_num_threads(threads)
        self.learner: Any = None

    def ready(self) -> bool:
        return True

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0's address and a free port on its node, where the others meet it."""

        return ray.util.get_node_ip_address(), free_port()  # type: ignore[no-untyped-call]

    def join(self, rank: int, world_size: int, address: str, port: int) -> dict[str, Any]:
        init_process_group(rank, world_size, address, port, device=self.device)
        self.learner = Learner(
            self.model_path, self.config, threads=self.threads, device=self.device, storage_options=self.storage_options
        )
        return placement_of("learner", rank)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        result = getattr(self.learner, method)(*args, **kwargs)
        if method == "load_checkpoint":
            return None  # the payload's tensors stay here; `state` answers step and version
        return result

    def state(self) -> tuple[int, int]:
        return self.learner.step, self.learner.version


class LearnerGroup:
    """`ranks` learner actors, rank i in bundle i of the run's placement group (`workers.rl.placement`); the
    same calls as one learner, made on every rank."""

    def __init__(
        self,
        model_path: str,
        config: TrainConfig,
        threads: int,
        *,
        group: PlacementGroup,
        claims: list[dict[str, float]],
        device: str = "cpu",
        ready_timeout_s: float | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.world_size = config.learner.ranks
        if len(claims) != self.world_size:
            raise ValueError(f"{len(claims)} resource claims for {self.world_size} ranks")
        self.group = group
        actor_cls: Any = ray.remote(RankActor)
        self.actors = [
            actor_cls.options(
                **ray_options(claim),
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i),
            ).remote(model_path, config, threads, device, storage_options)
            for i, claim in enumerate(claims)
        ]
        self.ready_timeout_s = ready_timeout_s
        self.placement: list[dict[str, Any]] = []

    def ready(self) -> Any:
        """A reference that resolves when the ranks' actors are up (for waiting with a progress message)."""
        return [actor.ready.remote() for actor in self.actors]

    def start(self) -> list[dict[str, Any]]:
        """Form the process group and build the learner on every rank; returns where each rank runs."""
        address, port = ray.get(self.actors[0].rendezvous.remote())
        started = time.perf_counter()
        self.placement = ray.get(
            [actor.join.remote(rank, self.world_size, address, port) for rank, actor in enumerate(self.actors)],
            timeout=self.ready_timeout_s,
        )
        for entry in self.placement:
            entry["startup_seconds"] = round(time.perf_counter() - started, 2)
        return self.placement

    def _all(self, method: str, *args: Any, **kwargs: Any) -> Any:
        refs = [ray.put(arg) for arg in args]  # one copy in the object store for every rank
        return ray.get([actor.call.remote(method, *refs, **kwargs) for actor in self.actors])[0]

    def train_step(self, samples: list[Any]) -> dict[str, float]:
        metrics: dict[str, float] = self._all("train_step", samples)
        return metrics

    def scored_logprobs(self) -> dict[int, list[float]]:
        """Every rank's scored samples merged (each rank scored its own share of the batch)."""
        merged: dict[int, list[float]] = {}
        for part in ray.get([actor.call.remote("scored_logprobs") for actor in self.actors]):
            merged.update(part)
        return merged

    def weight_update(self) -> tuple[bytes | None, dict[str, float], int]:
        blob, stats = self._all("weight_update")
        return blob, stats, self.state()[1]

    def state(self) -> tuple[int, int]:
        step, version = ray.get(self.actors[0].state.remote())
        return int(step), int(version)

    def save_sharded(self, uri: str, data_position: int, storage_options: dict[str, Any]) -> None:
        self._all("save_sharded", uri, data_position=data_position, storage_options=storage_options)

    def load_sharded(self, uri: str, storage_options: dict[str, Any]) -> dict[str, Any]:
        extra: dict[str, Any] = self._all("load_sharded", uri, storage_options)
        return extra

    def load_checkpoint(self, blob: bytes) -> dict[str, Any]:
        self._all("load_checkpoint", blob)
        step, version = self.state()
        return {"step": step, "version": version}

    def shutdown(self) -> None:
        """Kill the ranks; the placement group is the job's (its engines may live in it) and it removes it."""
        for actor in self.actors:
            ray.kill(actor)
