"""Fixtures of the real-time tests: a gate with two checkpoints of the tiny model, the second deployed."""

from __future__ import annotations

from typing import Any

import pytest

from apps.gates.models import Deployment, Gate
from tests.factories import checkpoint_for, coding_version


@pytest.fixture
def gate_with_deployment(users, tmp_path) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    owner = users["admin"]
    gate = Gate.objects.create(name="rt-gate", rules=[{"type": "approval"}], owner=owner)
    gate.benchmark_versions.set([coding_version(owner=owner, name="rt-bench")])
    first, second = (checkpoint_for(owner=owner, tmp_path=tmp_path, step=step) for step in (1, 2))
    old = Deployment.objects.create(gate=gate, checkpoint=first, created_by=owner, is_current=False)
    current = Deployment.objects.create(gate=gate, checkpoint=second, created_by=owner)
    return {"gate": gate, "checkpoints": [first, second], "deployment": current, "old_deployment": old}
