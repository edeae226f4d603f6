"""Reads for serving and sessions: serving runs, a serving run's target (what its replicas serve), sessions with
their filters, one session with its turns and feedback, the session a client's feedback is about, and the A/B
statistics of a serving run's arms (apps.realtime.stats); a loop's cycles: their phases' durations, the edit-kept
rate of what each collected, the median cycle time, and the version serving reports."""

from __future__ import annotations

import hashlib
import json
import statistics
from collections import defaultdict
from datetime import datetime
from typing import Any

from django.db.models import Prefetch, Q, QuerySet

from apps.accounts.models import User
from apps.gates.models import Deployment, Gate
from apps.gates.selectors import current_deployment
from apps.realtime import stats
from apps.realtime.models import Cycle, CycleStatus, Feedback, Loop, Session, SessionTurn
from apps.realtime.services.serving import SERVE, SIMULATE, checkpoint_base_model
from apps.runs.models import Checkpoint, MetricPoint, Run
from workers.session_records import Signal

# --- serving runs ------------------------------------------------------------------------------------------------


def serve_runs() -> QuerySet[Run]:
    return Run.objects.filter(kind=SERVE).select_related("created_by").order_by("-created_at", "-id")


def simulate_runs_of(run: Run) -> QuerySet[Run]:
    """The simulate runs that play against serving run `run`."""
    return Run.objects.filter(kind=SIMULATE, spec__serve_run=run.pk).order_by("-created_at", "-id")


def _arm(name: str, weight: float, deployment: Deployment | None, checkpoint: Checkpoint | None) -> dict[str, Any]:
    return {
        "name": name,
        "weight": weight,
        "deployment_id": deployment.pk if deployment else None,
        "checkpoint_id": checkpoint.pk if checkpoint else None,
        "checkpoint_uri": checkpoint.uri if checkpoint else None,
    }


def serve_target(run: Run) -> dict[str, Any]:
    """What serving run `run` serves now (the body of `GET /api/v1/serving/<run>/target/`):
    {"revision", "model_name", "arms": [{"name", "weight", "deployment_id", "checkpoint_id", "checkpoint_uri"}]}.

    Arm "a" is the gate's current deployment (the base model, checkpoint_id null, while the gate has none), the
    run's fixed checkpoint, or its base model; arm "b" is the A/B deployment when the run has a split (weights
    1 − share and share). An arm whose checkpoint was trained from another base model than the run serves is left
    out (it cannot be hot-swapped onto these weights). `revision` is a hash of the rest: it changes exactly when
    something the replicas act on does."""
    spec = run.spec or {}
    base_model = str(spec.get("base_model", ""))
    arms: list[dict[str, Any]] = []
    ab = spec.get("ab") or None
    share = float(ab["share"]) if ab else 0.0
    if spec.get("gate"):
        gate = Gate.objects.filter(pk=spec["gate"]).first()
        deployment = current_deployment(gate) if gate is not None else None
        arms.append(_arm("a", 1 - share, deployment, deployment.checkpoint if deployment else None))
    elif spec.get("checkpoint"):
        checkpoint = Checkpoint.objects.select_related("run").filter(pk=spec["checkpoint"]).first()
        if checkpoint is not None:
            arms.append(_arm("a", 1 - share, None, checkpoint))
    else:
        arms.append(_arm("a", 1 - share, None, None))
    if ab:
        deployment = Deployment.objects.select_related("checkpoint__run").filter(pk=ab["deployment"]).first()
        if deployment is not None:
            arms.append(_arm("b", share, deployment, deployment.checkpoint))
    checkpoints = {
        c.pk: c
        for c in Checkpoint.objects.select_related("run").filter(
            pk__in=[arm["checkpoint_id"] for arm in arms if arm["checkpoint_id"]]
        )
    }
    arms = [
        arm
        for arm in arms
        if arm["checkpoint_id"] is None or checkpoint_base_model(checkpoints[arm["checkpoint_id"]]) == base_model
    ]
    total = sum(arm["weight"] for arm in arms)
    for arm in arms:
        arm["weight"] = round(arm["weight"] / total, 6) if total > 0 else 0.0
    body = {"model_name": str(spec.get("model_name", "")), "arms": arms}
    revision = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    return {"revision": revision, **body}


# --- sessions ----------------------------------------------------------------------------------------------------


def session_list(
    *,
    serve_run: int | None = None,
    deployment: int | None = None,
    policy_version: int | None = None,
    has_feedback: bool | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    arm: str | None = None,
    task_type: str | None = None,
    cycle: int | None = None,
    user: str | None = None,
    session_id: str | None = None,
) -> QuerySet[Session]:
    """Sessions, most recent last turn first. `policy_version` matches a session whose first or last turn had it;
    `since`/`until` bound its last turn; `user` is a username; `session_id` the client's id."""
    sessions = Session.objects.select_related("serve_run", "deployment__gate", "user", "reward_version__config")
    if serve_run is not None:
        sessions = sessions.filter(serve_run_id=serve_run)
    if deployment is not None:
        sessions = sessions.filter(deployment_id=deployment)
    if policy_version is not None:
        sessions = sessions.filter(Q(first_policy_version=policy_version) | Q(last_policy_version=policy_version))
    if has_feedback is not None:
        sessions = sessions.exclude(feedback_counts={}) if has_feedback else sessions.filter(feedback_counts={})
    if since is not None:
        sessions = sessions.filter(last_turn_at__gte=since)
    if until is not None:
        sessions = sessions.filter(last_turn_at__lt=until)
    if arm is not None:
        sessions = sessions.filter(arm=arm)
    if task_type:
        sessions = sessions.filter(task_type=task_type)
    if cycle is not None:
        sessions = sessions.filter(cycle_id=cycle)
    if user:
        sessions = sessions.filter(user__username=user)
    if session_id:
        sessions = sessions.filter(client_session_id=session_id)
    return sessions.order_by("-last_turn_at", "-id")


def session_detail(pk: int) -> Session | None:
    """One session with its turns in order and its feedback (oldest first)."""
    return (
        Session.objects.select_related("serve_run", "deployment__gate", "user", "reward_version__config", "cycle")
        .prefetch_related(
            Prefetch(
                "turns",
                queryset=SessionTurn.objects.select_related("deployment").order_by("turn_index", "created_at", "id"),
            ),
            Prefetch("feedback", queryset=Feedback.objects.select_related("user", "run").order_by("created_at", "id")),
        )
        .filter(pk=pk)
        .first()
    )


def session_for_feedback(
    *, client_session_id: str, user: User | None = None, serve_run_id: int | None = None
) -> Session | None:
    """The session a client's feedback names: the newest with that client id among `user`'s sessions, or among the
    sessions of serving run `serve_run_id` (a simulate run's token)."""
    sessions = Session.objects.filter(client_session_id=client_session_id)
    if serve_run_id is not None:
        sessions = sessions.filter(serve_run_id=serve_run_id)
    elif user is not None:
        sessions = sessions.filter(user=user)
    else:
        return None
    return sessions.order_by("-last_turn_at", "-id").first()


# --- A/B statistics -----------------------------------------------------------------------------------------------

RATES = {"edit_kept": Signal.EDIT_KEPT.value, "dissatisfied": Signal.DISSATISFIED_FOLLOWUP.value}
"""The rates compared between arms: the share of an arm's sessions with at least one feedback of the signal."""
BASELINE_ARM = "a"


def _rate(count: int, n: int) -> dict[str, Any]:
    interval = stats.wilson_interval(count, n)
    return {"count": count, "rate": count / n if n else None, "ci": list(interval) if interval else None}


def _percentile(values: list[float], q: float) -> dict[str, Any]:
    found = stats.percentile_interval(values, q)
    return {"value": found.value, "ci": [found.low, found.high] if found.value is not None else None}


def ab_stats(run: Run, *, since: datetime | None = None, until: datetime | None = None) -> dict[str, Any]:
    """Per arm of serving run `run`: sessions, turns, the edit-kept and dissatisfied follow-up rates (the share of
    sessions with that signal, with 95% Wilson intervals) and latency p50/p95 over turns (order-statistic 95%
    intervals); and each other arm against arm "a": the difference of each rate (b − a) with Newcombe's 95% interval
    and the two-proportion z-test p-value, and the difference of median latency with a bootstrap interval and the
    Mann-Whitney p-value. `since`/`until` bound the sessions' last turn (e.g. since the split started)."""
    sessions = Session.objects.filter(serve_run=run)
    if since is not None:
        sessions = sessions.filter(last_turn_at__gte=since)
    if until is not None:
        sessions = sessions.filter(last_turn_at__lt=until)
    per_arm: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"sessions": 0, "with_feedback": 0, "counts": defaultdict(int), "deployments": defaultdict(int)}
    )
    session_arm: dict[int, str] = {}
    for pk, arm, counts, deployment_id in sessions.values_list("pk", "arm", "feedback_counts", "deployment_id"):
        entry = per_arm[arm]
        session_arm[pk] = arm
        entry["sessions"] += 1
        entry["with_feedback"] += bool(counts)
        entry["deployments"][deployment_id] += 1
        for name, signal in RATES.items():
            entry["counts"][name] += int(bool(counts.get(signal)))
    latencies: dict[str, list[float]] = defaultdict(list)
    turns = SessionTurn.objects.filter(session__in=sessions).order_by("created_at", "id")
    for session_id, latency in turns.values_list("session_id", "latency_ms"):
        latencies[session_arm[session_id]].append(latency)
    arms = []
    for name in sorted(per_arm):
        entry = per_arm[name]
        n = entry["sessions"]
        arms.append(
            {
                "name": name,
                "deployment_id": max(entry["deployments"], key=entry["deployments"].get),
                "sessions": n,
                "sessions_with_feedback": entry["with_feedback"],
                "turns": len(latencies[name]),
                **{rate: _rate(entry["counts"][rate], n) for rate in RATES},
                "latency_ms": {"p50": _percentile(latencies[name], 0.5), "p95": _percentile(latencies[name], 0.95)},
            }
        )
    comparisons = []
    if BASELINE_ARM in per_arm:
        base = per_arm[BASELINE_ARM]
        for name in sorted(per_arm):
            if name == BASELINE_ARM:
                continue
            other = per_arm[name]
            comparison: dict[str, Any] = {"arm": name, "baseline": BASELINE_ARM}
            for rate in RATES:
                k_a, n_a, k_b, n_b = base["counts"][rate], base["sessions"], other["counts"][rate], other["sessions"]
                interval = stats.newcombe_interval(k_a, n_a, k_b, n_b)
                comparison[rate] = {
                    "difference": k_b / n_b - k_a / n_a,
                    "ci": list(interval) if interval else None,
                    "p_value": stats.two_proportion_p_value(k_a, n_a, k_b, n_b),
                }
            median = stats.median_difference(latencies[BASELINE_ARM], latencies[name])
            comparison["latency_p50"] = {
                "difference": median.difference,
                "relative": median.relative,
                "ci": [median.low, median.high] if median.difference is not None else None,
                "p_value": median.p_value,
            }
            comparisons.append(comparison)
    return {
        "serve_run": run.pk,
        "confidence": stats.CONFIDENCE,
        "arms": arms,
        "comparisons": comparisons,
    }


# --- loops and cycles ----------------------------------------------------------------------------------------------


def served_version(serve_run_id: int) -> int | None:
    """The policy version the serving run last reported for its main arm (`serve/policy_version/a`)."""
    point = (
        MetricPoint.objects.filter(run_id=serve_run_id, name="serve/policy_version/a")
        .order_by("-step", "-pk")
        .values_list("value", flat=True)
        .first()
    )
    return int(point) if point is not None else None


def median_cycle_seconds(loop: Loop) -> float | None:
    """Median wall time of the loop's cycles that deployed (Cursor: about five hours)."""
    times = [c.seconds for c in loop.cycles.filter(status=CycleStatus.DEPLOYED) if c.seconds is not None]
    return statistics.median(times) if times else None


def phase_durations(cycle: Cycle) -> list[dict[str, Any]]:
    """The timeline with each phase's seconds (None while it runs)."""
    out = []
    for entry in cycle.timeline:
        started = datetime.fromisoformat(entry["started_at"])
        ended = datetime.fromisoformat(entry["ended_at"]) if entry.get("ended_at") else None
        out.append({**entry, "seconds": (ended - started).total_seconds() if ended else None})
    return out


def cycle_signal_rates(cycle: Cycle) -> dict[str, dict[str, Any]]:
    """Share of the cycle's collected sessions with an edit kept / a dissatisfied follow-up, with Wilson 95%
    intervals (None without sessions)."""
    sessions = Session.objects.filter(cycle=cycle)
    n = sessions.count()
    out: dict[str, dict[str, Any]] = {}
    for signal in (Signal.EDIT_KEPT, Signal.DISSATISFIED_FOLLOWUP):
        hits = sessions.filter(feedback__signal=signal).distinct().count()
        low, high = stats.wilson_interval(hits, n) or (None, None)
        out[str(signal)] = {"n": n, "hits": hits, "rate": hits / n if n else None, "low": low, "high": high}
    return out
