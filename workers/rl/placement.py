"""Where a training run's actors go: the learner's ranks and the rollout engines, as Ray resources.

`plan_resources(config)` turns `config.compute` into a `ResourcePlan`, a pure value that the trainer job uses to
place its actors and the control plane uses to queue a run until the cluster can hold it (the same arithmetic on
both sides, so a run is admitted for exactly what it will ask Ray for).

Two placements:
- **split** (OpenRLHF, AReaL): every learner rank has a bundle of its own in the learner's placement group and
  every engine is an actor with its own resources, which Ray may put on any node that has them (a custom resource
  such as `engine_node` steers them to the nodes that carry it). Generation and training can overlap (async).
- **colocated** (verl's hybrid engine): the engines live in the learner ranks' bundles (engine j in bundle
  j mod ranks) and each member of a bundle claims an equal share of it, so they are on the same node and devices.
  They take turns: the engines sleep while the learner trains (`sleep` / `wake` on the backend: vLLM's sleep mode
  on GPU) and take the new weights when they wake. Only in sync mode.

Without `per_rank` / `per_engine` the totals (`cpus`, `gpus`, `memory_gb`) are split evenly: over ranks and
engines when split, over ranks when colocated. torch threads follow the CPUs an actor can use: its own in split,
the whole bundle's in colocated (the members take turns).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from workers.rl.config import TrainConfig
    from workers.rl.config_sections import RoleResources

GB = 1024**3
Placement = Literal["colocated", "split"]


def _role(role: RoleResources) -> dict[str, float]:
    out = {"CPU": float(role.cpus), **{k: float(v) for k, v in role.custom.items()}}
    if role.gpus:
        out["GPU"] = float(role.gpus)
    if role.memory_gb:
        out["memory"] = float(int(role.memory_gb * GB))
    return out


def _share(resources: dict[str, float], parts: int) -> dict[str, float]:
    return {k: (float(int(v / parts)) if k == "memory" else v / parts) for k, v in resources.items()}


def add(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0.0) + v
    return out


def readable(resources: dict[str, float]) -> dict[str, float]:
    """Ray's units for people: memory in GB, the rest as counts (rounded)."""
    return {
        ("memory_gb" if k == "memory" else k): round(v / GB if k == "memory" else v, 3) for k, v in resources.items()
    }


def describe(resources: dict[str, float]) -> str:
    """'4 CPU, 1 GPU, 8 GB memory, 1 engine_node'."""
    parts = []
    for k, v in readable(resources).items():
        parts.append(f"{_memory(v)} memory" if k == "memory_gb" else f"{round(v, 2):g} {k}")
    return ", ".join(parts) or "nothing"


def _memory(gb: float) -> str:
    """'86 MB', '1.5 GB', '64 GB': no fractions of a gigabyte like '0.084 GB'."""
    if 0 < gb < 1:
        return f"{gb * 1024:.0f} MB"
    return f"{gb:.0f} GB" if gb >= 10 else f"{round(gb, 1):g} GB"


@dataclass(frozen=True)
class ResourcePlan:
    placement: Placement
    ranks: int
    engines: int
    rank: dict[str, float]
    """One learner rank's bundle (Ray units: memory in bytes)."""
    engine: dict[str, float]
    """split: one engine's own resources; colocated: empty (engines share the rank bundles)."""

    def bundles(self) -> list[dict[str, float]]:
        """The learner's placement group: one bundle per rank (colocated engines live in them too)."""
        return [dict(self.rank) for _ in range(self.ranks)]

    def every_bundle(self) -> list[dict[str, float]]:
        """Each unit Ray must fit on one node: the rank bundles, and in split each engine's resources."""
        engines = [dict(self.engine) for _ in range(self.engines)] if self.placement == "split" else []
        return self.bundles() + engines

    def total(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for bundle in self.every_bundle():
            out = add(out, bundle)
        return out

    def bundle_of_engine(self, index: int) -> int:
        return index % self.ranks

    def members(self, bundle: int) -> int:
        """Actors sharing rank bundle `bundle`: the rank, and in colocated the engines placed there."""
        if self.placement == "split":
            return 1
        return 1 + sum(1 for j in range(self.engines) if self.bundle_of_engine(j) == bundle)

    def rank_claim(self, rank: int) -> dict[str, float]:
        return _share(self.rank, self.members(rank))

    def engine_claim(self, index: int) -> dict[str, float]:
        if self.placement == "split":
            return dict(self.engine)
        bundle = self.bundle_of_engine(index)
        return _share(self.rank, self.members(bundle))

    @property
    def engine_gpus(self) -> float:
        """GPUs an engine computes on: its own (split) or its bundle's, shared with a learner rank (colocated)."""
        return (self.engine if self.placement == "split" else self.rank).get("GPU", 0.0)

    @property
    def rank_gpus(self) -> float:
        return self.rank.get("GPU", 0.0)

    def rank_threads(self) -> int:
        return max(1, math.floor(self.rank["CPU"]))

    def engine_threads(self) -> int:
        return max(1, math.floor((self.engine if self.placement == "split" else self.rank)["CPU"]))

    def summary(self) -> dict[str, Any]:
        """The run's effective resources, as stored with the run."""
        return {
            "placement": self.placement,
            "ranks": self.ranks,
            "engines": self.engines,
            "per_rank": readable(self.rank),
            "per_engine": readable(self.engine) if self.placement == "split" else "shares the rank bundles",
            "total": readable(self.total()),
        }

    def need_text(self) -> str:
        rank = f"{self.ranks} learner rank(s) x [{describe(self.rank)}]"
        if self.placement == "colocated":
            return f"{rank}, {self.engines} colocated engine(s) sharing them"
        return f"{rank} + {self.engines} engine(s) x [{describe(self.engine)}]"


def plan_resources(config: TrainConfig) -> ResourcePlan:
    compute = config.compute
    placement: Placement = (
        compute.placement if compute.placement != "auto" else ("colocated" if config.mode == "sync" else "split")
    )
    ranks, engines = config.learner.ranks, compute.rollout_workers
    totals: dict[str, float] = {"CPU": compute.cpus, "memory": float(int(compute.memory_gb * GB))}
    if compute.gpus:
        totals["GPU"] = compute.gpus
    if compute.per_rank is not None:
        rank = _role(compute.per_rank)
    else:
        rank = _share(totals, ranks + (engines if placement == "split" else 0))
    engine: dict[str, float] = {}
    if placement == "split":
        engine = _role(compute.per_engine) if compute.per_engine is not None else _share(totals, ranks + engines)
    return ResourcePlan(placement=placement, ranks=ranks, engines=engines, rank=rank, engine=engine)


def ray_options(claim: dict[str, float]) -> dict[str, Any]:
    """`.options(...)` keyword arguments for an actor that claims `claim`."""
    custom = {k: v for k, v in claim.items() if k not in {"CPU", "GPU", "memory"}}
    options: dict[str, Any] = {"num_cpus": claim.get("CPU", 0.0), "num_gpus": claim.get("GPU", 0.0)}
    if claim.get("memory"):
        options["memory"] = int(claim["memory"])
    if custom:
        options["resources"] = custom
    return options


def fits(bundle: dict[str, float], node: dict[str, float]) -> bool:
    return all(node.get(k, 0.0) + 1e-9 >= v for k, v in bundle.items())


def shortfall(plan_bundles: list[dict[str, float]], nodes: list[dict[str, float]]) -> str:
    """Why `plan_bundles` can never be placed on `nodes` (each a node's total resources), or '' if they can:
    a first-fit-decreasing packing, the way Ray places a placement group's bundles."""
    free = [dict(node) for node in nodes]
    order = sorted(plan_bundles, key=lambda b: (b.get("GPU", 0.0), b.get("CPU", 0.0)), reverse=True)
    for bundle in order:
        for node in free:
            if fits(bundle, node):
                for k, v in bundle.items():
                    node[k] -= v
                break
        else:
            largest = max(nodes, key=lambda n: (n.get("GPU", 0.0), n.get("CPU", 0.0)), default={})
            missing = [k for k, v in bundle.items() if largest.get(k, 0.0) + 1e-9 < v]
            if missing:
                name = missing[0]
                has = sum(n.get(name, 0.0) for n in nodes)
                return (
                    f"one actor needs [{describe(bundle)}] on one node; no node has that much {name} "
                    f"(the largest has {describe({name: largest.get(name, 0.0)})}, the cluster "
                    f"{describe({name: has})} in {len(nodes)} node(s))"
                )
            return (
                f"the run needs {len(plan_bundles)} actor bundle(s) [{describe(bundle)}, ...] and the cluster's "
                f"{len(nodes)} node(s) cannot hold them all at once"
            )
    return ""
