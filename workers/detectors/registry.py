"""Every detector in this package, found by module, and the run spec's `detectors` setting.

Adding a detector is adding one module to `workers/detectors/` (a generic one) or to a domain package's
`detectors/` (`workers/coding/detectors/`, found by `workers.discovery`): `discover` imports every module of
those packages (except `base`, `registry` and private `_` modules) and takes the one `Detector` subclass each
defines. A module that defines none or several, or whose detector's name differs from the module's name, fails
the import with a message saying so: a half-written detector must not be skipped silently.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping, Sequence
from functools import cache
from types import ModuleType
from typing import Any

from pydantic import ConfigDict, Field, PrivateAttr, RootModel, ValidationError, model_validator
from pydantic_core import PydanticUndefined

from workers.detectors.base import (
    Detector,
    DetectorParams,
    RunDetector,
    RunSeries,
    Scope,
    TrajectoryDetector,
    suggest_turn_penalty,
)
from workers.discovery import domain_modules, submodules
from workers.findings import SEVERITIES, SEVERITY_RANK, Finding

_NOT_DETECTORS = frozenset({"base", "registry"})
MAX_VERSION_CHARS = 16  # apps.review.models.Flag.detector_version
MAX_NAME_CHARS = 64  # apps.review.models.Flag.detector


class DetectorDefinitionError(RuntimeError):
    """A module of workers/detectors/ does not define a usable detector."""


def _check(detector: Detector[Any], module_name: str, where: str) -> None:
    problems: list[str] = []
    if getattr(detector, "name", None) != module_name:
        problems.append(f"name must be {module_name!r} (the module's name), got {getattr(detector, 'name', None)!r}")
    version = getattr(detector, "version", None)
    if not isinstance(version, str) or not 1 <= len(version) <= MAX_VERSION_CHARS:
        problems.append(f"version must be a string of 1-{MAX_VERSION_CHARS} characters, got {version!r}")
    if len(module_name) > MAX_NAME_CHARS:
        problems.append(f"the name must be at most {MAX_NAME_CHARS} characters")
    params = getattr(detector, "Params", None)
    if not (isinstance(params, type) and issubclass(params, DetectorParams)):
        problems.append("Params must be a subclass of workers.detectors.base.DetectorParams")
    else:
        if "enabled" in params.model_fields:
            problems.append("Params must not have a field named 'enabled' (the config's on/off switch)")
        for field_name, info in params.model_fields.items():
            if info.is_required():
                problems.append(f"Params.{field_name} needs a default (a run spec may leave it out)")
            if not info.description:
                problems.append(f"Params.{field_name} needs a description naming its unit and meaning")
    if not getattr(detector, "description", ""):
        problems.append("description must say what the detector flags")
    if problems:
        raise DetectorDefinitionError(f"{where}: " + "; ".join(problems))


def _detector_modules() -> list[ModuleType]:
    """The generic detectors of this package, then each domain package's (`workers/<domain>/detectors/`)."""
    import workers.detectors as package  # local: the package's __init__ imports this module

    modules = [module for module in submodules(package) if module.__name__.rsplit(".", 1)[1] not in _NOT_DETECTORS]
    for domain in domain_modules("detectors"):
        modules.extend(submodules(domain))
    return modules


def discover() -> dict[str, Detector[Any]]:
    """One instance of every detector, by name (sorted): those of this package and of every domain package."""
    found: dict[str, Detector[Any]] = {}
    for module in _detector_modules():
        short = module.__name__.rsplit(".", 1)[1]
        where = module.__name__.replace(".", "/") + ".py"
        classes = [
            obj
            for obj in vars(module).values()
            if isinstance(obj, type)
            and issubclass(obj, (TrajectoryDetector, RunDetector))
            and obj.__module__ == module.__name__
            and not inspect.isabstract(obj)
        ]
        if len(classes) != 1:
            names = ", ".join(cls.__name__ for cls in classes) or "none"
            raise DetectorDefinitionError(
                f"{where} must define exactly one TrajectoryDetector or RunDetector subclass, found {names}"
            )
        detector: Detector[Any] = classes[0]()
        _check(detector, short, where)
        if short in found:
            raise DetectorDefinitionError(f"{where}: a detector named {short!r} is already defined elsewhere")
        found[short] = detector
    return dict(sorted(found.items()))


@cache
def detectors() -> dict[str, Detector[Any]]:
    """Every detector, by name; discovered once per process."""
    return discover()


def get_detector(name: str) -> Detector[Any]:
    known = detectors()
    if name not in known:
        raise KeyError(_unknown_name(name, known))
    return known[name]


def _unknown_name(name: str, known: Mapping[str, object]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown detector {name!r}{hint}; the detectors are {', '.join(known)}"


def _normalise_entry(name: str, detector: Detector[Any], raw: object) -> dict[str, Any]:
    """One entry of the config, checked: `{"enabled": bool, **thresholds}` with every threshold filled in."""
    settings = ["enabled", *detector.Params.model_fields]
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ValueError(f'detector {name!r}: expected an object like {{"enabled": true}}, got {type(raw).__name__}')
    unknown = [str(key) for key in raw if key not in settings]
    if unknown:
        raise ValueError(
            f"detector {name!r} has no setting {', '.join(repr(k) for k in unknown)}; its settings are "
            f"{', '.join(settings)}"
        )
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ValueError(f"detector {name!r}: 'enabled' must be true or false, got {enabled!r}")
    try:
        params = detector.Params.model_validate({k: v for k, v in raw.items() if k != "enabled"})
    except ValidationError as exc:
        parts = []
        for error in exc.errors(include_url=False):
            where = ".".join(str(part) for part in error["loc"])
            parts.append(f"{where}: {error['msg']}" if where else str(error["msg"]))
        raise ValueError(f"detector {name!r}: " + "; ".join(parts)) from None
    return {"enabled": enabled, **params.model_dump(mode="json")}


class DetectorConfig(RootModel[dict[str, dict[str, Any]]]):
    """Which detectors run and with what thresholds, as a run spec holds it: `{name: {"enabled": bool,
    **thresholds}}`. A detector left out runs with its defaults; `{"repetition": {"enabled": false}}` turns one
    off. As with `extra="forbid"` at both levels, an unknown detector name (checked against the registry) or an
    unknown setting (each entry is checked by its detector's `Params`, which forbid extras) is refused with a
    message naming it and the valid choices. Validated, it holds every detector with every threshold filled in, so
    the run's spec records exactly what ran."""

    model_config = ConfigDict(frozen=True)
    root: dict[str, dict[str, Any]] = Field(default_factory=dict)
    _params: dict[str, DetectorParams] = PrivateAttr(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _complete(cls, data: Any) -> dict[str, dict[str, Any]]:
        if isinstance(data, DetectorConfig):
            return dict(data.root)
        if data is None or data is PydanticUndefined:  # DetectorConfig(): every detector with its defaults
            data = {}
        if not isinstance(data, Mapping):
            raise ValueError(
                f'expected an object of detector settings like {{"repetition": {{"enabled": false}}}}, '
                f"got {type(data).__name__}"
            )
        known = detectors()
        unknown = [str(name) for name in data if name not in known]
        if unknown:
            raise ValueError("; ".join(_unknown_name(name, known) for name in unknown))
        return {name: _normalise_entry(name, detector, data.get(name)) for name, detector in known.items()}

    def model_post_init(self, context: Any, /) -> None:
        known = detectors()
        self._params = {
            name: known[name].Params.model_validate({k: v for k, v in entry.items() if k != "enabled"})
            for name, entry in self.root.items()
            if name in known
        }

    def enabled(self, scope: Scope | None = None) -> list[str]:
        """Names of the enabled detectors (of `scope` when given), in name order."""
        known = detectors()
        return [
            name
            for name, entry in self.root.items()
            if entry.get("enabled", True) and name in known and (scope is None or known[name].scope == scope)
        ]

    def params_for(self, name: str) -> DetectorParams:
        if name not in self._params:
            raise KeyError(_unknown_name(name, detectors()))
        return self._params[name]


def default_detector_config() -> DetectorConfig:
    """Every detector enabled with its default thresholds."""
    return DetectorConfig.model_validate({})


def _as_config(config: DetectorConfig | Mapping[str, Any] | None) -> DetectorConfig:
    if isinstance(config, DetectorConfig):
        return config
    return DetectorConfig.model_validate(dict(config or {}))


def _one_per_detector(findings: Sequence[Finding]) -> list[Finding]:
    """The most severe finding of each detector (the first among equals): a flag is unique per detector."""
    best: dict[str, Finding] = {}
    for finding in findings:
        kept = best.get(finding.detector)
        if kept is None or SEVERITY_RANK[finding.severity] > SEVERITY_RANK[kept.severity]:
            best[finding.detector] = finding
    return list(best.values())


def run_detectors(record: Mapping[str, Any], config: DetectorConfig | Mapping[str, Any] | None = None) -> list[Finding]:
    """Run every enabled trajectory detector on one record; at most one finding per detector, in name order.

    `config` None runs every detector with its defaults. Pure: no I/O, microseconds to a few milliseconds for a
    long trajectory."""
    config = _as_config(config)
    known = detectors()
    findings: list[Finding] = []
    for name in config.enabled("trajectory"):
        detector = known[name]
        assert isinstance(detector, TrajectoryDetector)
        findings += _one_per_detector(detector.detect(record, config.params_for(name)))
    return findings


def run_run_detectors(series: RunSeries, config: DetectorConfig | Mapping[str, Any] | None = None) -> list[Finding]:
    """Run every enabled run-scope detector on a run's metric series (`RunSeries`: name -> (step, value)
    points); at most one finding per detector."""
    config = _as_config(config)
    known = detectors()
    findings: list[Finding] = []
    for name in config.enabled("run"):
        detector = known[name]
        assert isinstance(detector, RunDetector)
        findings += _one_per_detector(detector.detect(series, config.params_for(name)))
    return findings


def flag_metrics(
    findings_per_trajectory: Sequence[Sequence[Finding]], config: DetectorConfig | Mapping[str, Any] | None = None
) -> dict[str, float]:
    """Per-step flag rates over a step's trajectories (one findings list per trajectory, flagged or not):
    `flags/rate` is the fraction of trajectories with at least one finding, `flags/<detector>` the fraction each
    enabled trajectory detector flagged (0 included, so every chart has a line). {} with no trajectories."""
    total = len(findings_per_trajectory)
    if total == 0:
        return {}
    config = _as_config(config)
    per_detector = dict.fromkeys(config.enabled("trajectory"), 0)
    flagged = 0
    for findings in findings_per_trajectory:
        if findings:
            flagged += 1
        for name in {finding.detector for finding in findings}:
            per_detector[name] = per_detector.get(name, 0) + 1
    metrics = {"flags/rate": flagged / total}
    metrics.update({f"flags/{name}": count / total for name, count in per_detector.items()})
    return metrics


def suggest_penalty(spec: dict[str, Any], detector: str) -> tuple[dict[str, Any], str]:
    """(proposed reward spec, one-line reason) for a confirmed hack flagged by `detector`: that detector's own
    `suggest`, else the generic turn penalty. A name no longer registered (a flag raised by a detector since
    removed) still gets the generic suggestion, so old flags can be confirmed. `spec` is not modified; the
    proposal always differs from it."""
    known = detectors().get(detector)
    suggestion = known.suggest(spec) if known is not None else None
    return suggestion if suggestion is not None else suggest_turn_penalty(spec, detector)


__all__ = [
    "SEVERITIES",
    "DetectorConfig",
    "DetectorDefinitionError",
    "default_detector_config",
    "detectors",
    "discover",
    "flag_metrics",
    "get_detector",
    "run_detectors",
    "run_run_detectors",
    "suggest_penalty",
]
