"""Did this run learn? The reward trend, the share of groups that carried a signal, and the stored held-out
verdict, as one answer for the run page, the API and the runs list (docs/did-it-learn.md). `apps.runs.health`
computes the trend with the other health signals and stores it here (`learning_merge`); the held-out verdict is
written by `apps.benchmarks.services.learning` when an eval finishes.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import connection
from django.db.models import Sum

from apps.runs.models import MetricPoint, MetricRollup, Run
from apps.runs.selectors import metric_names, metric_series
from workers.evals.learned import linear_trend, signal_share

TREND_WINDOW = 10
"""Points in the trend's first and last windows (the health signals' window)."""


def learning_trend(run: Run) -> dict[str, Any]:
    """The reward's least-squares slope per step with its 95% confidence interval (`workers.evals.stats.
    linear_trend`), the means of its first and last `TREND_WINDOW` points, and the held-out eval's change from the first
    checkpoint to the last. `verdict`: improving (the interval is above 0), worsening (below), flat (it contains
    0) or unknown (under 3 steps). Runs over 1,000 steps are fitted on their 1,000 bucket means."""
    series = metric_series(run_id=run.pk, name="reward_mean", max_points=1000)
    steps, means = series["steps"], series["mean"]
    trend: dict[str, Any] = {"steps": len(steps), "verdict": "unknown", "slope": None, "ci": None}
    fit = linear_trend(steps, means, window=TREND_WINDOW)
    if fit is not None:
        trend.update(
            slope=fit.slope,
            ci=[fit.ci_low, fit.ci_high],
            verdict=fit.verdict,
            start=fit.start,
            end=fit.end,
            first_mean=fit.first_mean,
            last_mean=fit.last_mean,
            window=fit.window,
        )
    evals = {}
    for name in [n for n in metric_names(run_id=run.pk) if n.startswith("eval/")]:  # one index probe per name
        points = list(MetricPoint.objects.filter(run=run, name=name).order_by("step").values_list("step", "value"))
        if points:
            evals[name] = {"first": points[0], "last": points[-1], "change": points[-1][1] - points[0][1]}
    trend["evals"] = evals
    return trend


# --- did it learn? (docs/did-it-learn.md) ------------------------------------------------------------------------

SIGNAL_METRICS = ["groups", "signal_groups", "dynamic_sampling/generated_groups", "dynamic_sampling/filtered_groups"]


def run_signal_share(run_id: int) -> dict[str, Any]:
    """The share of the run's groups whose rewards were not all equal, over every step (from the roll-ups: one
    short scan). DAPO's dynamic sampling hands the learner only groups with signal, so when it ran the share is of
    the groups it generated (1 - filtered / generated). `share` is None ("not recorded") for runs whose learner
    predates `signal_groups`."""
    sums = dict(
        MetricRollup.objects.filter(run_id=run_id, name__in=SIGNAL_METRICS)
        .values("name")
        .annotate(total=Sum("sum"))
        .values_list("name", "total")
    )
    generated = float(sums.get("dynamic_sampling/generated_groups") or 0.0)
    if generated > 0:
        filtered = float(sums.get("dynamic_sampling/filtered_groups") or 0.0)
        return {
            "share": signal_share([generated], [generated - filtered]),
            "groups": int(generated),
            "basis": "dynamic_sampling",
        }
    groups = float(sums.get("groups") or 0.0)
    if "signal_groups" in sums and groups > 0:
        signal = float(sums["signal_groups"] or 0.0)
        return {"share": signal_share([groups], [min(signal, groups)]), "groups": int(groups), "basis": "learner"}
    return {"share": None, "groups": int(groups), "basis": "not recorded"}


def _reward_part(trend: dict[str, Any]) -> dict[str, Any] | None:
    if not trend.get("steps"):
        return None
    return {k: v for k, v in trend.items() if k != "evals"}


def learning_parts(run: Run, trend: dict[str, Any] | None = None) -> dict[str, Any]:
    """The parts of the learning answer `apps.runs` computes itself: the reward trend and the signal share."""
    trend = trend if trend is not None else learning_trend(run)
    return {"reward": _reward_part(trend), "signal": run_signal_share(run.pk)}


def _num(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}"


def _slope(value: float) -> str:
    return f"{value:+.2g}" if value != 0 else "0"


def learning_line(learning: dict[str, Any]) -> str:
    """The one line the run page heads with, e.g. "reward +0.042/step [0.031, 0.053] (improving) · 78% of groups
    with signal · held-out pass@1 0.41 vs base 0.28: better, +0.13 [0.05, 0.21], p = 0.003"."""
    parts: list[str] = []
    reward = learning.get("reward") or {}
    if reward.get("slope") is not None:
        low, high = reward["ci"]
        parts.append(f"reward {_slope(reward['slope'])}/step [{_slope(low)}, {_slope(high)}] ({reward['verdict']})")
    elif reward.get("steps"):
        parts.append(f"reward: {reward['steps']} steps, too few for a trend")
    else:
        parts.append("reward: no steps yet")
    signal = learning.get("signal") or {}
    if signal.get("share") is not None:
        parts.append(f"{signal['share']:.0%} of groups with signal")
    elif signal.get("groups"):
        parts.append("groups with signal: not recorded")
    found = learning.get("eval")
    if found:
        verdict = found["verdict"].replace("_", " ")
        low, high = found["ci"]
        parts.append(
            f"held-out {found['metric']} {_num(found['checkpoint']['score'])} vs base {_num(found['base']['score'])}"
            f": {verdict}, {found['diff']:+.2f} [{low:+.2f}, {high:+.2f}], p = {found['p_value']:.2g}"
        )
    elif learning.get("eval_pending"):
        parts.append(f"held-out eval: {learning['eval_pending']}")
    return " · ".join(parts)


def learning_view(parts: dict[str, Any], stored: dict[str, Any]) -> dict[str, Any]:
    """The `learning` object of the run page and the API: `parts` (reward, signal: live or stored) and the eval
    verdict `apps.benchmarks` stored on the run, with the line that says it all."""
    learning = {
        "reward": parts.get("reward"),
        "signal": parts.get("signal") or {"share": None, "groups": 0, "basis": "not recorded"},
        "eval": stored.get("eval"),
        "evals": stored.get("evals") or [],
        "eval_pending": stored.get("eval_pending", ""),
    }
    learning["line"] = learning_line(learning)
    return learning


def run_learning(run: Run, trend: dict[str, Any] | None = None) -> dict[str, Any]:
    """Did it learn, now: the live reward trend and signal share with the stored eval verdict."""
    return learning_view(learning_parts(run, trend), run.learning or {})


def learning_merge(*, run_id: int, part: dict[str, Any]) -> None:
    """Set the top-level keys of `part` in `Run.learning` in one statement (jsonb ||): the health beat and the
    eval hook each write their own keys without reading the other's, so neither can undo the other."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE runs_run SET learning = learning || %s::jsonb WHERE id = %s",
            [json.dumps(part, allow_nan=False), run_id],
        )
