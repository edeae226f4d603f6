"""Is this run healthy, and is it learning? One answer for the run page, the API and the run list.

Each signal reads the last `WINDOW` steps a training job reported and compares them with a documented threshold
(docs/tours/run-health.md); the learning trend fits a line to the reward over every step and tests its slope.
A signal with no data (a kind that does not report it, a run that has not started) is "unknown", never "ok".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from django.db import connection
from django.db.models import F, Q
from django.utils import timezone

from apps.runs.learning import learning_merge, learning_parts, learning_trend
from apps.runs.models import MetricPoint, Run, RunStatus

WINDOW = 10
"""Steps each signal reads back from the latest."""
QUIET_MINUTES = 15
"""A running run that has reported no step for this long is flagged as quiet."""

ORDER = {"unknown": 0, "ok": 1, "warn": 2, "bad": 3}
LIVENESS = frozenset({"quiet", "stall"})
"""Signals that say the job is alive, not that its training is healthy: alone, they never make a run "ok"."""
HEALTH_STATUSES = ("ok", "warn", "bad", "unknown")


@dataclass(frozen=True)
class Threshold:
    """`warn` and `bad` bounds on a value where higher is worse (lower is worse when `below`)."""

    warn: float
    bad: float
    below: bool = False

    def judge(self, value: float) -> str:
        if self.below:
            return "bad" if value < self.bad else "warn" if value < self.warn else "ok"
        return "bad" if value > self.bad else "warn" if value > self.warn else "ok"

    def text(self) -> str:
        sign = "<" if self.below else ">"
        return f"warn {sign} {self.warn:g}, bad {sign} {self.bad:g}"


@dataclass(frozen=True)
class Signal:
    key: str
    title: str
    status: str
    value: float | None
    shown: str
    threshold: str
    meaning: str


# (key, title, metric(s), threshold, meaning): the table in docs/tours/run-health.md is written from the same words.
THRESHOLDS: dict[str, Threshold] = {
    "mismatch": Threshold(warn=1e-3, bad=1e-2),
    "dropped_groups": Threshold(warn=0.5, bad=0.9),
    "empty_completions": Threshold(warn=0.05, bad=0.25),
    "clip_fraction": Threshold(warn=0.2, bad=0.5),
    "entropy": Threshold(warn=0.3, bad=0.1, below=True),
    "flags": Threshold(warn=0.1, bad=0.3),
}
MEANINGS = {
    "staleness": "policy versions between the sampling weights and the learner's; above the run's max_staleness "
    "the async bound is broken",
    "mismatch": "KL(engine ‖ learner) by k3 per token, measured every step before the update: above 1e-3 the "
    "engine and learner disagree and on-policy training is quietly off-policy (docs/methods.md P7)",
    "provenance": "samples whose trained token ids are not the ids the engine sampled (re-encoded text): must be 0",
    "dropped_groups": "share of groups whose rewards were all equal (no gradient): near 1 the run learns nothing",
    "empty_completions": "share of episodes whose policy sampled no token",
    "clip_fraction": "share of tokens outside the clip range: high means the policy moves too far per step",
    "entropy": "latest mean token entropy over the first steps': a collapse below 0.1 leaves nothing to explore",
    "flags": "share of trajectories a reward-hacking detector flagged",
    "quiet": f"a running run that reported no step for {QUIET_MINUTES} minutes may be hung",
    "weight_sync": "seconds from the learner's update to every engine holding the new weights, per step: over the "
    "run's weight_sync_budget_seconds (default 30) is a finding",
    "stall": "the stall watchdog marks a running job silent past its phase's limit (config.stall_limits, else "
    "stall_after_seconds) with stack dumps of its processes",
}
NAMES = [
    "staleness",
    "mismatch/kl_k3",
    "mismatch/provenance_mismatched_samples",
    "dropped_groups",
    "groups",
    "signal_groups",
    "empty_completions",
    "clip_fraction",
    "entropy",
    "flags/rate",
    "weight_sync_seconds",
]


def _recent(run_id: int, names: list[str], window: int) -> dict[str, list[tuple[int, float]]]:
    """The last `window` points of each named series, oldest first (one index scan per name)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT n.name, p.step, p.value
            FROM unnest(%s::text[]) AS n(name)
            CROSS JOIN LATERAL (
              SELECT step, value FROM runs_metricpoint
              WHERE run_id = %s AND name = n.name ORDER BY step DESC LIMIT %s
            ) p
            """,
            [names, run_id, window],
        )
        out: dict[str, list[tuple[int, float]]] = {}
        for name, step, value in cursor.fetchall():
            out.setdefault(name, []).append((int(step), float(value)))
    return {name: sorted(points) for name, points in out.items()}


def _first(run_id: int, name: str, count: int) -> list[float]:
    rows = MetricPoint.objects.filter(run_id=run_id, name=name).order_by("step").values_list("value", flat=True)
    return [float(v) for v in rows[:count]]


def _mean(points: list[tuple[int, float]]) -> float | None:
    return sum(v for _, v in points) / len(points) if points else None


def _signal(key: str, title: str, value: float | None, shown: str = "") -> Signal:
    threshold = THRESHOLDS.get(key)
    if value is None or not math.isfinite(value):
        return Signal(key, title, "unknown", None, "no data", threshold.text() if threshold else "", MEANINGS[key])
    status = threshold.judge(value) if threshold else "ok"
    return Signal(
        key, title, status, value, shown or f"{value:.3g}", threshold.text() if threshold else "", MEANINGS[key]
    )


REFRESH_PER_TICK = 5
"""Runs whose stored health beat recomputes per reconcile (inline: a few index probes each)."""
HEALTH_REFRESH_SECONDS = 30
"""A running run's stored health (the list's column) is recomputed at most this often, and only after new events."""


def claim_runs_needing_health(now: Any = None, limit: int = 50) -> list[int]:
    """Runs whose stored health is out of date: never computed, a running run with events (or a stall mark) since
    the last computation and that at least `HEALTH_REFRESH_SECONDS` ago, or a run that ended since. At most
    `limit` per call, the most recently active first (beat calls this every reconcile). Their `health_at` is set
    now, so the next reconcile does not queue them again before the refresh has run."""
    now = now or timezone.now()
    due = now - timedelta(seconds=HEALTH_REFRESH_SECONDS)
    running = Q(status=RunStatus.RUNNING) & (
        Q(health_at__isnull=True)
        | (Q(health_at__lt=due) & (Q(last_event_at__gt=F("health_at")) | Q(stalled_at__gt=F("health_at"))))
    )
    ended = Q(finished_at__isnull=False) & (Q(health_at__isnull=True) | Q(health_at__lt=F("finished_at")))
    rows = (
        Run.objects.filter(running | ended)
        .order_by(F("last_event_at").desc(nulls_last=True))
        .values_list("pk", flat=True)
    )
    ids = list(rows[:limit])
    Run.objects.filter(pk__in=ids).update(health_at=now)
    return ids


def health_refresh(*, run_id: int) -> str:
    """Compute a run's health panel and store its overall status and problems on the run (the list's column),
    with the reward trend and signal share of `Run.learning` (the list's learning filter)."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None:  # deleted since it was claimed
        return "unknown"
    health = run_health(run)
    Run.objects.filter(pk=run_id).update(
        health=health["status"], health_problems=health["problems"], health_at=timezone.now()
    )
    parts = learning_parts(run, health["trend"])
    if parts["reward"] is not None or parts["signal"]["groups"]:
        learning_merge(run_id=run_id, part=parts)  # the list's learning filter reads these
    return str(health["status"])


def run_health(run: Run) -> dict[str, Any]:
    """Every signal with its status, the worst of them, and the learning trend."""
    recent = _recent(run.pk, NAMES, WINDOW)
    config = (run.spec or {}).get("config") or {}
    signals: list[Signal] = []

    staleness = recent.get("staleness")
    if staleness:
        bound = int(config.get("max_staleness", 1)) if config.get("mode") == "async" else 0
        worst = max(v for _, v in staleness)
        status = "bad" if worst > bound else "ok"
        signals.append(
            Signal(
                "staleness",
                "Staleness",
                status,
                worst,
                f"{worst:g} (bound {bound})",
                f"bad > {bound}",
                MEANINGS["staleness"],
            )
        )
    else:
        signals.append(_signal("staleness", "Staleness", None))

    signals.append(_signal("mismatch", "Train-inference mismatch", _mean(recent.get("mismatch/kl_k3", []))))
    provenance = recent.get("mismatch/provenance_mismatched_samples")
    if provenance:
        total = sum(v for _, v in provenance)
        signals.append(
            Signal(
                "provenance",
                "Token provenance",
                "bad" if total > 0 else "ok",
                total,
                f"{total:g} samples",
                "bad > 0",
                MEANINGS["provenance"],
            )
        )
    else:
        signals.append(_signal("provenance", "Token provenance", None))

    dropped, groups = recent.get("dropped_groups", []), dict(recent.get("groups", []))
    signal = recent.get("signal_groups", [])
    if signal:  # counted whether or not equal groups are dropped (a learner without drop_equal_groups reports 0 drops)
        shares = [(groups[s] - n) / groups[s] for s, n in signal if groups.get(s)]
    else:  # a learner from before signal_groups
        shares = [d / groups[s] for s, d in dropped if groups.get(s)]
    share = sum(shares) / len(shares) if shares else None
    signals.append(
        _signal("dropped_groups", "Groups without signal", share, f"{share:.0%}" if share is not None else "")
    )

    samples = int(config.get("prompts_per_step", 0)) * int(config.get("group_size", 0))
    empty = _mean(recent.get("empty_completions", []))
    empty_share = empty / samples if empty is not None and samples else None
    signals.append(
        _signal(
            "empty_completions",
            "Empty completions",
            empty_share,
            f"{empty_share:.0%}" if empty_share is not None else "",
        )
    )
    signals.append(_signal("clip_fraction", "Clip fraction", _mean(recent.get("clip_fraction", []))))

    entropy = recent.get("entropy", [])
    early = _first(run.pk, "entropy", 3) if entropy else []
    base = sum(early) / len(early) if early else 0.0
    ratio = entropy[-1][1] / base if entropy and base > 0 else None
    signals.append(
        _signal(
            "entropy",
            "Entropy (latest / start)",
            ratio,
            f"{ratio:.2f} ({entropy[-1][1]:.3g} nats)" if ratio is not None else "",
        )
    )
    flags = _mean(recent.get("flags/rate", []))
    signals.append(_signal("flags", "Detector flag rate", flags, f"{flags:.0%}" if flags is not None else ""))
    signals.append(_weight_sync(recent.get("weight_sync_seconds", []), config))
    signals.append(_quiet(run))
    signals.append(_stall(run))

    known = [s for s in signals if s.status != "unknown"]
    overall = max((s.status for s in known), key=ORDER.__getitem__, default="unknown")
    if overall == "ok" and all(s.key in LIVENESS for s in known):
        overall = "unknown"  # alive, but no step has reported anything to judge yet
    return {
        "status": overall,
        "signals": [asdict(s) for s in signals],
        "problems": [s.title for s in known if s.status in ("warn", "bad")],
        "trend": learning_trend(run),
        "window": WINDOW,
    }


def _weight_sync(points: list[tuple[int, float]], config: dict[str, Any]) -> Signal:
    budget = config.get("weight_sync_budget_seconds")
    budget = float(budget) if isinstance(budget, int | float) and budget > 0 else 30.0
    if not points:
        return Signal(
            "weight_sync", "Weight sync", "unknown", None, "no data", f"bad > {budget:g} s", MEANINGS["weight_sync"]
        )
    worst_step, worst = max(points, key=lambda p: p[1])
    over = sum(1 for _, v in points if v > budget)
    return Signal(
        "weight_sync",
        "Weight sync",
        "bad" if over else "ok",
        worst,
        f"max {worst:.3g} s (step {worst_step})" + (f", {over} steps over budget" if over else ""),
        f"bad > {budget:g} s",
        MEANINGS["weight_sync"],
    )


def _stall(run: Run) -> Signal:
    if run.stalled_at is not None:
        shown = f"stalled since {run.stalled_at:%H:%M:%S} UTC" + (f" in {run.phase}" if run.phase else "")
        return Signal("stall", "Stall watchdog", "bad", 1.0, shown, "bad: stalled", MEANINGS["stall"])
    if run.status != RunStatus.RUNNING:
        return Signal("stall", "Stall watchdog", "unknown", None, run.status, "bad: stalled", MEANINGS["stall"])
    shown = f"live, {run.phase}" if run.phase else "live"
    return Signal("stall", "Stall watchdog", "ok", 0.0, shown, "bad: stalled", MEANINGS["stall"])


def _quiet(run: Run) -> Signal:
    if run.status != RunStatus.RUNNING:
        return Signal(
            "quiet", "Reporting", "unknown", None, run.status, f"warn > {QUIET_MINUTES} min", MEANINGS["quiet"]
        )
    # The time of the latest training step (one index probe), else the start: a job that reported nothing yet.
    last = (
        MetricPoint.objects.filter(run=run, name="reward_mean").order_by("-step").values_list("time", flat=True).first()
    )
    since = last or run.started_at or run.created_at
    minutes = (timezone.now() - since) / timedelta(minutes=1)
    if last is None:  # no step yet: nothing to call ok, and quiet only once the wait is long
        status = "warn" if minutes > QUIET_MINUTES else "unknown"
        shown = f"no step yet, {minutes:.0f} min since the start"
    else:
        status = "warn" if minutes > QUIET_MINUTES else "ok"
        shown = f"last step {minutes:.0f} min ago"
    return Signal("quiet", "Reporting", status, minutes, shown, f"warn > {QUIET_MINUTES} min", MEANINGS["quiet"])
