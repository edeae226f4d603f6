"""Frozen models shared within a process: a sub-agent's checkpoint (workers.swarm.subagents) or a reward model's
judge (workers.rewards.judge) is loaded once per process by the transformers backend and never trained."""

from __future__ import annotations

import threading
from typing import Any

from workers.models.registry import resolve_base_model

_backends: dict[str, tuple[Any, threading.Lock]] = {}
_backends_lock = threading.Lock()


def frozen_backend(checkpoint: str) -> tuple[Any, threading.Lock]:
    """The transformers backend of `checkpoint` (a built-in name or a model directory), loaded once per process,
    and the lock that keeps two threads from generating on it at once."""

    path = str(resolve_base_model(checkpoint))
    with _backends_lock:
        if path not in _backends:
            from workers.models.hf import HFBackend  # local: it loads torch (the control plane imports this module)

            _backends[path] = (HFBackend(path), threading.Lock())
        return _backends[path]
