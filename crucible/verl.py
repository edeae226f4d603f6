"""verl's tracking backends, for Crucible: `CrucibleTracker`.

verl's trainer logs through `verl.utils.tracking.Tracking`, which keeps one logger object per backend in its
`logger` dict and calls `logger[name].log(data=metrics, step=step)` on each step and `finish()` when it is done.
`CrucibleTracker` has that interface, so a verl run reports to Crucible with:

    from verl.utils.tracking import Tracking
    from crucible.verl import CrucibleTracker
    tracking = Tracking(project_name=..., experiment_name=..., default_backend=["console"], config=config)
    tracking.logger["crucible"] = CrucibleTracker(project_name, experiment_name, config)

This adapter was written against verl's interface as its source describes it and is tested through that interface
(`log(data, step)`, `finish()`) here; it has not been run inside a verl trainer (verl is not installed in this
project's environment). Rollouts are not trajectories in verl's tracker: log them with `tracker.run.log_trajectories`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from crucible.run import Run, init


class CrucibleTracker:
    """A verl tracking backend reporting to Crucible (see the module docstring)."""

    def __init__(
        self, project_name: str, experiment_name: str = "", config: Mapping[str, Any] | None = None, **kw: Any
    ):
        flat = _plain(config or {})
        model = flat.get("actor_rollout_ref", {}).get("model", {}).get("path", "") if isinstance(flat, dict) else ""
        self.run: Run = init(
            project_name, experiment_name, config=flat, base_model=str(model or ""), tags=["verl"], **kw
        )

    def log(self, data: Mapping[str, Any], step: int) -> None:
        self.run.log({k: v for k, v in data.items() if isinstance(v, int | float)}, step=int(step))

    def finish(self, exit_code: int = 0) -> None:
        self.run.finish("" if exit_code == 0 else f"verl exited with code {exit_code}")


def _plain(config: Any) -> Any:
    """A config as plain JSON values (verl passes an OmegaConf DictConfig, which is a Mapping; ListConfig a list)."""
    if isinstance(config, Mapping):
        return {str(k): _plain(v) for k, v in config.items()}
    if isinstance(config, Sequence) and not isinstance(config, str | bytes):
        return [_plain(v) for v in config]
    return config if isinstance(config, str | int | float | bool) or config is None else str(config)
