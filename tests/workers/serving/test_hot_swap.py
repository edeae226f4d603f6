"""Hot swap: a new checkpoint reaches the running replicas as a weight-sync delta, without a restart; a request in
flight during the swap finishes on the version it started on; every response names the version that produced it."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.workers.serving.helpers import MODEL_NAME, ServingHarness, StubControlPlane, write_checkpoint

HI = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    folder: Path = tmp_path_factory.mktemp("checkpoints")
    return [write_checkpoint(folder / f"ckpt-{seed}.pt", seed=seed) for seed in (1, 2)]


def _arm(checkpoint_id: int | None, uri: str | None, name: str = "a", weight: float = 1.0) -> dict[str, Any]:
    return {
        "name": name,
        "weight": weight,
        "deployment_id": checkpoint_id,
        "checkpoint_id": checkpoint_id,
        "checkpoint_uri": uri,
    }


def _version(serving: ServingHarness, session: str = "swap-probe") -> tuple[int, str]:
    raw = serving.openai_client().chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=HI, max_tokens=3, extra_headers={"X-Session-Id": session}
    )
    completion = raw.parse()
    return int(completion.model_extra["policy_version"]), raw.headers["X-Policy-Version"]


def test_a_new_checkpoint_reaches_the_replica_as_a_delta_without_a_restart(
    serving: ServingHarness, plane: StubControlPlane, checkpoints: list[str]
) -> None:
    before = serving.arm_status()
    assert serving.set_arms([_arm(7, checkpoints[0])])
    after = serving.arm_status()
    assert after["replica_id"] == before["replica_id"]  # the same replica process, not a new one
    assert after["policy_version"] == 7 and after["swaps"] == before["swaps"] + 1
    assert _version(serving) == (7, "7")

    figures = serving.controller.arms["a"].history[-1]
    assert figures["serve/swap_delta"] == 1.0 and figures["serve/policy_version/a"] == 7.0
    assert 0 < figures["serve/swap_bytes"] < figures["serve/swap_full_bytes"]
    assert after["last_update"]["bytes"] == figures["serve/swap_bytes"]  # the replica applied the delta itself
    arm = serving.store_status()["arms"]["a"]
    assert arm["policy_version"] == 7 and arm["full"][0] == arm["sync_version"]  # a full copy for late joiners

    swap_step = serving.controller.swaps
    plane.wait_for(lambda: any(m["step"] == swap_step and "serve/swap_seconds" in m["values"] for m in plane.metrics()))
    [reported] = [
        m["values"] for m in plane.metrics() if m["step"] == swap_step and "serve/swap_seconds" in m["values"]
    ]
    assert reported["serve/swap_bytes"] == figures["serve/swap_bytes"] and reported["serve/policy_version/a"] == 7.0


def test_a_request_in_flight_during_a_swap_finishes_on_the_version_it_started_on(
    serving: ServingHarness, checkpoints: list[str]
) -> None:
    client = serving.openai_client()
    for attempt, checkpoint_id in enumerate((8, 9, 10)):
        start_version = serving.arm_status()["policy_version"]
        result: dict[str, Any] = {}

        def long_request(attempt: int = attempt, result: dict[str, Any] = result) -> None:
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL_NAME,
                messages=HI,
                max_tokens=serving.spec.max_new_tokens,
                temperature=1.0,
                seed=attempt,
                extra_headers={"X-Session-Id": "in-flight"},
            )
            result["completion"] = raw.parse()
            result["header"] = raw.headers["X-Policy-Version"]

        thread = threading.Thread(target=long_request)
        thread.start()
        while serving.arm_status()["in_flight"] == 0:
            assert thread.is_alive(), "the long request ended before it was seen in flight"
        serving.set_arms([_arm(checkpoint_id, checkpoints[attempt % 2])])  # returns once the replica holds it
        thread.join(timeout=120)
        update = serving.arm_status()["last_update"]
        assert update["policy_version"] == checkpoint_id
        if update["lock_wait_seconds"] < 0.005:
            continue  # the request finished before the new weights were ready: no overlap; try a longer one
        completion = result["completion"]
        assert completion.model_extra["policy_version"] == start_version
        assert result["header"] == str(start_version)
        assert completion.system_fingerprint == f"crucible-v{start_version}"
        assert _version(serving) == (checkpoint_id, str(checkpoint_id))
        return
    pytest.fail("no swap overlapped a request in flight in three attempts")


def test_going_back_to_the_base_model_is_a_swap_too(serving: ServingHarness) -> None:
    replica = serving.arm_status()["replica_id"]
    serving.set_arms([_arm(None, None)])
    assert _version(serving) == (0, "0")
    assert serving.arm_status()["replica_id"] == replica
    assert serving.controller.arms["a"].history[-1]["serve/swap_delta"] == 1.0


@pytest.mark.slow
def test_a_second_arm_splits_sessions_by_their_hash_and_goes_away_cleanly(
    serving: ServingHarness, checkpoints: list[str]
) -> None:
    serving.set_arms([_arm(None, None), _arm(7, checkpoints[0], name="b", weight=1.0)])
    versions = {f"ab-{i}": _version(serving, f"ab-{i}")[0] for i in range(16)}
    assert set(versions.values()) == {0, 7}  # these 16 session ids hash to both arms (deterministic)
    assert all(_version(serving, session)[0] == version for session, version in list(versions.items())[:4])
    assert serving.controller.arms["b"].history[0]["serve/swap_delta"] == 0.0  # a new arm starts from a full sync
    serving.set_arms([_arm(None, None)])
    assert {_version(serving, session)[0] for session in versions} == {0}
    assert "b" not in serving.store_status()["arms"]


@pytest.mark.slow
def test_a_replica_serve_restarts_catches_up_on_its_own(serving: ServingHarness, checkpoints: list[str]) -> None:
    import ray

    serving.set_arms([_arm(7, checkpoints[0])])
    before = serving.arm_status()["replica_id"]
    [name] = [
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["namespace"] == "serve" and serving.controller.names.arm_app("a") in actor["name"]
    ]
    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
    deadline = time.monotonic() + 120
    while True:  # Serve starts a new replica; it takes the full weights and the deltas from the store
        try:
            status = serving.arm_status()
            if status["replica_id"] != before and status["policy_version"] == 7:
                break
        except Exception:
            pass
        assert time.monotonic() < deadline, "the restarted replica never caught up"
        time.sleep(0.5)
    assert _version(serving) == (7, "7")
    serving.set_arms([_arm(None, None)])
