"""Completion-token log-probs of many variable-length sequences, packed into rows without padding.

The learner needs, for every sampled sequence, log pi(token_k | tokens_<k) at each completion token k. Padding a
batch to its longest sequence wastes compute on pad tokens and runs the LM head over every position and the whole
vocabulary. Here instead:

1. :func:`pack_sequences` bin-packs the sequences (first-fit decreasing) into rows of at most
   ``max_tokens_per_pack`` tokens. ``position_ids`` restart at 0 at each sequence, which is all transformers 5.x
   needs: with ``attention_mask=None`` and no KV cache, ``masking_utils.find_packed_sequence_indices`` reads the
   restarts as sequence boundaries and builds a block-diagonal causal mask (sdpa, eager, flex), and the flash
   attention paths use the same restarts for their variable-length kernels. Rotary embeddings see each sequence's
   own positions, so a packed row computes exactly what each sequence alone would.
2. :func:`completion_logprobs` runs the base decoder over the packs (stacked as one batch of rows), gathers only
   the hidden states at positions that predict a completion token (token k at position p is predicted from
   position p - 1), applies the LM head to those rows alone, and takes ``logit[target] - logsumexp(logits)``: one
   [N, V] float32 tensor per forward, never a [N, V] log-softmax besides it, and nothing for prompt positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

__all__ = ["Pack", "completion_logprobs", "pack_sequences"]

# Attention implementations whose mask (or varlen kernel) honours packed position_ids in transformers 5.x.
PACKED_ATTENTION_IMPLEMENTATIONS = frozenset(
    {"sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3", "flash_attention_4"}
)
# Config fields of heads that post-process logits in ForCausalLM.forward, which this module bypasses.
_LOGIT_POSTPROCESSING = {"final_logit_softcapping": None, "logit_scale": 1.0, "logits_scaling": 1.0}


@dataclass(frozen=True)
class Pack:
    """One packed row.

    ``input_ids`` and ``position_ids``: [1, L] int64, L <= max_tokens_per_pack, positions restart at 0 per
    sequence. Segment s is the caller's sequence ``sequence_indices[s]``; it spans row positions
    ``boundaries[s]:boundaries[s + 1]`` and its first completion token sits at row position ``completion_starts[s]``.
    """

    input_ids: Tensor
    position_ids: Tensor
    sequence_indices: tuple[int, ...]
    boundaries: tuple[int, ...]
    completion_starts: tuple[int, ...]

    @property
    def num_tokens(self) -> int:
        return self.boundaries[-1]


def _check_inputs(
    sequences: Sequence[Sequence[int] | Tensor], completion_starts: Sequence[int], max_tokens_per_pack: int
) -> list[int]:
    if max_tokens_per_pack < 1:
        raise ValueError(f"max_tokens_per_pack={max_tokens_per_pack}: must be at least 1")
    if len(sequences) != len(completion_starts):
        raise ValueError(
            f"{len(sequences)} sequences but {len(completion_starts)} completion_starts: give one start per sequence"
        )
    lengths = [len(seq) for seq in sequences]
    for i, (length, start) in enumerate(zip(lengths, completion_starts, strict=True)):
        if not 1 <= start <= length:
            raise ValueError(
                f"completion_starts[{i}]={start} for a sequence of {length} tokens: the first completion token needs"
                " at least one token before it (1 <= start <= length)"
            )
        if length > max_tokens_per_pack:
            raise ValueError(
                f"sequence {i} has {length} tokens, more than max_tokens_per_pack={max_tokens_per_pack}: raise the"
                " limit or truncate the sequence"
            )
    return lengths


def pack_sequences(
    sequences: Sequence[Sequence[int] | Tensor], completion_starts: Sequence[int], max_tokens_per_pack: int
) -> list[Pack]:
    """First-fit-decreasing bin packing of token sequences into rows of at most ``max_tokens_per_pack`` tokens.

    ``sequences[i]`` is a list (or 1-D tensor) of token ids; ``completion_starts[i]`` the index in it of the first
    completion token (1 <= start <= len; start == len means no completion tokens). Deterministic: ties in length
    keep the input order. Raises ValueError for a sequence longer than a pack.
    """
    lengths = _check_inputs(sequences, completion_starts, max_tokens_per_pack)
    order = sorted(range(len(sequences)), key=lambda i: (-lengths[i], i))
    free: list[int] = []  # tokens left in each bin
    bins: list[list[int]] = []
    for i in order:
        for b, room in enumerate(free):
            if lengths[i] <= room:
                bins[b].append(i)
                free[b] -= lengths[i]
                break
        else:
            bins.append([i])
            free.append(max_tokens_per_pack - lengths[i])

    packs = []
    for members in bins:
        boundaries = [0]
        starts = []
        for i in members:
            starts.append(boundaries[-1] + completion_starts[i])
            boundaries.append(boundaries[-1] + lengths[i])
        ids = torch.cat([torch.as_tensor(sequences[i], dtype=torch.long).reshape(-1) for i in members])
        positions = torch.cat([torch.arange(lengths[i], dtype=torch.long) for i in members])
        packs.append(
            Pack(
                input_ids=ids.unsqueeze(0),
                position_ids=positions.unsqueeze(0),
                sequence_indices=tuple(members),
                boundaries=tuple(boundaries),
                completion_starts=tuple(starts),
            )
        )
    return packs


def _stack_rows(packs: Sequence[Pack]) -> tuple[Tensor, Tensor]:
    """Packs -> input_ids, position_ids [P, width], width = longest pack.

    A shorter row is filled with token 0 whose positions restart at 0, so the filler is a segment of its own: it
    comes after the row's real tokens (causality hides it from them) and its outputs are never read.
    """
    width = max(p.num_tokens for p in packs)
    input_ids = torch.zeros(len(packs), width, dtype=torch.long)
    position_ids = torch.zeros(len(packs), width, dtype=torch.long)
    for r, pack in enumerate(packs):
        n = pack.num_tokens
        input_ids[r, :n] = pack.input_ids[0]
        position_ids[r, :n] = pack.position_ids[0]
        position_ids[r, n:] = torch.arange(width - n)
    return input_ids, position_ids


def _decoder_and_head(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """The base decoder (``model.model`` for Llama-style models) and the LM head (``model.lm_head``)."""
    config = getattr(model, "config", None)
    attn = getattr(config, "_attn_implementation", None)
    if attn not in PACKED_ATTENTION_IMPLEMENTATIONS:
        raise ValueError(
            f"attention implementation {attn!r} is not known to keep packed sequences apart; load the model with"
            f" attn_implementation set to one of {sorted(PACKED_ATTENTION_IMPLEMENTATIONS)}"
        )
    for field, neutral in _LOGIT_POSTPROCESSING.items():
        value = getattr(config, field, neutral)
        if value is not None and value != neutral:
            raise ValueError(
                f"config.{field}={value}: this model post-processes its logits, which completion_logprobs does not"
                " reproduce; compute its log-probs from model(...).logits instead"
            )
    get_decoder = getattr(model, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else getattr(model, "model", None)
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else getattr(model, "lm_head", None)
    if not isinstance(decoder, nn.Module) or not isinstance(head, nn.Module):
        raise ValueError(f"{type(model).__name__} has no base decoder and LM head (expected .model and .lm_head)")
    return decoder, head


def _head_logprobs(
    head: nn.Module, rows: Tensor, targets: Tensor, temperature: float, entropy_out: list[Tensor] | None
) -> Tensor:
    """Log-probs of ``targets`` [N] under ``head(rows) / temperature``; rows [N, H] -> [N] float32.

    When ``entropy_out`` is a list, the per-row entropy [N] of the same distribution is appended to it, detached.
    """
    logits: Tensor = head(rows).float()
    if temperature != 1.0:
        logits = logits / temperature
    log_normaliser = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_normaliser
    if entropy_out is not None:
        with torch.no_grad():
            # H = logZ - sum_v p_v * z_v, on the tempered logits z (the distribution the tokens were sampled from).
            probs = torch.softmax(logits, dim=-1)
            entropy_out.append(log_normaliser - (probs * logits).sum(-1))
    return logprobs


@overload
def completion_logprobs(
    model: nn.Module,
    sequences: Sequence[Sequence[int] | Tensor],
    completion_starts: Sequence[int],
    *,
    max_tokens_per_pack: int = ...,
    temperature: float = ...,
    with_entropy: Literal[False] = ...,
    recompute_logits: bool = ...,
    packs_per_forward: int | None = ...,
) -> list[Tensor]: ...


@overload
def completion_logprobs(
    model: nn.Module,
    sequences: Sequence[Sequence[int] | Tensor],
    completion_starts: Sequence[int],
    *,
    max_tokens_per_pack: int = ...,
    temperature: float = ...,
    with_entropy: Literal[True],
    recompute_logits: bool = ...,
    packs_per_forward: int | None = ...,
) -> tuple[list[Tensor], Tensor]: ...


def completion_logprobs(
    model: nn.Module,
    sequences: Sequence[Sequence[int] | Tensor],
    completion_starts: Sequence[int],
    *,
    max_tokens_per_pack: int = 4096,
    temperature: float = 1.0,
    with_entropy: bool = False,
    recompute_logits: bool = False,
    packs_per_forward: int | None = None,
) -> list[Tensor] | tuple[list[Tensor], Tensor]:
    """Log-probs of each sequence's completion tokens under a causal LM, computed in packed rows.

    ``model``: a transformers ForCausalLM with a base decoder and a plain linear LM head (Llama, Qwen, Mistral...).
    ``sequences[i]``: token ids (prompt then completion); ``completion_starts[i]``: index of the first completion
    token. Returns one float32 tensor per sequence, shape [len(sequences[i]) - completion_starts[i]], in nats, on
    the model's device; entry j is log p(sequences[i][start + j] | sequences[i][:start + j]). The result keeps the
    autograd graph to the model's parameters (run under ``torch.no_grad()`` for the reference/behaviour policy).

    ``temperature`` divides the logits before the softmax, as a sampler with that temperature does, so the
    log-probs are those of the distribution the tokens were drawn from. ``with_entropy=True`` also returns a
    detached [len(sequences)] float32 tensor: each sequence's mean per-token entropy (nats) of that same tempered
    distribution over its completion tokens, NaN for a sequence with none. ``recompute_logits=True`` saves only the
    gathered hidden rows for backward and recomputes the [N, vocab] logits there: one more LM-head matmul per forward
    for N * vocab * 4 bytes less activation memory. ``packs_per_forward`` packs go through the decoder as one
    [P, longest pack] batch (default: all of them; lower it to cap the transient attention memory).

    Choosing ``max_tokens_per_pack``: with a dense-mask attention (sdpa or eager, as on CPU) a row of L tokens costs
    L^2 in attention whatever its block-diagonal mask hides, so one to two times the longest sequence is the sweet
    spot there (on CPU, 32 sequences of 20-160 tokens: 4096 was 6x slower than 160 for a 2-layer toy model);
    flash-attention varlen kernels cost only the per-sequence squares, so there long rows cost nothing extra.

    Dropout, if the model has any, differs between packed and unpacked runs; call in eval mode for exact parity.
    """
    # One function on purpose: packing the rows, the forward and the unpacking share the offsets; the steps are
    # commented in order.
    if not temperature > 0:
        raise ValueError(f"temperature={temperature}: must be positive")
    if packs_per_forward is not None and packs_per_forward < 1:
        raise ValueError(f"packs_per_forward={packs_per_forward}: must be at least 1 (or None for all packs at once)")
    _check_inputs(sequences, completion_starts, max_tokens_per_pack)
    decoder, head = _decoder_and_head(model)
    device = next(model.parameters()).device

    wanted = [i for i, seq in enumerate(sequences) if completion_starts[i] < len(seq)]
    packs = pack_sequences([sequences[i] for i in wanted], [completion_starts[i] for i in wanted], max_tokens_per_pack)

    results: list[Tensor | None] = [None] * len(sequences)
    entropies = torch.full((len(sequences),), float("nan"), dtype=torch.float32, device=device)
    step = max(len(packs), 1) if packs_per_forward is None else packs_per_forward
    for first in range(0, len(packs), step):
        group = packs[first : first + step]
        input_ids, position_ids = _stack_rows(group)
        width = input_ids.shape[1]
        # Row position p predicts the token at p + 1: a segment [lo, hi) completed from c predicts from c-1..hi-2.
        counts: list[int] = []
        members: list[int] = []
        predict_at: list[Tensor] = []
        for r, pack in enumerate(group):
            for segment, c, hi in zip(pack.sequence_indices, pack.completion_starts, pack.boundaries[1:], strict=True):
                counts.append(hi - c)
                members.append(wanted[segment])
                predict_at.append(torch.arange(r * width + c - 1, r * width + hi - 1))
        flat_at = torch.cat(predict_at).to(device)  # [N] indices into the flattened [P * width] rows
        input_ids = input_ids.to(device)
        targets = input_ids.reshape(-1).index_select(0, flat_at + 1)

        out: Any = decoder(
            input_ids=input_ids, position_ids=position_ids.to(device), attention_mask=None, use_cache=False
        )
        hidden: Tensor = out.last_hidden_state
        rows = hidden.reshape(-1, hidden.shape[-1]).index_select(0, flat_at)  # [N, H]

        entropy_rows: list[Tensor] | None = [] if with_entropy else None
        if recompute_logits and torch.is_grad_enabled():
            logprobs = checkpoint(_head_logprobs, head, rows, targets, temperature, entropy_rows, use_reentrant=False)
        else:
            logprobs = _head_logprobs(head, rows, targets, temperature, entropy_rows)

        for index, part in zip(members, torch.split(logprobs, counts), strict=True):
            results[index] = part
        if entropy_rows:
            means = torch.stack([part.mean() for part in torch.split(entropy_rows[0], counts)])
            entropies[torch.tensor(members, device=device)] = means

    empty = torch.zeros(0, dtype=torch.float32, device=device)
    logprob_list = [empty if r is None else r for r in results]
    if with_entropy:
        return logprob_list, entropies
    return logprob_list
