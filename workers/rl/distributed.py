"""The learner past one process: torch.distributed process groups, DDP and FSDP2 wrapping, the batch split across
ranks, and sharded checkpoints (`torch.distributed.checkpoint`) that load on any world size.

Everything here is torch's own machinery (no home-made collectives): `init_process_group` with gloo on CPU and
NCCL on GPU, `DistributedDataParallel`, FSDP2's `fully_shard`, `all_reduce` for the step's metrics, and DCP for
checkpoints. `workers.rl.learner.Learner` uses these when `TrainConfig.learner.strategy` is ddp or fsdp2, and
`workers.rl.learner_group.LearnerGroup` starts its ranks as Ray actors.

Why a step does not depend on the world size: every rank receives the whole rollout batch, computes the same
advantages and the same normalisers (docs/methods.md P1-P5: sequences of the batch, tokens of its trained groups),
then trains only its share of the samples. Each rank's loss is already divided by the whole batch's normaliser,
so the batch's gradient is the *sum* of the ranks' gradients; DDP and FSDP2 average over ranks, so each rank
scales its loss by the world size before backward. Ranks whose share has fewer micro-batches run the first
sample of the batch with its loss times zero, so every rank joins the same number of collectives.
"""

from __future__ import annotations

import contextlib
import datetime
import socket
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from workers.rl.config_sections import LearnerConfig
from workers.rl.packing import completion_logprobs

__all__ = [
    "LogprobForward",
    "free_port",
    "init_process_group",
    "rank_and_world",
    "shard_by_tokens",
    "wrap",
]


def free_port() -> int:
    """A TCP port free on this host now (for the process group's rendezvous on rank 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        port: int = sock.getsockname()[1]
        return port


def init_process_group(rank: int, world_size: int, address: str, port: int, *, device: str = "cpu") -> None:
    """Join the process group `address:port` as `rank` of `world_size`: gloo on CPU, NCCL on GPU."""
    if dist.is_initialized():
        return
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":  # Ray gives each rank its own GPU as device 0 (CUDA_VISIBLE_DEVICES)
        torch.cuda.set_device(torch.device(device).index or 0)
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{address}:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(minutes=30),
    )


def rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def shard_by_tokens(tokens: Sequence[int], world_size: int) -> list[list[int]]:
    """Split items (their token counts) across `world_size` ranks, balancing tokens: longest first, each to the
    rank with the fewest tokens so far (ties: the lowest rank). Deterministic, so every rank computes the same
    split from the same batch. Each rank's indices come back in ascending order."""
    if world_size < 1:
        raise ValueError(f"world_size={world_size}: must be at least 1")
    shares: list[list[int]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for index in sorted(range(len(tokens)), key=lambda i: (-tokens[i], i)):
        rank = min(range(world_size), key=lambda r: (load[r], r))
        shares[rank].append(index)
        load[rank] += tokens[index]
    return [sorted(share) for share in shares]


class LogprobForward(nn.Module):
    """The policy's log-prob computation as one module forward, so DDP's and FSDP2's forward hooks run around it
    (`completion_logprobs` calls the decoder and the LM head itself, never the causal LM's own forward).

    `copy_outputs` (FSDP2): completion_logprobs returns slices of one tensor; FSDP2 hooks each output for its
    backward and warns that an in-place op on a view would skip that hook, so the slices are copied (cheap next to
    the forward). The other strategies return them as they are."""

    def __init__(self, model: nn.Module, *, copy_outputs: bool = False) -> None:
        super().__init__()
        self.model = model
        self.copy_outputs = copy_outputs

    def forward(self, sequences: list[list[int]], starts: list[int], **options: Any) -> Any:
        out = completion_logprobs(self.model, sequences, starts, **options)
        if not self.copy_outputs:
            return out
        if isinstance(out, tuple):
            return [t.clone() for t in out[0]], out[1]
        return [t.clone() for t in out]


def _block_classes(model: nn.Module) -> tuple[type[nn.Module], ...]:
    """The transformer block classes of a transformers model (`_no_split_modules`), each sharded on its own."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    classes = {type(m) for m in model.modules() if type(m).__name__ in names}
    if not classes:
        raise ValueError(
            f"{type(model).__name__} names no transformer block class (_no_split_modules): FSDP2 cannot shard it "
            "per block; use learner.strategy ddp"
        )
    return tuple(classes)


def wrap(model: nn.Module, config: LearnerConfig, device: torch.device, *, trainable: bool = True) -> nn.Module:
    """The module the learner runs forward through: `LogprobForward(model)`, under DDP or sharded with FSDP2
    (every transformer block, then the rest at the root; in place: `model`'s parameters become DTensors). A
    frozen model (the reference policy) is sharded under FSDP2 and left as is under DDP (it has no gradients to
    reduce)."""
    engine = LogprobForward(model, copy_outputs=config.strategy == "fsdp2")
    if config.strategy == "single":
        return engine
    if config.strategy == "ddp":
        if not trainable:
            return engine
        from torch.nn.parallel import DistributedDataParallel

        ids = (
            [device.index if device.index is not None else torch.cuda.current_device()]
            if device.type == "cuda"
            else None
        )
        return DistributedDataParallel(engine, device_ids=ids)
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    options: dict[str, Any] = {}
    if config.mixed_precision == "bf16":
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if config.cpu_offload:
        options["offload_policy"] = CPUOffloadPolicy()
    blocks = _block_classes(model)
    for module in list(model.modules()):
        if isinstance(module, blocks):
            fully_shard(module, **options)
    fully_shard(engine, **options)
    return engine


def all_reduce_sum(values: Sequence[float]) -> list[float]:
    """Element-wise sums over the ranks (float64); the values themselves on one process."""
    if rank_and_world()[1] == 1:
        return list(values)
    tensor = torch.tensor(list(values), dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.tolist()


def all_reduce_max(value: float) -> float:
    if rank_and_world()[1] == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor.item())


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's full weights gathered to rank 0 on CPU (every rank must call; the others get {})."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state: Any = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return dict(state)


def load_full_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, weights: dict[str, torch.Tensor], optim_state: dict[str, Any]
) -> None:
    """Load a one-process checkpoint (full tensors; torch's optimizer state, keyed by parameter position) into a
    sharded model and optimizer: every rank holds the whole checkpoint and keeps its shards."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, strict=False)
    set_model_state_dict(model, dict[str, Any](weights), options=options)
    # The one-process learner's optimizer lists its parameters in `named_parameters()` order (trainable ones):
    # name them, the form the distributed state-dict API reads.
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    groups = []
    for group in optim_state["param_groups"]:
        groups.append({**group, "params": [names[i] for i in group["params"]]})
    state = {names[i]: value for i, value in optim_state["state"].items()}
    set_optimizer_state_dict(model, optimizer, {"state": state, "param_groups": groups}, options=options)


# --- sharded checkpoints ------------------------------------------------------------------------------------------

SHARDED_FORMAT = "dcp-1"
EXTRA_FILE = "crucible.json"
"""Beside the DCP files: the checkpoint's format, step, version and data position (JSON, rank 0 writes it)."""


def _storage(uri: str, storage_options: dict[str, Any], *, write: bool) -> Any:
    """A DCP writer or reader for a local path or an fsspec URI (s3://..., with the run's storage options)."""
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

    if "://" not in uri or uri.startswith("file://"):
        path = uri.removeprefix("file://")
        if write:
            Path(path).mkdir(parents=True, exist_ok=True)
            return FileSystemWriter(path)
        return FileSystemReader(path)
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

    return FsspecWriter(uri, **storage_options) if write else FsspecReader(uri, **storage_options)


@contextlib.contextmanager
def _one_process_is_meant() -> Iterator[None]:
    """DCP warns when it saves or loads without a process group; one process is what `no_dist` asks for."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save_sharded(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    uri: str,
    extra: dict[str, Any],
    storage_options: dict[str, Any] | None = None,
) -> None:
    """Every rank writes its shards of the model and optimizer state to `uri` (a directory), rank 0 the metadata
    and `extra` (JSON). Full-tensor (DDP, single) and sharded (FSDP2) states are saved under the same parameter
    names, so any world size and strategy can load them."""
    import json

    import fsspec
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    options = storage_options or {}
    distributed = dist.is_available() and dist.is_initialized()
    with _one_process_is_meant():
        dcp.save(
            {"model": model_state, "optim": optim_state},
            storage_writer=_storage(uri, options, write=True),
            no_dist=not distributed,
        )
    if rank_and_world()[0] == 0:
        target = uri if "://" in uri else f"file://{uri}"
        with fsspec.open(f"{target.rstrip('/')}/{EXTRA_FILE}", "w", **options) as handle:
            json.dump({"format": SHARDED_FORMAT, **extra}, handle)
    if distributed:
        dist.barrier()


def read_sharded_extra(uri: str, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    import json

    import fsspec

    target = uri if "://" in uri else f"file://{uri}"
    try:
        with fsspec.open(f"{target.rstrip('/')}/{EXTRA_FILE}", "r", **(storage_options or {})) as handle:
            extra: dict[str, Any] = json.load(handle)
    except FileNotFoundError as exc:
        raise ValueError(f"{uri} is not a sharded Crucible checkpoint: {EXTRA_FILE} is missing") from exc
    if extra.get("format") != SHARDED_FORMAT:
        raise ValueError(f"sharded checkpoint format {extra.get('format')!r} is not {SHARDED_FORMAT}")
    return extra


def load_sharded(
    model: nn.Module, optimizer: torch.optim.Optimizer, uri: str, storage_options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Load a checkpoint written by `save_sharded` at any world size into this rank's model and optimizer (DCP
    reshards on read); returns its `extra`."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    extra = read_sharded_extra(uri, storage_options)
    model_state, optim_state = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_state, "optim": optim_state}
    distributed = dist.is_available() and dist.is_initialized()
    with _one_process_is_meant():
        dcp.load(state, storage_reader=_storage(uri, storage_options or {}, write=False), no_dist=not distributed)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return extra
