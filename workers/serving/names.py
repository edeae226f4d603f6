"""Where a serving run's pieces live on Ray: the Serve namespace, the deployments' and applications' names, and
its two named actors (the weight store and the session recorder). Shared by the router (`app`), the arms (`arm`)
and the controller."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray

NAMESPACE = "crucible-serve"
ARM_DEPLOYMENT = "arm"
ROUTER_DEPLOYMENT = "router"


@dataclass(frozen=True)
class Names:
    """Where a serving run's pieces live: its Serve applications and its two named actors."""

    run_id: int

    @property
    def router_app(self) -> str:
        return f"crucible-serve-{self.run_id}"

    def arm_app(self, arm: str) -> str:
        return f"crucible-serve-{self.run_id}-arm-{arm}"

    @property
    def store(self) -> str:
        return f"crucible-serve-{self.run_id}-weights"

    @property
    def recorder(self) -> str:
        return f"crucible-serve-{self.run_id}-recorder"


def named_actor(name: str) -> Any:
    """A serving run's named actor (its weight store or its recorder) in the Serve namespace."""
    return ray.get_actor(name, namespace=NAMESPACE)
