"""The run-kind registry: how apps plug their kinds of run into the one Run lifecycle that `apps.runs` owns.

`apps.runs` knows no kind. The app that owns a kind registers a `RunKindHandler` from its `hooks` module
(imported by apps.common once the app registry is ready)
(the job spec its worker parses, what to do when a run succeeds or writes checkpoints, and optionally how
`POST /api/v1/runs/` launches it); other apps subscribe to a kind's lifecycle points by name. Registration is
explicit and ordered (the owner's hook first, then subscribers in INSTALLED_APPS order), never a Django signal,
and each hook runs as its own retried Celery task (`apps.runs.tasks`), so one failing listener retries alone and
its name shows in the worker log. A system check (`apps.runs.checks`) fails `manage.py check` when a kind has no
handler. NetBox's `registry` and healthchecks' one-table-per-kind are the models.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from django.core.exceptions import ImproperlyConfigured
from rest_framework.serializers import Serializer

from apps.accounts.models import User
from apps.runs.models import Run, RunKind
from workers.specs import JobSpec

KIND_NAME = re.compile(r"[a-z][a-z0-9_-]{0,15}")
"""A kind's name: it fits Run.kind (16 characters) and reads well in URLs and filters."""

LifecyclePoint = Literal["succeeded", "checkpoints"]
LIFECYCLE_POINTS: tuple[LifecyclePoint, ...] = ("succeeded", "checkpoints")

SucceededHook = Callable[..., None]
"""Called as hook(run_id=...) after a run's status committed as succeeded; must be idempotent."""
CheckpointsHook = Callable[..., None]
"""Called as hook(run_id=..., steps=[...]) after new checkpoints of a run committed; must be idempotent."""


@dataclass(frozen=True)
class RunKindHandler:
    kind: str
    app: str
    """The label of the app that owns the kind (named in errors and in `manage.py run_kinds`)."""
    job_spec: type[JobSpec] | None
    """The worker's own schema: what `run_create` validates the job input against, and its entrypoint module. None
    for a kind whose work runs outside Crucible (`external`: a trainer reporting through the SDK): its runs are
    created running, never dispatched to Ray, and end when their reporter says so."""
    on_succeeded: SucceededHook | None = None
    on_checkpoints: CheckpointsHook | None = None
    launch_input: type[Serializer] | None = None
    """With `launch`: makes `POST /api/v1/runs/ {"kind": ...}` launch this kind (its body validated by this)."""
    launch: Callable[[User, dict[str, Any]], Run] | None = None
    job_from_row: Callable[[Run], dict[str, Any]] | None = None
    """Builds the job input of a row created before `spec["job"]` held it (runs made by an older version)."""


_handlers: dict[str, RunKindHandler] = {}
_subscribers: dict[tuple[str, str], dict[str, Callable[..., None]]] = {}


def register(handler: RunKindHandler) -> None:
    if not KIND_NAME.fullmatch(str(handler.kind)):
        raise ImproperlyConfigured(
            f"{handler.app} registers run kind {handler.kind!r}: use 1-16 lowercase letters, digits, '_' or '-'"
        )
    if handler.job_spec is not None and not handler.job_spec.entrypoint:
        raise ImproperlyConfigured(f"run kind {handler.kind!r}: {handler.job_spec.__name__} names no entrypoint")
    if handler.job_spec is None and (handler.launch is not None or handler.job_from_row is not None):
        raise ImproperlyConfigured(f"run kind {handler.kind!r} has no job spec: it cannot be launched onto Ray")
    if (handler.launch is None) != (handler.launch_input is None):
        raise ImproperlyConfigured(f"run kind {handler.kind!r}: give both launch and launch_input, or neither")
    handler = replace(handler, kind=str(handler.kind))  # a plain str (not the enum): it goes into JSON and task args
    current = _handlers.get(handler.kind)
    if current is not None and current != handler:
        raise ImproperlyConfigured(f"run kind {handler.kind!r} is registered twice ({current.app}, {handler.app})")
    _handlers[handler.kind] = handler


def subscribe(kind: str, point: LifecyclePoint, name: str, hook: Callable[..., None]) -> None:
    """Run `hook` (in its own Celery task, after the owner's hook) at `point` of every run of `kind`. `name`
    ("<app>.<what>") identifies it in task arguments and logs, so it must be unique for the (kind, point)."""
    if point not in LIFECYCLE_POINTS:
        raise ImproperlyConfigured(f"unknown lifecycle point {point!r}; use one of {', '.join(LIFECYCLE_POINTS)}")
    hooks = _subscribers.setdefault((kind, point), {})
    if hooks.get(name, hook) is not hook:
        raise ImproperlyConfigured(f"{name!r} subscribes twice to {kind} {point}")
    hooks[name] = hook


def handler_for(kind: str) -> RunKindHandler:
    try:
        return _handlers[kind]
    except KeyError:
        raise ImproperlyConfigured(
            f"run kind {kind!r} has no handler: the app that owns it must call apps.runs.kinds.register() in its "
            "`hooks` module"
        ) from None


def handlers() -> list[RunKindHandler]:
    """Every registered handler: the built-in kinds in RunKind's order, then the others by name."""
    order = {kind: i for i, kind in enumerate(RunKind.values)}
    return sorted(_handlers.values(), key=lambda h: (order.get(h.kind, len(order)), h.kind))


def job_spec_for(kind: str) -> type[JobSpec]:
    """The job spec of a kind that runs on Ray; an `ImproperlyConfigured` naming it for a kind that runs elsewhere."""
    spec = handler_for(kind).job_spec
    if spec is None:
        raise ImproperlyConfigured(f"run kind {kind!r} runs outside Crucible: it has no Ray job")
    return spec


def external_kinds() -> list[str]:
    """The kinds whose runs are trained elsewhere and only report (never dispatched, never reconciled with Ray)."""
    return [h.kind for h in handlers() if h.job_spec is None]


def launchable() -> dict[str, RunKindHandler]:
    """The kinds `POST /api/v1/runs/` launches, by name."""
    return {str(h.kind): h for h in handlers() if h.launch is not None}


def subscribers(kind: str, point: LifecyclePoint) -> dict[str, Callable[..., None]]:
    return dict(_subscribers.get((kind, point), {}))


def has_hooks(kind: str, point: LifecyclePoint) -> bool:
    """Whether anything reacts at `point` (ingest skips queueing a task for nothing)."""
    handler = _handlers.get(kind)
    owner = handler is not None and (handler.on_succeeded if point == "succeeded" else handler.on_checkpoints)
    return bool(owner) or bool(_subscribers.get((kind, point)))
