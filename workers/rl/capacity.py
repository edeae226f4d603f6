"""How much memory one learner rank needs under DDP and FSDP2 (with and without mixed precision and CPU offload),
from a model's shape and the per-token activation cost measured on this machine (`estimate_memory_gb`'s
calibration: about 160 bytes per layer and hidden unit per token in fp32). With gradient checkpointing each layer
keeps only its input (hidden x 4 bytes per token in fp32) and one layer at a time is recomputed in full. A
planning figure, not a promise: allocator slack, communication buffers and fragmentation come on top
(`HEADROOM`).

Per rank, for P parameters over N ranks, with AdamW (two fp32 moments):
- DDP: every rank holds everything: fp32 weights 4P, gradients 4P, moments 8P (16P), plus DDP's gradient buckets
  (about 4P/16 in 25 MB buckets at a time; counted as 0.25P) and one micro-batch's activations.
- FSDP2: the 16P are sharded (16P / N); while a transformer block computes, its parameters are gathered whole
  (and its gradients whole until they are reduce-scattered): two blocks' worth at a time with prefetch. With bf16
  mixed precision the gathered copies and activations are half as large; with CPU offload the 16P / N live in
  host memory and the device keeps only the gathered blocks and the activations.
- A reference model for the KL term: 4P (DDP) or 4P / N (FSDP2; on the host with offload).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from workers.models.registry import ModelShape
from workers.rl.placement import GB

HEADROOM = 1.15
"""Allocator slack, communication buffers and fragmentation on top of the estimate."""
ACTIVATION_BYTES = 160.0
"""Bytes per layer, hidden unit and token of one micro-batch's activations in fp32 (machine-notes.md)."""

Strategy = Literal["ddp", "fsdp2"]


@dataclass(frozen=True)
class RankMemory:
    device_gb: float
    host_gb: float
    parts: dict[str, float]


def rank_memory(
    shape: ModelShape,
    strategy: Strategy,
    ranks: int,
    *,
    tokens: int,
    mixed_precision: bool = False,
    cpu_offload: bool = False,
    gradient_checkpointing: bool = False,
    reference: bool = False,
) -> RankMemory:
    """Peak memory of one learner rank (GiB, headroom included) training on `tokens` tokens per micro-batch."""
    if ranks < 1:
        raise ValueError(f"ranks={ranks}: must be at least 1")
    if strategy == "ddp" and (mixed_precision or cpu_offload):
        raise ValueError("mixed_precision and cpu_offload are FSDP2 options here")
    p = float(shape.parameters)
    block = p / max(shape.layers, 1)
    width = 2.0 if mixed_precision else 4.0
    per_layer = ACTIVATION_BYTES * width / 4.0  # one layer's activations per hidden unit and token
    if gradient_checkpointing:  # each layer keeps its input; one layer at a time is recomputed in full
        stored = tokens * shape.hidden * (shape.layers * width + per_layer)
    else:
        stored = tokens * shape.hidden * shape.layers * per_layer
    parts: dict[str, float] = {"activations": (stored + tokens * shape.vocab * 8) / GB}  # + fp32 logits and grads
    host: dict[str, float] = {}
    if strategy == "ddp":
        parts["weights_grads_adam"] = 16 * p / GB
        parts["gradient_buckets"] = 0.25 * p / GB
        if reference:
            parts["reference"] = 4 * p / GB
    else:
        sharded = 16 * p / ranks / GB
        (host if cpu_offload else parts)["weights_grads_adam_shard"] = sharded
        parts["gathered_blocks"] = 2 * 2 * width * block / GB  # two blocks in flight, weights and gradients
        if reference:
            (host if cpu_offload else parts)["reference_shard"] = 4 * p / ranks / GB
    device = sum(parts.values()) * HEADROOM
    return RankMemory(
        device_gb=round(device, 2),
        host_gb=round(sum(host.values()) * HEADROOM, 2),
        parts={k: round(v, 3) for k, v in {**parts, **host}.items()},
    )
