"""How the learner cuts a rollout batch (`workers.rl.learner`): micro-batches under a token budget, minibatches that
keep groups whole, the flattened segments of multi-segment samples (self-summarisation), per-sample sums of
per-token log-probs, and the untied copy of a state dict the engines load."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from workers.rl.advantages import AdvantageResult
from workers.rl.rollout import Sample


def micro_batches(samples: Sequence[Sample], budget: int) -> list[list[int]]:
    """Indices of samples grouped so each group has at most `budget` tokens (longest first; one per group if a
    single sample is longer)."""
    order = sorted(range(len(samples)), key=lambda i: -samples[i].total_tokens)
    groups: list[list[int]] = []
    sizes: list[int] = []
    for i in order:
        n = samples[i].total_tokens
        for g, size in enumerate(sizes):
            if size + n <= budget:
                groups[g].append(i)
                sizes[g] += n
                break
        else:
            groups.append([i])
            sizes.append(n)
    return groups


def minibatches(samples: int, group_size: int, parts: int) -> list[range]:
    """`parts` contiguous ranges of whole groups covering `samples` samples, as even as the groups allow (fewer
    when there are fewer groups); one range for parts = 1."""
    groups = max(1, -(-samples // max(group_size, 1)))
    parts = max(1, min(parts, groups))
    bounds = [round(groups * k / parts) * group_size for k in range(parts + 1)]
    bounds[-1] = samples
    return [range(min(a, samples), min(b, samples)) for a, b in zip(bounds, bounds[1:], strict=False)]


def flatten_segments(batch: Sequence[Sample]) -> tuple[list[list[int]], list[int], list[int]]:
    """Every segment of every sample as its own sequence, with the index of the sample it belongs to."""
    seqs: list[list[int]] = []
    starts: list[int] = []
    owners: list[int] = []
    for index, sample in enumerate(batch):
        for ids, start in sample.segments:
            seqs.append(ids)
            starts.append(start)
            owners.append(index)
    return seqs, starts, owners


def per_sample(logps: Sequence[Tensor], owners: Sequence[int], samples: int) -> Tensor:
    """Concatenate each sample's segment log-probs in order (matching its loss_mask) and pad to [samples, T]."""
    parts: list[list[Tensor]] = [[] for _ in range(samples)]
    for logp, owner in zip(logps, owners, strict=True):
        parts[owner].append(logp)
    rows = [torch.cat(p) if len(p) > 1 else p[0] for p in parts]
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)


def padded(rows: Sequence[Sequence[float]], dtype: torch.dtype) -> Tensor:
    width = max((len(r) for r in rows), default=0)
    out = torch.zeros(len(rows), max(width, 1), dtype=dtype)
    for i, row in enumerate(rows):
        if len(row):
            out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def as_float(value: Tensor) -> float:
    """A scalar tensor as a float; a DTensor (FSDP2's gradient norm) is made whole first."""
    full = getattr(value, "full_tensor", None)
    return float(full() if callable(full) else value)


def untied(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Drop names that share storage with an earlier one (tied embeddings and LM head): the receiver's model ties
    them too, so sending the tensor once halves that part of every sync."""
    seen: set[int] = set()
    out: dict[str, Tensor] = {}
    for name, tensor in state.items():
        pointer = tensor.untyped_storage().data_ptr()
        if pointer in seen:
            continue
        seen.add(pointer)
        out[name] = tensor
    return out


def given_advantages(advantages: Sequence[float] | Tensor, samples: int) -> AdvantageResult:
    """Caller-given advantages ([N] finite numbers) as an `AdvantageResult` that keeps every sample (no groups)."""
    values = torch.as_tensor(advantages, dtype=torch.float64).detach().cpu()
    if values.dim() != 1 or values.shape[0] != samples:
        raise ValueError(f"advantages must be one number per sample ([{samples}]), got shape {tuple(values.shape)}")
    if not bool(torch.isfinite(values).all()):
        raise ValueError("advantages must all be finite; found NaN or inf")
    keep = torch.ones(samples, dtype=torch.bool)
    return AdvantageResult(advantages=values, keep=keep, dropped_groups=0, num_groups=0, signal_groups=0)
