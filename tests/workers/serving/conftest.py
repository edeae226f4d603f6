"""Fixtures for serving tests: one local Ray and one serving run (tiny model, one arm on the base model) shared by
the module's tests, with its stub control plane. Reuse them from other test packages by importing
`tests.workers.serving.helpers` (StubControlPlane, ServingHarness) and the fixtures below via `pytest_plugins`
or by copying the three lines of `serving`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.workers.serving.helpers import ServingHarness, StubControlPlane


@pytest.fixture(scope="session")
def ray_local() -> Iterator[None]:
    """A local Ray for this test session (4 logical CPUs: the router, an arm replica or two, and the actors)."""
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, namespace="crucible-tests")
    yield
    if started:
        from ray import serve

        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="session")
def plane() -> Iterator[StubControlPlane]:
    with StubControlPlane() as stub:
        yield stub


@pytest.fixture(scope="session")
def serving(ray_local: None, plane: StubControlPlane) -> Iterator[ServingHarness]:
    """A serving run with one arm "a" on the base model (policy version 0), ready for requests."""
    with ServingHarness(plane) as harness:
        harness.set_arms([{"name": "a", "weight": 1.0, "deployment_id": 1, "checkpoint_id": None}])
        yield harness
