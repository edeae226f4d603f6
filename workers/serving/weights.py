"""Hot swap: the weights each arm serves, and how they reach its replicas without a restart.

The controller (the job's driver) loads an arm's policy on the CPU (`policy_state`: the base model, or a trainer
checkpoint merged onto it, under the names `Learner.policy_state` uses, tied weights once) and encodes it with
the arm's `WeightSyncSender`: the full weights the first time, then an XOR delta against what the replicas hold.
It puts the blob in the object store and publishes it in the job's `WeightStore` actor.

Every replica keeps a long poll open on the store (`WeightStore.fetch`), which answers as soon as its arm moves
past the sync version the replica holds, with the blobs that get it there: the deltas from its version when it
holds a version on the chain, else the latest full blob and the deltas after it (a replica Serve restarted
catches up on its own). The replica decodes with its `WeightSyncReceiver` outside any lock, then copies the
weights into the model under its generation lock (so a request in flight finishes on the version it started on)
and acknowledges (`WeightStore.ack`). The controller waits for every live replica of the arm to acknowledge
(`WeightStore.wait_synced`); that wait is the swap's delivery time.

After a delta swap the controller encodes the new weights in full once more and replaces the chain's head with
it (`WeightStore.publish_full`), so the store holds at most a full blob and the deltas since, and a restarted
replica never replays a long chain. Its size is the "full" figure a delta is compared with.

Sync versions (the weight-sync blobs' `version`) count pushes per arm (0, 1, 2, ...); the policy version a
replica serves is the arm's checkpoint id (0: the base model), carried beside them: a deployment can go back to
an older checkpoint, but sync versions only increase.
"""

from __future__ import annotations

import asyncio
import io
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from workers.models.registry import resolve_base_model
from workers.rl.batching import untied
from workers.rl.config import TrainConfig
from workers.rl.learner import Learner
from workers.rl.learner_weights import CHECKPOINT_FORMAT

if TYPE_CHECKING:
    from torch import Tensor

LIVE_SECONDS = 20.0
"""A replica that has not polled the store for this long is taken for dead (a poll returns within 5 s)."""


def policy_state(
    base_model: str, checkpoint: bytes | None, *, threads: int | None = None
) -> tuple[dict[str, Tensor], int | None]:
    """The full weights of the base model, or of a trainer checkpoint on it (LoRA adapters merged), on the CPU,
    under Hugging Face names with tied weights once; and the checkpoint's own training step (None for the base).

    A full-parameter checkpoint is copied onto the base model's parameters directly (no optimizer is built); a LoRA
    checkpoint goes through `Learner`, which merges its adapters."""
    import torch
    from transformers import AutoModelForCausalLM

    path = str(resolve_base_model(base_model))
    if threads:
        torch.set_num_threads(threads)
    if checkpoint is None:
        model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True)
        return untied({k: v.detach() for k, v in model.state_dict().items()}), None
    payload: dict[str, Any] = torch.load(io.BytesIO(checkpoint), weights_only=False)
    if payload.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint format {payload.get('format')!r} is not {CHECKPOINT_FORMAT}")
    config = TrainConfig.model_validate(payload["config"])
    step = int(payload.get("step", 0))
    if config.lora is not None:
        learner = Learner(path, config, threads=threads)
        learner.load_checkpoint(checkpoint)
        return {k: v.detach().clone() for k, v in learner.policy_state().items()}, step
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True)
    named = dict(model.named_parameters())
    unknown = sorted(set(payload["trainable"]) - set(named))
    if unknown:
        raise ValueError(f"the checkpoint does not fit {base_model}: unknown parameters {unknown[:3]}")
    with torch.no_grad():
        for name, value in payload["trainable"].items():
            if tuple(value.shape) != tuple(named[name].shape):
                raise ValueError(
                    f"the checkpoint does not fit {base_model}: {name} is {tuple(value.shape)}, "
                    f"the model has {tuple(named[name].shape)}"
                )
            named[name].copy_(value)
    return untied({k: v.detach() for k, v in model.state_dict().items()}), step


@dataclass
class _Blob:
    base: int | None  # None: a full blob
    version: int
    ref: Any  # ray.ObjectRef[bytes]
    size: int


@dataclass
class _Arm:
    sync_version: int = -1
    policy_version: int = 0
    checkpoint_id: int | None = None
    full: _Blob | None = None
    deltas: list[_Blob] = field(default_factory=list)
    acks: dict[str, tuple[int, int, float, dict[str, Any]]] = field(default_factory=dict)
    seen: dict[str, float] = field(default_factory=dict)


class WeightStore:
    """The job's weight and routing board (a Ray actor, async: long polls wait on a condition, not a thread).

    Per arm: the sync version and policy version replicas must reach, the blobs that get them there, and what each
    replica acknowledged. Beside it the routing table the routers follow (revision-numbered)."""

    def __init__(self) -> None:
        self._arms: dict[str, _Arm] = {}
        self._changed = asyncio.Condition()
        self._routing: dict[str, Any] = {"revision": 0, "arms": [], "model_names": []}

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # --- controller side -----------------------------------------------------------------------------------------
    async def publish(
        self,
        arm: str,
        *,
        sync_version: int,
        base: int | None,
        policy_version: int,
        checkpoint_id: int | None,
        blob: list[Any],
        size: int,
    ) -> None:
        """A new version for `arm`: a full blob (`base` None) or a delta from `base`. `blob` is `[ObjectRef]` (a
        list, so Ray hands the store the reference, not the bytes)."""
        state = self._arms.setdefault(arm, _Arm())
        entry = _Blob(base=base, version=sync_version, ref=blob[0], size=size)
        if base is None:
            state.full, state.deltas = entry, []
        else:
            if base != state.sync_version:
                raise ValueError(f"arm {arm}: a delta from {base} does not follow version {state.sync_version}")
            state.deltas.append(entry)
        state.sync_version, state.policy_version, state.checkpoint_id = sync_version, policy_version, checkpoint_id
        await self._notify()

    async def publish_full(self, arm: str, *, sync_version: int, blob: list[Any], size: int) -> None:
        """The full weights of a version already published: replaces the chain's head (deltas up to it go)."""
        state = self._arms[arm]
        state.full = _Blob(base=None, version=sync_version, ref=blob[0], size=size)
        state.deltas = [d for d in state.deltas if d.version > sync_version]

    async def drop_arm(self, arm: str) -> None:
        self._arms.pop(arm, None)
        await self._notify()

    async def wait_synced(self, arm: str, sync_version: int, expected: int, timeout: float) -> dict[str, Any]:
        """Wait until `expected` live replicas of `arm` (and every live one) hold `sync_version` or later; returns
        {ok, acked, live, apply_seconds (the slowest replica's), waited}."""
        started = time.monotonic()
        deadline = started + timeout
        while True:
            report = self._synced(arm, sync_version, expected)
            remaining = deadline - time.monotonic()
            if report["ok"] or remaining <= 0:
                report["waited"] = time.monotonic() - started
                return report
            async with self._changed:
                try:
                    await asyncio.wait_for(self._changed.wait(), timeout=min(remaining, 1.0))
                except TimeoutError:
                    pass

    def _synced(self, arm: str, sync_version: int, expected: int) -> dict[str, Any]:
        state = self._arms.get(arm)
        if state is None:
            return {"ok": False, "acked": 0, "live": 0, "apply_seconds": 0.0}
        now = time.monotonic()
        live = {rid for rid, seen in state.seen.items() if now - seen < LIVE_SECONDS}
        acked = {rid for rid, ack in state.acks.items() if rid in live and ack[0] >= sync_version}
        slowest = max((state.acks[rid][3].get("apply_seconds", 0.0) for rid in acked), default=0.0)
        ok = len(acked) >= expected and acked == live
        return {"ok": ok, "acked": len(acked), "live": len(live), "apply_seconds": slowest}

    async def set_routing(self, routing: dict[str, Any]) -> int:
        self._routing = {**routing, "revision": int(self._routing["revision"]) + 1}
        await self._notify()
        return int(self._routing["revision"])

    async def status(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "routing": self._routing,
            "arms": {
                name: {
                    "sync_version": state.sync_version,
                    "policy_version": state.policy_version,
                    "checkpoint_id": state.checkpoint_id,
                    "full": None if state.full is None else [state.full.version, state.full.size],
                    "deltas": [[d.base, d.version, d.size] for d in state.deltas],
                    "replicas": {
                        rid: {"sync_version": ack[0], "policy_version": ack[1], **ack[3]}
                        for rid, ack in state.acks.items()
                        if now - state.seen.get(rid, 0.0) < LIVE_SECONDS
                    },
                }
                for name, state in self._arms.items()
            },
        }

    # --- replica side --------------------------------------------------------------------------------------------
    async def fetch(self, arm: str, replica: str, have: int | None, timeout: float = 5.0) -> dict[str, Any] | None:
        """Long poll: None while `arm` is at `have` (up to `timeout` seconds), else the plan to reach its version:
        {sync_version, policy_version, checkpoint_id, blobs: [ObjectRef, ...] to apply in order}."""
        deadline = time.monotonic() + timeout
        while True:
            state = self._arms.get(arm)
            if state is not None:
                state.seen[replica] = time.monotonic()
                if state.sync_version >= 0 and state.sync_version != have:
                    plan = self._plan(state, have)
                    if plan is not None:
                        return plan
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            async with self._changed:
                try:
                    await asyncio.wait_for(self._changed.wait(), timeout=remaining)
                except TimeoutError:
                    pass

    @staticmethod
    def _plan(state: _Arm, have: int | None) -> dict[str, Any] | None:
        chain: list[_Blob] = []
        if have is not None:
            position = have
            for delta in state.deltas:
                if delta.base == position:
                    chain.append(delta)
                    position = delta.version
            if position != state.sync_version:
                chain = []
        if not chain:
            if state.full is None:
                return None
            chain = [state.full]
            position = state.full.version
            for delta in state.deltas:
                if delta.base == position:
                    chain.append(delta)
                    position = delta.version
            if position != state.sync_version:
                return None
        return {
            "sync_version": state.sync_version,
            "policy_version": state.policy_version,
            "checkpoint_id": state.checkpoint_id,
            "blobs": [blob.ref for blob in chain],
            "bytes": sum(blob.size for blob in chain),
            "kinds": ["full" if blob.base is None else "delta" for blob in chain],
        }

    async def ack(self, arm: str, replica: str, sync_version: int, policy_version: int, info: dict[str, Any]) -> None:
        state = self._arms.get(arm)
        if state is None:
            return
        now = time.monotonic()
        state.seen[replica] = now
        state.acks[replica] = (sync_version, policy_version, now, info)
        await self._notify()

    async def routing(self, have: int, timeout: float = 5.0) -> dict[str, Any] | None:
        """Long poll for the routers: None while the routing table is at revision `have`, else the table."""
        deadline = time.monotonic() + timeout
        while int(self._routing["revision"]) == have:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            async with self._changed:
                try:
                    await asyncio.wait_for(self._changed.wait(), timeout=remaining)
                except TimeoutError:
                    pass
        return dict(self._routing)
