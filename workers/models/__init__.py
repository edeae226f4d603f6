"""Policy models for rollouts: the backend contract, base-model resolution and `make_backend`.

Importing this package is cheap (no torch, no transformers); the backends import them when constructed.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from workers.models.base import FinishReason, Generation, PolicyBackend, SamplingParams, encode_chat
from workers.models.registry import (
    BUILTIN_SHAPES,
    BUILTINS,
    SMOLLM2,
    TINY_LLAMA,
    BuiltinModel,
    ModelShape,
    UnknownBaseModel,
    load_tokenizer,
    model_cache_dir,
    model_name_problems,
    resolve_base_model,
    tiny_llama,
)

BackendKind = Literal["transformers", "vllm"]
BACKEND_KINDS: tuple[BackendKind, ...] = ("transformers", "vllm")

__all__ = [
    "BACKEND_KINDS",
    "BUILTINS",
    "BUILTIN_SHAPES",
    "SMOLLM2",
    "TINY_LLAMA",
    "BackendKind",
    "BuiltinModel",
    "FinishReason",
    "Generation",
    "ModelShape",
    "PolicyBackend",
    "SamplingParams",
    "UnknownBaseModel",
    "encode_chat",
    "load_tokenizer",
    "make_backend",
    "model_cache_dir",
    "model_name_problems",
    "resolve_base_model",
    "tiny_llama",
]


def make_backend(kind: BackendKind, model_path: str | os.PathLike[str], **kwargs: Any) -> PolicyBackend:
    """A policy backend of `kind` on `model_path` (a built-in model name or a local model directory).

    `kwargs` go to the backend's constructor: `HFBackend(device, dtype, threads)` for "transformers",
    `VLLMBackend(dtype, gpu_memory_utilization, ...)` for "vllm".
    """
    if kind not in BACKEND_KINDS:
        raise ValueError(f"kind must be one of {', '.join(BACKEND_KINDS)}; got {kind!r}")
    path = resolve_base_model(model_path)
    if kind == "transformers":
        from workers.models.hf import HFBackend  # local: it loads torch, which the control plane never needs

        return HFBackend(path, **kwargs)
    from workers.models.vllm_backend import VLLMBackend  # local: vllm is installed only where GPUs are

    return VLLMBackend(path, **kwargs)
