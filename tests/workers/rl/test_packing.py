"""Packed completion log-probs: first-fit-decreasing packing, and parity with one unpadded forward per sequence."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import Tensor, nn
from transformers import LlamaConfig, LlamaForCausalLM

from workers.rl.packing import completion_logprobs, pack_sequences

# --- fixtures ------------------------------------------------------------------------------------------------------


def tiny_llama(attn_implementation: str = "sdpa", seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
    )
    config._attn_implementation = attn_implementation
    model = LlamaForCausalLM(config)
    model.train(False)
    return model


def random_batch(n: int, lo: int, hi: int, seed: int = 1) -> tuple[list[list[int]], list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (n,), generator=gen).tolist()
    sequences = [torch.randint(0, 256, (length,), generator=gen).tolist() for length in lengths]
    starts = [int(torch.randint(1, length + 1, (1,), generator=gen)) for length in lengths]
    return sequences, starts


def reference_logprobs(model: LlamaForCausalLM, sequence: list[int], start: int, temperature: float = 1.0) -> Tensor:
    """The oracle: one unpadded forward of the sequence alone through the full model, log-softmax over all logits."""
    logits = model(torch.tensor([sequence])).logits[0].float() / temperature
    logprobs = torch.log_softmax(logits, dim=-1)[start - 1 : len(sequence) - 1]
    return logprobs.gather(-1, torch.tensor(sequence[start:]).unsqueeze(-1)).squeeze(-1)


def reference_entropy(model: LlamaForCausalLM, sequence: list[int], start: int, temperature: float) -> float:
    logits = model(torch.tensor([sequence])).logits[0].float()[start - 1 : len(sequence) - 1] / temperature
    probs = torch.softmax(logits, dim=-1)
    return float((-(probs * torch.log_softmax(logits, dim=-1)).sum(-1)).mean())


# --- pack_sequences ------------------------------------------------------------------------------------------------


def test_packing_is_first_fit_decreasing() -> None:
    lengths = [2, 5, 1, 3, 4, 2, 3]
    sequences = [[i] * n for i, n in enumerate(lengths)]
    packs = pack_sequences(sequences, [1] * len(lengths), max_tokens_per_pack=8)
    # Decreasing: 5, 4, 3, 3, 2, 2, 1 -> [5, 3], [4, 3, 1], [2, 2].
    assert [p.sequence_indices for p in packs] == [(1, 3), (4, 6, 2), (0, 5)]
    assert [p.boundaries for p in packs] == [(0, 5, 8), (0, 4, 7, 8), (0, 2, 4)]
    assert [p.num_tokens for p in packs] == [8, 8, 4]


def test_a_pack_holds_each_sequence_once_with_positions_restarting_at_zero() -> None:
    sequences, starts = random_batch(40, 1, 50)
    packs = pack_sequences(sequences, starts, max_tokens_per_pack=64)
    seen = sorted(i for p in packs for i in p.sequence_indices)
    assert seen == list(range(len(sequences)))
    for pack in packs:
        assert pack.input_ids.shape == pack.position_ids.shape == (1, pack.num_tokens)
        assert pack.num_tokens <= 64
        for s, i in enumerate(pack.sequence_indices):
            lo, hi = pack.boundaries[s], pack.boundaries[s + 1]
            assert pack.input_ids[0, lo:hi].tolist() == sequences[i]
            assert pack.position_ids[0, lo:hi].tolist() == list(range(len(sequences[i])))
            assert pack.completion_starts[s] == lo + starts[i]
    # 40 sequences averaging ~25 tokens fit in few rows: FFD wastes little.
    total = sum(len(s) for s in sequences)
    assert len(packs) <= total // 64 + 2


def test_packing_accepts_tensors_and_refuses_bad_input() -> None:
    packs = pack_sequences([torch.tensor([1, 2, 3]), [4, 5]], [1, 2], max_tokens_per_pack=5)
    assert packs[0].input_ids.tolist() == [[1, 2, 3, 4, 5]]
    with pytest.raises(ValueError, match="more than max_tokens_per_pack=4"):
        pack_sequences([[1, 2, 3, 4, 5]], [1], max_tokens_per_pack=4)
    with pytest.raises(ValueError, match=r"completion_starts\[0\]=0"):
        pack_sequences([[1, 2]], [0], max_tokens_per_pack=4)
    with pytest.raises(ValueError, match="one start per sequence"):
        pack_sequences([[1, 2]], [1, 1], max_tokens_per_pack=4)


# --- completion_logprobs -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_logprobs_match_one_unpadded_forward_per_sequence(attn_implementation: str, temperature: float) -> None:
    model = tiny_llama(attn_implementation)
    sequences, starts = random_batch(12, 2, 40)
    with torch.no_grad():
        got = completion_logprobs(model, sequences, starts, max_tokens_per_pack=96, temperature=temperature)
        assert len(pack_sequences(sequences, starts, 96)) < len(sequences)  # really packed
        for sequence, start, logprobs in zip(sequences, starts, got, strict=True):
            assert logprobs.shape == (len(sequence) - start,)
            torch.testing.assert_close(
                logprobs, reference_logprobs(model, sequence, start, temperature), atol=1e-5, rtol=0
            )


def test_without_restarting_positions_packed_sequences_would_attend_to_each_other() -> None:
    """Control for the parity test: the same row with plain 0..L-1 positions gives different log-probs."""
    model = tiny_llama()
    sequences, starts = [[5, 6, 7, 8, 9], [10, 11, 12, 13]], [1, 1]
    (pack,) = pack_sequences(sequences, starts, max_tokens_per_pack=9)
    with torch.no_grad():
        logits = model(pack.input_ids, position_ids=torch.arange(9).unsqueeze(0)).logits[0]
        mixed = torch.log_softmax(logits, dim=-1)[5:8].gather(-1, torch.tensor([[11], [12], [13]])).squeeze(-1)
        packed = completion_logprobs(model, sequences, starts, max_tokens_per_pack=9)[1]
    assert (mixed - packed).abs().max() > 1e-3
    torch.testing.assert_close(packed, reference_logprobs(model, sequences[1], 1), atol=1e-5, rtol=0)


@pytest.mark.parametrize("recompute_logits", [False, True])
def test_gradients_match_the_sum_over_unpacked_sequences(recompute_logits: bool) -> None:
    model = tiny_llama()
    sequences, starts = random_batch(10, 2, 30, seed=3)
    weights = torch.linspace(-1.0, 1.5, len(sequences))  # advantage-like per-sequence weights

    packed = completion_logprobs(model, sequences, starts, max_tokens_per_pack=80, recompute_logits=recompute_logits)
    sum(w * lp.sum() for w, lp in zip(weights, packed, strict=True)).backward()
    packed_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()

    reference = [reference_logprobs(model, s, c) for s, c in zip(sequences, starts, strict=True)]
    sum(w * lp.sum() for w, lp in zip(weights, reference, strict=True)).backward()
    assert packed_grads.keys() == {n for n, p in model.named_parameters() if p.grad is not None}
    for name, param in model.named_parameters():
        assert param.grad is not None
        torch.testing.assert_close(packed_grads[name], param.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_entropy_is_the_mean_over_completion_tokens_of_the_tempered_distribution() -> None:
    model = tiny_llama()
    sequences, starts = random_batch(6, 2, 30, seed=4)
    sequences.append([1, 2, 3])
    starts.append(3)  # no completion tokens
    logprobs, entropy = completion_logprobs(model, sequences, starts, temperature=0.8, with_entropy=True)
    assert entropy.shape == (len(sequences),)
    assert not entropy.requires_grad
    assert logprobs[0].requires_grad
    with torch.no_grad():
        for i in range(len(sequences) - 1):
            assert float(entropy[i]) == pytest.approx(reference_entropy(model, sequences[i], starts[i], 0.8), abs=1e-5)
    assert torch.isnan(entropy[-1])
    assert logprobs[-1].shape == (0,)


def test_sequences_without_completion_tokens_give_empty_results() -> None:
    model = tiny_llama()
    result = completion_logprobs(model, [[1, 2], [3]], [2, 1])
    assert [r.shape for r in result] == [(0,), (0,)]


class _ExoticAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(_attn_implementation="paged_attention")
        self.lm_head = nn.Linear(2, 2)


def test_an_attention_that_may_ignore_packing_or_a_logit_postprocessing_head_is_refused() -> None:
    with pytest.raises(ValueError, match="paged_attention"):
        completion_logprobs(_ExoticAttention(), [[1, 2]], [1])
    model = tiny_llama()
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        completion_logprobs(model, [[1, 2]], [1])
    with pytest.raises(ValueError, match="temperature"):
        completion_logprobs(tiny_llama(), [[1, 2]], [1], temperature=0.0)


def test_one_forward_per_pack_gives_the_same_logprobs_as_all_packs_in_one_batch() -> None:
    model = tiny_llama()
    sequences, starts = random_batch(15, 2, 40, seed=5)
    with torch.no_grad():
        batched = completion_logprobs(model, sequences, starts, max_tokens_per_pack=64)
        one_by_one = completion_logprobs(model, sequences, starts, max_tokens_per_pack=64, packs_per_forward=1)
    assert len({p.num_tokens for p in pack_sequences(sequences, starts, 64)}) > 1  # the batch has filler tails
    for a, b in zip(batched, one_by_one, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
