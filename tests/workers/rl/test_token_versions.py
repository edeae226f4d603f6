"""Per-token policy versions (issue 23 part 2): a rollout records the version that sampled each token, an engine
with partial rollouts takes weights between the turns of a running episode, and the staleness bound applies token
by token."""

from __future__ import annotations

import threading

import pytest
import torch
from pydantic import ValidationError

from tests.workers.rl.test_mismatch import CharByCharBackend
from workers.envs.registry import arithmetic_tasks
from workers.rl.config import TrainConfig
from workers.rl.rollout import RolloutWorker, Sample
from workers.rl.staleness import bound_staleness, sampled_versions
from workers.rl.weightsync import WeightSyncReceiver, WeightSyncSender


class VersionedBackend(CharByCharBackend):
    """The scripted two-turn engine (a tool call, then the answer) with real version bookkeeping: weights loaded
    through `load_state_dict` set `policy_version`. `hold` (when set) keeps the first turn's generation waiting
    until it is released, so a test can send weights while the rollout runs."""

    def __init__(self, version: int = 0) -> None:
        super().__init__()
        self.version = version
        self.loaded: list[dict[str, torch.Tensor]] = []
        self.hold: threading.Event | None = None
        self.generating = threading.Event()

    @property
    def policy_version(self) -> int:
        return self.version

    def load_state_dict(self, state, version):  # type: ignore[no-untyped-def]
        self.loaded.append(state)
        self.version = version

    def generate(self, prompt_token_ids, params):  # type: ignore[no-untyped-def]
        if self.turn == 0 and self.hold is not None:
            self.generating.set()
            assert self.hold.wait(30)
        return super().generate(prompt_token_ids, params)


def _worker(backend: VersionedBackend) -> RolloutWorker:
    return RolloutWorker(
        backend,  # type: ignore[arg-type]
        environment="calculator",
        env_params={"max_turns": 3},
        reward={"terms": [{"type": "exact_match"}]},
    )


def test_each_sampled_token_keeps_the_version_of_the_weights_that_sampled_it():
    backend = VersionedBackend(version=3)

    def between_turns() -> float:
        if backend.turn == 1:  # after the tool call: new weights arrive
            backend.version = 4
        return 0.25

    result = _worker(backend).rollout(arithmetic_tasks(1, seed=0), group_size=1, seed=0, between_turns=between_turns)
    [sample] = result.samples
    assert sample.num_turns == 2 and len(sample.token_versions) == len(sample.loss_mask)
    versions = sampled_versions(sample)
    first_turn = versions.index(4)
    assert set(versions[:first_turn]) == {3} and set(versions[first_turn:]) == {4}
    assert sample.policy_version == 3  # the oldest token's: what staleness is measured on
    assert result.policy_version == 3 and result.newest_version == 4
    assert result.weight_apply_seconds == pytest.approx(0.5)  # called before each of the two turns


def _sample(versions: list[int], mask: list[int] | None = None, policy_version: int = 0) -> Sample:
    mask = mask if mask is not None else [1] * len(versions)
    return Sample(
        task_id="t",
        group=0,
        token_ids=[1] * (len(mask) + 2),
        completion_start=2,
        loss_mask=list(mask),
        old_logprobs=[-1.0] * len(mask),
        reward=0.0,
        terms={},
        policy_version=policy_version,
        num_turns=1,
        malformed_tool_calls=0,
        finish_reason="stop",
        error=None,
        trajectory={},
        token_versions=versions,
    )


def test_the_staleness_bound_takes_only_the_tokens_over_it_out_of_the_loss_and_counts_them():
    mixed = _sample([5, 5, 0, 6, 6], mask=[1, 1, 0, 1, 1], policy_version=5)  # the 0 is an observation token
    fresh = _sample([7, 7, 7, 7], policy_version=7)
    whole = _sample([], mask=[1, 1, 1], policy_version=4)  # one version for the whole episode, 3 versions old
    metrics = bound_staleness([mixed, fresh, whole], version=7, max_staleness=1)
    assert mixed.loss_mask == [0, 0, 0, 1, 1]  # lag 2 out, lag 1 kept, the observation untouched
    assert fresh.loss_mask == [1, 1, 1, 1] and whole.loss_mask == [0, 0, 0]
    # 11 sampled tokens: lag 0 x4, lag 1 x2, lag 2 x2, lag 3 x3
    assert metrics["versions/lag_0_share"] == pytest.approx(4 / 11)
    assert metrics["versions/lag_1_share"] == pytest.approx(2 / 11)
    assert metrics["versions/over_bound_share"] == pytest.approx(5 / 11)
    assert metrics["versions/masked_tokens"] == 5.0 and metrics["versions/mixed_samples"] == 1.0
    assert metrics["versions/max_lag"] == 3.0
    again = bound_staleness([mixed, fresh, whole], version=7, max_staleness=1)  # masked tokens no longer count
    assert again["versions/masked_tokens"] == 0.0 and again["versions/over_bound_share"] == 0.0


def test_within_the_bound_nothing_changes():
    samples = [_sample([2, 2, 3]), _sample([3, 3])]
    metrics = bound_staleness(samples, version=3, max_staleness=1)
    assert [s.loss_mask for s in samples] == [[1, 1, 1], [1, 1]]
    assert metrics["versions/masked_tokens"] == 0.0 and metrics["versions/lag_1_share"] == pytest.approx(2 / 5)


def test_an_engine_with_partial_rollouts_queues_weights_sent_mid_rollout_and_takes_them_before_the_next_turn():
    """The Ray actor's logic, called in-process from two threads as Ray's threaded actor does: `apply` returns at
    once while the rollout runs; the rollout loads the weights (a real delta-encoded update) between its turns."""
    from workers.rl.actors import RolloutActor

    backend = VersionedBackend(version=1)
    actor = RolloutActor.__new__(RolloutActor)
    actor.worker, actor.receiver, actor.partial = _worker(backend), WeightSyncReceiver(), True
    actor._lock, actor._rolling, actor._pending, actor.index = threading.Lock(), False, [], 0
    sender = WeightSyncSender(threads=0)
    weights = {"w": torch.zeros(4, 4)}
    assert actor.apply(sender.push(weights, version=1).blob, 1) > 0.0  # idle: loaded at once, the load timed
    assert backend.version == 1 and len(backend.loaded) == 1

    backend.hold = threading.Event()
    out: dict[str, object] = {}
    rolling = threading.Thread(
        target=lambda: out.update(result=actor.rollout(arithmetic_tasks(1, seed=0), 1, 0, "s1-")), daemon=True
    )
    rolling.start()
    assert backend.generating.wait(30)
    weights["w"] += 1.0
    assert actor.apply(sender.push(weights, version=2).blob, 2) == 0.0  # returns while the first turn still runs
    assert backend.version == 1 and len(actor._pending) == 1
    backend.hold.set()
    rolling.join(30)
    result = out["result"]
    [sample] = result.samples  # type: ignore[attr-defined]
    assert set(sampled_versions(sample)) == {1, 2} and result.newest_version == 2  # type: ignore[attr-defined]
    assert torch.equal(backend.loaded[-1]["w"], torch.ones(4, 4))  # the delta decoded against version 1


def test_partial_rollouts_need_async_mode():
    with pytest.raises(ValidationError, match="partial_rollout"):
        TrainConfig.model_validate({"partial_rollout": True, "mode": "sync"})
    config = TrainConfig.model_validate({"partial_rollout": True, "mode": "async"})
    assert config.partial_rollout
