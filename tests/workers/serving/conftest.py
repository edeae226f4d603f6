"""Fixtures for serving tests: a local Ray and one serving run (tiny model, one arm "a" on the base model) shared
by this package's tests, with its stub control plane; all three end with the package.

To serve in another package's tests, build the same from `tests.workers.serving.helpers`:

    from tests.workers.serving.helpers import ServingHarness, StubControlPlane

    @pytest.fixture(scope="module")
    def endpoint(ray_session):  # ray.init(...) done by your own fixture
        with StubControlPlane() as plane, ServingHarness(plane, run_id=9100) as serving:
            serving.set_arms([{"name": "a", "weight": 1.0, "checkpoint_id": None}])
            yield serving  # serving.base_url, serving.openai_client(), plane.turns(), serving.set_arms(...)

Use a run id of your own (9001 and 9002 are taken here): it names the run's Serve applications and actors.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.workers.serving.helpers import ServingHarness, StubControlPlane


@pytest.fixture(scope="package")
def ray_local() -> Iterator[None]:
    """A local Ray for this package (4 logical CPUs: the router, an arm replica or two, and the actors)."""
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, namespace="crucible-tests")
    yield
    if started:
        from ray import serve

        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="package")
def plane() -> Iterator[StubControlPlane]:
    with StubControlPlane() as stub:
        yield stub


@pytest.fixture(scope="package")
def serving(ray_local: None, plane: StubControlPlane) -> Iterator[ServingHarness]:
    """A serving run with one arm "a" on the base model (policy version 0), ready for requests."""
    with ServingHarness(plane) as harness:
        harness.set_arms([{"name": "a", "weight": 1.0, "deployment_id": 1, "checkpoint_id": None}])
        yield harness
