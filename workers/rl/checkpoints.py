"""A trainer checkpoint's policy as plain weights: what evals, RFT and a new training run start from.

A checkpoint (`Learner.checkpoint_bytes`, or a sharded directory from `Learner.save_sharded`) holds the trainable
parameters (LoRA adapters, or every weight) and the `TrainConfig` that wrote it. `checkpoint_policy_state` rebuilds
a learner on the base model, loads the checkpoint, and returns the policy under the base model's parameter names
(LoRA merged). A run that itself started from a checkpoint (`TrainConfig.checkpoint_uri`) records it in that config,
so its learner starts from it again: chains (RL → RL → RL) resolve by recursion, one level per run.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

from workers.models.registry import resolve_base_model
from workers.rl.config import TrainConfig
from workers.rl.config_sections import LearnerConfig
from workers.rl.distributed import read_sharded_extra
from workers.storage import SHARDED_SUFFIX


def checkpoint_policy_state(
    base_model: str, checkpoint_uri: str, opts: Mapping[str, Any] | None = None, threads: int | None = None
) -> tuple[dict[str, Any], int]:
    """A trainer checkpoint's policy weights under `base_model`'s parameter names (LoRA merged) and its version."""
    import fsspec
    import torch

    from workers.rl.learner import Learner  # local: rl.learner imports this module (a run may start from a checkpoint)

    options = dict(opts or {})
    path = str(resolve_base_model(base_model))
    if checkpoint_uri.rstrip("/").endswith(SHARDED_SUFFIX):  # written by ddp or fsdp2 ranks: loaded on one process
        written = TrainConfig.model_validate(read_sharded_extra(checkpoint_uri, options)["config"])
        single = written.model_copy(update={"learner": LearnerConfig()})
        learner = Learner(path, single, threads=threads, storage_options=options, reader=True)
        learner.load_sharded(checkpoint_uri, options)
    else:
        with fsspec.open(checkpoint_uri, "rb", **options) as handle:
            blob = handle.read()
        payload = torch.load(io.BytesIO(blob), weights_only=False)
        written = TrainConfig.model_validate(payload["config"]).model_copy(update={"learner": LearnerConfig()})
        learner = Learner(path, written, threads=threads, storage_options=options, reader=True)
        learner.load_checkpoint(blob)
    state, version = learner.policy_state(), learner.version
    del learner
    return state, version
