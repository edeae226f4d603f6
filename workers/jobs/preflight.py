"""A job's first action: have every model it names on this worker, or fail the run within seconds saying why.

The control plane checks only what it can see (a name's form, a Hub config when the Hub answers); the model lives
on the workers. So before any rollout or training starts, each model field of the spec that is a Hub id or a path
is resolved here: a Hub id is downloaded into the shared cache (its progress reaches the run page's log as it
downloads), a path must hold a config.json, the config must be a causal LM, and a training run's memory estimate is
checked against what it asked for. What was resolved goes into the run's summary under `models` (for a Hub id the
commit hash, so what was trained is reproducible, and the model card the run page shows).
"""

from __future__ import annotations

import json
import time
from typing import Any

from workers.models.hub import (
    ModelUnavailable,
    causal_lm_problem,
    classify_model_name,
    hub_endpoint,
    model_card,
    resolve_hub_model,
)
from workers.models.registry import BUILTINS, resolve_base_model
from workers.reporting import Reporter
from workers.rl.config import TrainConfig, memory_problem, shape_from_hf_config
from workers.specs import JobSpec

MODEL_FIELDS = ("base_model", "teacher_model", "model")
"""Fields that name a model, on the spec itself or on its `config`."""


def model_fields(spec: JobSpec) -> dict[str, str]:
    """Each field of `spec` (and of its `config`) that names a Hub id or a path, by its dotted name."""
    found: dict[str, str] = {}
    for prefix, holder in (("", spec), ("config.", getattr(spec, "config", None))):
        for name in MODEL_FIELDS:
            value = getattr(holder, name, None)
            if isinstance(value, str) and classify_model_name(value, frozenset(BUILTINS)) in ("hub", "path"):
                found[prefix + name] = value
    return found


def preflight_models(spec: JobSpec, reporter: Reporter) -> dict[str, dict[str, Any]]:
    """Resolve every Hub id or path `spec` names (see the module docstring); raises `ModelUnavailable` naming the
    field, the model and the reason. Returns what it recorded in the run's summary."""
    records: dict[str, dict[str, Any]] = {}
    for field, name in model_fields(spec).items():
        try:
            records[field] = _resolve(name, reporter)
        except ModelUnavailable as exc:
            raise ModelUnavailable(f"{field}: {exc}") from None
        config = json.loads((records[field].pop("path") / "config.json").read_text())
        if problem := causal_lm_problem(config):
            raise ModelUnavailable(f"{field}: {name}: {problem}")
        train = getattr(spec, "config", None)
        if field == "config.base_model" and isinstance(train, TrainConfig):
            try:
                found = memory_problem(train, shape_from_hf_config(config))
            except (KeyError, TypeError, ValueError):
                found = None  # a config without the usual size fields: nothing to estimate from
            if found is not None:
                raise ModelUnavailable(f"{found[0]}: {name} is too large for the memory this run asked for: {found[1]}")
    if records:
        reporter.summary({"models": records})
    return records


def _resolve(name: str, reporter: Reporter) -> dict[str, Any]:
    if classify_model_name(name, frozenset(BUILTINS)) == "path":
        path = resolve_base_model(name)
        return {"source": "path", "id": name, "card": model_card(path, {}), "path": path}
    reporter.log(f"model {name}: resolving on {hub_endpoint()}")
    last = [0.0]

    def progress(done: int, total: int, filename: str) -> None:
        # Log lines, not progress events: the run's progress counts its steps, and the page shows it as such.
        now = time.monotonic()
        if done == total or now - last[0] > 2.0:  # a line per file would flood the log for sharded weights
            reporter.log(f"model {name}: {done / 1e6:.1f} of {total / 1e6:.1f} MB ({filename})")
            last[0] = now

    resolved = resolve_hub_model(name, progress=progress)
    where = "from the cache" if resolved.from_cache else "downloaded"
    reporter.log(f"model {name}: commit {resolved.commit} {where} at {resolved.path}")
    return {**resolved.record(), "path": resolved.path}
