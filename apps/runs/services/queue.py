"""The run queue: a run whose kind declares what it needs from the cluster (`JobSpec.resource_plan`: a training
run's learner ranks and engines) goes to Ray only when the cluster and its owner's GPU quota can hold it. Until
then it is *queued*: a state of its own in the list, the page and the API, with its position and what it waits
for. Ray's own pending state is not the queue (a run in it holds a job slot and says nothing).

- **Capacity** is what the cluster's alive nodes have in all (Ray's state API), or what `CRUCIBLE_CLUSTER_NODES`
  declares when Crucible may use only part of a shared cluster. A run that can never fit (one of its bundles is
  larger than every node, or all of them together more than the cluster) is refused at launch, naming the
  resource and what the cluster has. Without an answer from Ray and without the setting, runs go to Ray at once.
- **What is held** is the sum of the runs admitted and not yet ended (`Run.admitted_at`), counted by Crucible
  itself, so two launches in the same instant never both take the last GPU (admission is serialised by a
  PostgreSQL advisory lock, which also makes two Celery workers safe).
- **Order**: higher `priority` first, then first come. The head of the queue blocks the runs behind it while it
  waits for the cluster (first in, first out; no small run jumps a large one); a run waiting only for its
  owner's quota blocks nobody else.
- **Quota**: the most GPUs one user's runs hold at once (`User.gpu_quota`, else `CRUCIBLE_GPU_QUOTA`; 0: none).
  A run larger than its owner's quota is refused at launch; one that must wait for the owner's other runs queues.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from apps.accounts.models import User
from apps.runs import ray_jobs, tasks
from apps.runs.models import TERMINAL_STATUSES, Run, RunStatus
from workers.rl.placement import GB, ResourcePlan, add, describe, shortfall

ADMISSION_LOCK = 0x43525543_5155  # pg_advisory_xact_lock key: one admission pass at a time, cluster-wide
CAPACITY_MAX_AGE = 15.0
"""Seconds a capacity answer (or Ray's silence) is reused before Ray is asked again."""
_cache: dict[str, tuple[float, Capacity | None]] = {}


@dataclass(frozen=True)
class Capacity:
    nodes: list[dict[str, float]]
    source: str
    label: str = ""
    """How a run page's queue message names the source (no internal address); empty: `source`."""

    @property
    def total(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for node in self.nodes:
            out = add(out, node)
        return out


def need_of(plan: ResourcePlan | None) -> dict[str, Any]:
    """What a run stores in `Run.resources`: its total and every bundle Ray must place (Ray's units: memory in
    bytes), and the same in words."""
    if plan is None:
        return {}
    return {"total": plan.total(), "bundles": plan.every_bundle(), "text": plan.need_text()}


def capacity_from(nodes: list[ray_jobs.RayNode]) -> Capacity | None:
    """The nodes the queue may fill: CRUCIBLE_CLUSTER_NODES, else the alive ones of Ray's `nodes`; None if none."""
    if settings.CLUSTER_NODES:
        return Capacity(nodes=declared_nodes(settings.CLUSTER_NODES), source="CRUCIBLE_CLUSTER_NODES")
    alive = [
        {k: v for k, v in node.resources.items() if k != "object_store_memory"}  # Ray's own, never asked for
        for node in nodes
        if node.alive
    ]
    if not alive:
        return None
    return Capacity(nodes=alive, source=f"the Ray cluster at {settings.RAY_ADDRESS}", label="the Ray cluster")


def cluster_capacity(*, max_age: float = CAPACITY_MAX_AGE) -> Capacity | None:
    """`capacity_from` Ray's nodes as Ray reports them now (or at most `max_age` seconds ago); None when Ray is
    silent and nothing is declared."""
    if settings.CLUSTER_NODES:
        return capacity_from([])
    key = settings.RAY_ADDRESS
    cached = _cache.get(key)
    if cached is not None and time.monotonic() - cached[0] < max_age:
        return cached[1]
    try:
        capacity = capacity_from(ray_jobs.nodes(timeout=3))
    except ray_jobs.RayUnavailable:
        capacity = None
    _cache[key] = (time.monotonic(), capacity)
    return capacity


def declared_nodes(text: str) -> list[dict[str, float]]:
    """CRUCIBLE_CLUSTER_NODES: a JSON list of nodes, each {resource: amount} (memory as memory_gb)."""
    try:
        declared = json.loads(text)
        if not isinstance(declared, list) or not all(isinstance(node, dict) for node in declared):
            raise ValueError("not a list of objects")
        return [{_ray_name(k): float(v) * (GB if k == "memory_gb" else 1) for k, v in n.items()} for n in declared]
    except (ValueError, TypeError) as exc:
        raise ImproperlyConfigured(
            f"CRUCIBLE_CLUSTER_NODES={text!r}: {exc}; give a JSON list of nodes such as "
            '[{"CPU": 64, "GPU": 8, "memory_gb": 512}]'
        ) from exc


def _ray_name(name: str) -> str:
    return "memory" if name == "memory_gb" else str(name)


def forget_capacity() -> None:
    _cache.clear()


def quota_of(user: User) -> int:
    return user.gpu_quota if user.gpu_quota is not None else settings.GPU_QUOTA


def refusal(need: dict[str, Any], user: User) -> str:
    """Why a run needing `need` can never start (for a 400), or '': against the cached capacity, and before a
    refusal against a fresh answer (a node may have joined since)."""
    if not need:
        return ""
    problem = launch_problem(need, user, cluster_capacity())
    if problem and not settings.CLUSTER_NODES:
        problem = launch_problem(need, user, cluster_capacity(max_age=0))
    return problem


def launch_problem(need: dict[str, Any], user: User, capacity: Capacity | None) -> str:
    """Why a run needing `need` can never start on `capacity` or within its owner's quota, or ''."""
    if not need:
        return ""
    gpus = need["total"].get("GPU", 0.0)
    quota = quota_of(user)
    if quota and gpus > quota:
        return f"this run needs {gpus:g} GPU ({need['text']}) and {user.username}'s GPU quota is {quota}"
    if capacity is None:
        return ""
    why = shortfall(need["bundles"], capacity.nodes)
    if why:
        return f"{why}: this run asks for {need['text']} ({capacity.source} has {describe(capacity.total)})"
    return ""


def lock() -> None:
    """Serialise admission (inside a transaction): held resources are read and written by one pass at a time."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [ADMISSION_LOCK])


def queue_order() -> QuerySet[Run]:
    return Run.objects.filter(status=RunStatus.QUEUED).order_by("-priority", "created_at", "pk")


def _held() -> tuple[dict[str, float], dict[int, float]]:
    """Resources the admitted, unfinished runs hold: in all, and GPUs per owner."""
    held: dict[str, float] = {}
    gpus_by_user: dict[int, float] = {}
    rows = (
        Run.objects.filter(admitted_at__isnull=False)
        .exclude(status__in=TERMINAL_STATUSES)
        .values_list("resources", "created_by_id")
    )
    for resources, user_id in rows:
        total = (resources or {}).get("total") or {}
        held = add(held, total)
        gpus_by_user[user_id] = gpus_by_user.get(user_id, 0.0) + total.get("GPU", 0.0)
    return held, gpus_by_user


def _missing(need: dict[str, float], free: dict[str, float]) -> dict[str, float]:
    return {k: v - free.get(k, 0.0) for k, v in need.items() if free.get(k, 0.0) + 1e-9 < v}


def admit_in_order(capacity: Capacity | None) -> tuple[list[int], list[int]]:
    """One admission pass over the queue (call inside a transaction after `lock()`): admit what fits in order,
    write each waiting run's reason. Returns the ids admitted (the caller dispatches them after commit) and those of
    the waiting runs whose reason changed."""
    now = timezone.now()
    held, gpus_by_user = _held()
    admitted: list[int] = []
    changed: list[int] = []
    blocked_by: Run | None = None
    for run in queue_order().select_related("created_by").select_for_update(of=("self",)):
        total = (run.resources or {}).get("total") or {}
        reason = ""
        quota = quota_of(run.created_by)
        user_gpus = gpus_by_user.get(run.created_by_id, 0.0)
        if quota and user_gpus + total.get("GPU", 0.0) > quota:
            reason = (
                f"waiting for {run.created_by.username}'s GPU quota: {user_gpus:g} of {quota} GPU held by their "
                f"runs, this one needs {total.get('GPU', 0.0):g}"
            )
        elif blocked_by is not None:
            reason = f"waiting behind run {blocked_by.pk}, which is first in the queue"
        elif capacity is not None:
            free = {k: v - held.get(k, 0.0) for k, v in capacity.total.items()}
            missing = _missing(total, free)
            if missing:
                reason = (
                    f"waiting for {describe(missing)} more: {capacity.label or capacity.source} has "
                    f"{describe(capacity.total)}, "
                    f"running runs hold {describe(held) if held else 'nothing'}"
                )
                blocked_by = run
        if reason:
            if reason != run.queued_reason:
                run.queued_reason = reason
                run.save(update_fields=["queued_reason"])
                changed.append(run.pk)
            continue
        run.status, run.admitted_at, run.queued_reason = RunStatus.PENDING, now, ""
        run.save(update_fields=["status", "admitted_at", "queued_reason"])
        held = add(held, total)
        gpus_by_user[run.created_by_id] = user_gpus + total.get("GPU", 0.0)
        admitted.append(run.pk)
    return admitted, changed


def admit(run: Run, capacity: Capacity | None) -> bool:
    """Admit `run` (locked, inside the transaction that called `lock()`) or queue it behind the runs ahead of it.
    A run that declares nothing is admitted at once. Runs behind it that became admissible are dispatched after
    the commit; `run` itself is the caller's to submit when this returns True."""
    if not run.resources:
        run.admitted_at = timezone.now()
        run.save(update_fields=["admitted_at"])
        return True
    if run.status != RunStatus.QUEUED:
        run.status = RunStatus.QUEUED
        run.save(update_fields=["status"])
    admitted, _ = admit_in_order(capacity)
    dispatch_after_commit([pk for pk in admitted if pk != run.pk])
    run.refresh_from_db()
    return run.pk in admitted


def dispatch_after_commit(run_ids: list[int]) -> None:
    for pk in run_ids:
        transaction.on_commit(lambda pk=pk: tasks.dispatch_run.delay(pk))  # type: ignore[misc]
