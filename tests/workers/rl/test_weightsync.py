"""Weight sync (docs/methods.md C5): full and XOR-delta blobs rebuild the weights exactly and refuse a wrong base."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn

from workers.rl.weightsync import (
    WeightSyncError,
    WeightSyncReceiver,
    WeightSyncSender,
    apply_delta,
    decode_full,
    encode_delta,
    encode_full,
    read_header,
    state_digest,
)

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: Tensor) -> Tensor:
    """The tensor's bit pattern as integers, so NaN payloads and -0.0 compare exactly."""
    return t.detach().contiguous().view(_INT_VIEW[t.dtype.itemsize])


def assert_bitwise_equal(got: dict[str, Tensor], want: dict[str, Tensor]) -> None:
    assert list(got) == list(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype, name
        assert got[name].shape == tensor.shape, name
        assert torch.equal(bits(got[name]), bits(tensor)), name


def snapshot(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def tiny_model(dtype: torch.dtype = torch.float32, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 128), nn.LayerNorm(128), nn.GELU(), nn.Linear(128, 64)).to(dtype)


def adamw_step(model: nn.Module, optimizer: torch.optim.Optimizer, dtype: torch.dtype, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 64, generator=gen).to(dtype)
    optimizer.zero_grad()
    model(x).float().pow(2).mean().backward()
    optimizer.step()


def odd_bits_state() -> dict[str, Tensor]:
    """Tensors whose bit patterns a float comparison would blur: NaN payloads, -0.0, infinities, subnormals."""
    nan_payload = torch.tensor([0x7FC00001, 0x7FA00000, -0x00400001], dtype=torch.int32).view(torch.float32)
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), 1e-45, -1e-45])
    return {
        "nan_payloads": nan_payload.clone(),
        "special": special,
        "bf16": torch.tensor([-0.0, float("nan"), 1.5, -2.25], dtype=torch.bfloat16),
        "fp16": torch.tensor([[65504.0, -0.0], [6e-8, float("nan")]], dtype=torch.float16),
        "scalar": torch.tensor(3.0, dtype=torch.float64),
        "empty": torch.empty(0, 7),
        "mask": torch.tensor([True, False, True]),
        "steps": torch.arange(5, dtype=torch.int64),
    }


# --- full blobs ----------------------------------------------------------------------------------------------------


def test_a_full_blob_rebuilds_odd_bit_patterns_exactly() -> None:
    state = odd_bits_state()
    assert_bitwise_equal(decode_full(encode_full(state, version=7)), state)
    assert read_header(encode_full(state, version=7)).version == 7


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_full_blob_rebuilds_a_model_state_exactly(dtype: torch.dtype) -> None:
    state = snapshot(tiny_model(dtype))
    assert_bitwise_equal(decode_full(encode_full(state)), state)


def test_small_chunks_round_trip_tensors_that_span_several_chunks() -> None:
    prev = snapshot(tiny_model())
    new = {k: v + 1e-4 for k, v in prev.items()}
    assert_bitwise_equal(decode_full(encode_full(new, chunk_elements=100)), new)
    assert_bitwise_equal(apply_delta(prev, encode_delta(prev, new, chunk_elements=100)), new)


def test_decode_full_refuses_a_delta_blob() -> None:
    prev = odd_bits_state()
    with pytest.raises(WeightSyncError, match="apply_delta"):
        decode_full(encode_delta(prev, prev))


def test_a_truncated_or_foreign_blob_is_refused() -> None:
    blob = encode_full(snapshot(tiny_model()), threads=0)
    with pytest.raises(WeightSyncError):
        decode_full(blob[:-100])
    with pytest.raises(WeightSyncError, match="magic"):
        decode_full(b"PK\x03\x04" + blob[4:])


# --- deltas --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chained_deltas_after_adamw_steps_rebuild_each_version_bit_for_bit(dtype: torch.dtype) -> None:
    model = tiny_model(dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sender, receiver = WeightSyncSender(), WeightSyncReceiver()
    kinds = []
    for step in range(5):
        update = sender.push(model.state_dict())
        kinds.append(update.kind)
        assert update.version == step
        assert update.base_version == (None if step == 0 else step - 1)
        assert_bitwise_equal(receiver.receive(update.blob), snapshot(model))
        assert receiver.version == step
        adamw_step(model, optimizer, dtype, seed=step)
    assert kinds == ["full", "delta", "delta", "delta", "delta"]


def test_a_delta_carries_nan_and_signed_zero_flips_exactly() -> None:
    prev = odd_bits_state()
    new = copy.deepcopy(prev)
    new["special"][0] = -0.0  # +0.0 -> -0.0 differs only in the sign bit
    new["nan_payloads"][1] = float("nan")  # one NaN payload for another
    new["bf16"][1] = -0.0
    new["mask"][1] = True
    blob = encode_delta(prev, new, base_version=3)
    assert read_header(blob).version == 4
    assert_bitwise_equal(apply_delta(prev, blob, base_version=3), new)


@pytest.mark.parametrize(("dtype", "lr"), [(torch.float32, 1e-4), (torch.bfloat16, 1e-3)])
def test_a_delta_after_an_optimizer_step_is_much_smaller_than_a_full_blob(dtype: torch.dtype, lr: float) -> None:
    model = tiny_model(dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    prev = snapshot(model)
    adamw_step(model, optimizer, dtype, seed=1)
    full, delta = encode_full(model.state_dict()), encode_delta(prev, model.state_dict())
    # Every weight moves under AdamW, but mostly in its low mantissa bits: the high XOR bytes are zero.
    assert len(delta) < 0.8 * len(full)


def test_a_zero_change_delta_is_tiny() -> None:
    state = snapshot(tiny_model())
    blob = encode_delta(state, state)
    raw = sum(t.numel() * t.element_size() for t in state.values())
    assert len(blob) < 0.01 * raw
    assert len(blob) < 2_000
    assert_bitwise_equal(apply_delta(state, blob), state)


def test_a_delta_applied_to_the_wrong_base_is_refused() -> None:
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    v0 = snapshot(model)
    adamw_step(model, optimizer, torch.float32, seed=0)
    v1 = snapshot(model)
    adamw_step(model, optimizer, torch.float32, seed=1)
    delta_1_to_2 = encode_delta(v1, model.state_dict(), base_version=1)
    with pytest.raises(WeightSyncError, match="wrong base"):
        apply_delta(v0, delta_1_to_2)
    with pytest.raises(WeightSyncError, match="cannot apply to version 0"):
        apply_delta(v1, delta_1_to_2, base_version=0)
    assert_bitwise_equal(apply_delta(v1, delta_1_to_2, base_version=1), snapshot(model))


def test_a_delta_between_different_names_or_shapes_is_refused() -> None:
    state = odd_bits_state()
    renamed = {("renamed" if k == "special" else k): v for k, v in state.items()}
    reshaped = {**state, "special": state["special"].reshape(2, 3)}
    retyped = {**state, "special": state["special"].double()}
    for other, pattern in [(renamed, "names differ"), (reshaped, "special"), (retyped, "float64")]:
        with pytest.raises(WeightSyncError, match=pattern):
            encode_delta(state, other)
        with pytest.raises(WeightSyncError, match=pattern):
            apply_delta(other, encode_delta(state, state))


# --- sender and receiver -------------------------------------------------------------------------------------------


def test_the_receiver_refuses_a_skipped_delta_and_resyncs_from_a_full_blob() -> None:
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sender, receiver = WeightSyncSender(), WeightSyncReceiver()
    receiver.receive(sender.push(model.state_dict()).blob)
    adamw_step(model, optimizer, torch.float32, seed=0)
    sender.push(model.state_dict())  # version 1 is lost in transit
    adamw_step(model, optimizer, torch.float32, seed=1)
    update = sender.push(model.state_dict())
    with pytest.raises(WeightSyncError, match="cannot apply to version 0"):
        receiver.receive(update.blob)
    assert receiver.version == 0

    sender.reset()
    adamw_step(model, optimizer, torch.float32, seed=2)
    update = sender.push(model.state_dict())
    assert (update.kind, update.version) == ("full", 3)
    assert_bitwise_equal(receiver.receive(update.blob), snapshot(model))
    assert receiver.version == 3


def test_the_receiver_detects_weights_changed_in_place_behind_its_back() -> None:
    model = tiny_model()
    sender, receiver = WeightSyncSender(), WeightSyncReceiver()
    state = receiver.receive(sender.push(model.state_dict()).blob)
    state["0.weight"][0, 0] += 1.0
    with torch.no_grad():
        model.state_dict()["0.bias"].add_(0.5)
    with pytest.raises(WeightSyncError, match="full sync"):
        receiver.receive(sender.push(model.state_dict()).blob)


def test_a_delta_before_any_full_sync_is_refused() -> None:
    state = odd_bits_state()
    with pytest.raises(WeightSyncError, match="before any full sync"):
        WeightSyncReceiver().receive(encode_delta(state, state))
    with pytest.raises(WeightSyncError, match="no weights"):
        _ = WeightSyncReceiver().state


def test_the_sender_caches_a_copy_so_in_place_training_still_yields_correct_deltas() -> None:
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sender = WeightSyncSender(threads=0)
    first = sender.push(model.state_dict())
    adamw_step(model, optimizer, torch.float32, seed=0)  # mutates the very tensors the sender just saw
    delta = sender.push(model.state_dict())
    assert_bitwise_equal(apply_delta(decode_full(first.blob), delta.blob, base_version=0), snapshot(model))


def test_versions_must_increase_and_stats_describe_the_blob() -> None:
    state = snapshot(tiny_model())
    sender = WeightSyncSender()
    update = sender.push(state, version=10)
    assert update.stats.bytes == len(update.blob)
    assert update.stats.seconds >= 0
    assert 0 < update.stats.ratio_vs_full < 1  # layer-norm ones and zeros compress
    assert sender.push(state).version == 11
    assert sender.push(state).stats.ratio_vs_full < 0.01
    with pytest.raises(WeightSyncError, match="does not follow"):
        sender.push(state, version=12)


def test_the_digest_names_the_state_not_the_encoding() -> None:
    state = snapshot(tiny_model())
    blob = encode_full(state, level=1, chunk_elements=50)
    assert read_header(blob).digest == state_digest(state) == state_digest(decode_full(blob))
    assert state_digest({**state, "extra": torch.zeros(1)}) != state_digest(state)
