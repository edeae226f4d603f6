"""The capacity estimate behaves as its formulas say: DDP replicates, FSDP2 shards the state over the ranks,
offload moves the shard to the host, checkpointing shrinks activations, and bad setups are refused."""

from __future__ import annotations

import pytest

from workers.models.registry import BUILTINS, SMOLLM2, ModelShape
from workers.rl.capacity import GB, HEADROOM, rank_memory

SEVEN_B = ModelShape(parameters=7_615_616_512, layers=28, hidden=3584, vocab=152_064)


def test_ddp_replicates_and_fsdp2_shards_the_sixteen_bytes_per_parameter() -> None:
    ddp = [rank_memory(SEVEN_B, "ddp", n, tokens=4096).device_gb for n in (1, 8, 64)]
    assert ddp[0] == ddp[1] == ddp[2] > 16 * SEVEN_B.parameters / GB
    fsdp = [rank_memory(SEVEN_B, "fsdp2", n, tokens=4096) for n in (1, 8, 64)]
    assert fsdp[0].device_gb > fsdp[1].device_gb > fsdp[2].device_gb
    shard = fsdp[1].parts["weights_grads_adam_shard"]
    assert shard == pytest.approx(16 * SEVEN_B.parameters / 8 / GB, rel=1e-3)


def test_cpu_offload_moves_the_shard_to_the_host_and_bf16_halves_activations() -> None:
    plain = rank_memory(SEVEN_B, "fsdp2", 8, tokens=4096, mixed_precision=True)
    offload = rank_memory(SEVEN_B, "fsdp2", 8, tokens=4096, mixed_precision=True, cpu_offload=True)
    assert offload.host_gb == pytest.approx(plain.parts["weights_grads_adam_shard"] * HEADROOM, rel=1e-2)
    assert offload.device_gb < plain.device_gb
    fp32 = rank_memory(SEVEN_B, "fsdp2", 8, tokens=4096)
    assert plain.parts["activations"] < fp32.parts["activations"]


def test_checkpointing_and_a_reference_model_change_what_they_should() -> None:
    shape = BUILTINS[SMOLLM2].shape
    full = rank_memory(shape, "ddp", 1, tokens=2048)
    checkpointed = rank_memory(shape, "ddp", 1, tokens=2048, gradient_checkpointing=True)
    assert checkpointed.parts["activations"] < full.parts["activations"]
    with_ref = rank_memory(shape, "fsdp2", 4, tokens=2048, reference=True)
    assert with_ref.parts["reference_shard"] == pytest.approx(4 * shape.parameters / 4 / GB, rel=1e-2)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [({"ranks": 0}, "at least 1"), ({"mixed_precision": True}, "FSDP2 options"), ({"cpu_offload": True}, "FSDP2")],
)
def test_impossible_setups_are_refused(kwargs, words) -> None:  # type: ignore[no-untyped-def]
    args = {"ranks": 2, **kwargs}
    with pytest.raises(ValueError, match=words):
        rank_memory(SEVEN_B, "ddp", args.pop("ranks"), tokens=1024, **args)
