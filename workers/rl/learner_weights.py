"""What a learner hands out and keeps: the policy's weights (for the rollout engines, as an export, merged LoRA),
its one-file checkpoints and its sharded (DCP) ones. A mixin of `workers.rl.learner.Learner`, which sets every
attribute declared below in its constructor; split from it to keep the training step and the state apart."""

from __future__ import annotations

import io
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from workers.rl import distributed
from workers.rl.batching import untied
from workers.rl.config import TrainConfig
from workers.rl.weightsync import WeightSyncSender

CHECKPOINT_FORMAT = 1


class LearnerWeights:
    """Weights and checkpoints of a `Learner` (see there for the attributes)."""

    config: TrainConfig
    model: Any
    model_path: str
    optimizer: torch.optim.Optimizer
    sender: WeightSyncSender
    rank: int
    world_size: int
    step: int
    version: int
    _sent_version: int | None

    # --- weights --------------------------------------------------------------------------------------------
    def policy_state(self) -> dict[str, Tensor]:
        """The policy's full weights under the base model's parameter names (LoRA adapters merged in), each tensor
        once (a tied LM head is the embedding: the receiver ties it too). Under FSDP2 every rank must call it (the
        shards are gathered to rank 0); ranks other than 0 get {}."""
        if self.config.lora is None:
            if self.config.learner.strategy == "fsdp2":
                gathered = distributed.full_state_dict(self.model)
                if self.rank != 0:
                    return {}
            else:
                gathered = {k: v.detach() for k, v in self.model.state_dict().items()}
            every = {name for name, _ in self.model.named_parameters(remove_duplicate=False)}
            repeated = every - {name for name, _ in self.model.named_parameters()}
            return untied({k: v for k, v in gathered.items() if k not in repeated})
        from peft.tuners.lora import LoraLayer

        base = self.model.get_base_model()
        deltas = {
            f"{name}.weight": module.get_delta_weight("default")  # type: ignore[attr-defined]
            for name, module in base.named_modules()
            if isinstance(module, LoraLayer)
        }
        state: dict[str, Tensor] = {}
        for key, value in base.state_dict().items():
            if "lora_" in key:
                continue
            name = key.replace(".base_layer", "")
            state[name] = (value + deltas[name]).detach() if name in deltas else value.detach()
        return untied(state)

    def weight_update(self) -> tuple[bytes | None, dict[str, float]]:
        """The update for rollout workers: a delta against the last one sent (or the full weights); None when the
        policy has not changed since (a step whose groups were all dropped). Every rank calls it (the weights are
        gathered from the shards once); only rank 0 returns the update."""
        if self._sent_version == self.version:
            return None, {}
        started = time.perf_counter()
        gathers = self.config.learner.strategy == "fsdp2"  # every rank joins the gather; DDP's rank 0 has it all
        state = self.policy_state() if self.rank == 0 or gathers else {}
        self._sent_version = self.version
        if self.rank != 0:
            return None, {}
        update = self.sender.push(state, version=self.version, full=self.config.weight_sync == "full")
        return update.blob, {
            "sync_bytes": float(update.stats.bytes),
            "sync_seconds": time.perf_counter() - started,
            "sync_ratio_vs_full": float(update.stats.ratio_vs_full),
        }

    def export_pretrained(self, directory: str | Path) -> None:
        """The policy as one Hugging Face-format directory (weights, config, tokenizer) that evals, SFT and
        serving load; LoRA adapters merged. Every rank calls it; rank 0 writes."""
        if self.rank != 0 and self.config.learner.strategy != "fsdp2":
            return
        state = self.policy_state()
        if self.rank != 0:
            return
        from transformers import AutoTokenizer

        model = self.model.get_base_model() if self.config.lora is not None else self.model
        model.save_pretrained(str(directory), state_dict=state)
        AutoTokenizer.from_pretrained(self.model_path, local_files_only=True).save_pretrained(str(directory))

    # --- checkpoints ----------------------------------------------------------------------------------------
    def checkpoint_bytes(self, *, data_position: int) -> bytes:
        if self.config.learner.strategy == "fsdp2":
            raise ValueError("an FSDP2 learner's state is sharded: save it with save_sharded (DCP)")
        trainable = {n: p.detach() for n, p in self.model.named_parameters() if p.requires_grad}
        payload = {
            "format": CHECKPOINT_FORMAT,
            "step": self.step,
            "version": self.version,
            "data_position": data_position,
            "trainable": trainable,
            "optimizer": self.optimizer.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
            "numpy_rng": np.random.get_state(),
            "config": self.config.model_dump(mode="json"),
        }
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        return buffer.getvalue()

    def load_checkpoint(self, blob: bytes) -> dict[str, Any]:
        payload: dict[str, Any] = torch.load(io.BytesIO(blob), weights_only=False)
        if payload.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"checkpoint format {payload.get('format')!r} is not {CHECKPOINT_FORMAT}")
        named = dict(self.model.named_parameters())
        missing = sorted(set(payload["trainable"]) - set(named))
        if missing:
            raise ValueError(f"checkpoint does not fit this model: unknown parameters {missing[:3]}...")
        if self.config.learner.strategy == "fsdp2":  # each rank takes its shards of the full tensors
            distributed.load_full_state(self.model, self.optimizer, payload["trainable"], payload["optimizer"])
        else:
            with torch.no_grad():
                for name, value in payload["trainable"].items():
                    named[name].copy_(value)
            self.optimizer.load_state_dict(payload["optimizer"])
        torch.set_rng_state(payload["torch_rng"])
        random.setstate(payload["python_rng"])
        np.random.set_state(payload["numpy_rng"])
        self.step, self.version = int(payload["step"]), int(payload["version"])
        self.sender.reset()
        self._sent_version = None
        return payload

    def save_sharded(self, uri: str, *, data_position: int, storage_options: dict[str, Any] | None = None) -> None:
        """A sharded checkpoint (`torch.distributed.checkpoint`) in directory `uri`: every rank writes its shards
        of the parameters and the optimizer state. It loads on any world size and strategy (`load_sharded`). Unlike
        the one-file checkpoint it holds no RNG state: the learner draws no random numbers (no dropout in the
        policy; LoRA dropout aside), sampling happens in the rollout workers."""
        extra = {
            "step": self.step,
            "version": self.version,
            "data_position": data_position,
            "world_size": self.world_size,
            "strategy": self.config.learner.strategy,
            "config": self.config.model_dump(mode="json"),
        }
        distributed.save_sharded(self.model, self.optimizer, uri, extra, storage_options)

    def load_sharded(self, uri: str, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
        """Resume from a checkpoint written by `save_sharded` at any world size; returns its step, version and data
        position (and what wrote it)."""
        extra = distributed.load_sharded(self.model, self.optimizer, uri, storage_options)
        self.step, self.version = int(extra["step"]), int(extra["version"])
        self.sender.reset()
        self._sent_version = None
        return extra
