"""Did a training run learn, on held-out evals (docs/did-it-learn.md): its last evaluated checkpoint against the
model it started from, on the same benchmark version with the same eval settings, compared task by task
(`apps.benchmarks.selectors.eval_compare`), with a verdict. Stored in `Run.learning["eval"]` when an eval
finishes, so the runs list filters on it without recomputing anything; the reward trend and the signal share
beside it are `apps.runs.health`'s."""

from __future__ import annotations

from typing import Any

from django.db.models import Q, QuerySet

from apps.benchmarks.models import BenchmarkVersion, Eval
from apps.benchmarks.selectors import eval_compare
from apps.runs.learning import learning_merge
from apps.runs.models import Checkpoint, Run, RunKind, RunStatus
from workers.evals.learned import eval_verdict

ALPHA = 0.05
"""The verdict's significance level: better / worse when the paired test's two-sided p-value is below it."""
MAX_RUNS_PER_BASE_EVAL = 200
"""A base-model eval that finishes refreshes at most this many training runs that start from that model (newest)."""


def run_start(run: Run) -> tuple[Checkpoint | None, str]:
    """What `run` starts from: (the checkpoint it resumed from or was initialised from, else None; the base model).
    Its held-out verdict compares its last checkpoint with an eval of exactly this."""
    config = (run.spec or {}).get("config") or {}
    for key in ("resume_from", "init_checkpoint"):
        pk = ((run.spec or {}).get(key) or {}).get("checkpoint")
        if isinstance(pk, int):
            checkpoint = Checkpoint.objects.select_related("run").filter(pk=pk).first()
            if checkpoint is not None:
                return checkpoint, str(config.get("base_model", ""))
    return None, str(config.get("base_model", ""))


def _settings(evaluation: Eval) -> dict[str, Any]:
    """The eval's job settings without the model: two evals pair only when these are equal (same k, temperature,
    token budget, environment parameters)."""
    config = dict(((evaluation.run.spec or {}).get("job") or {}).get("config") or {})
    config.pop("base_model", None)
    config.pop("checkpoint_uri", None)
    return config


def _finished(evals: QuerySet[Eval]) -> QuerySet[Eval]:
    return evals.filter(run__status=RunStatus.SUCCEEDED).exclude(metrics={}).select_related("run", "checkpoint")


def _start_evals(version: BenchmarkVersion, start: Checkpoint | None, base_model: str) -> QuerySet[Eval]:
    evals = Eval.objects.filter(benchmark_version=version)
    if start is not None:
        return evals.filter(checkpoint=start)
    return evals.filter(checkpoint__isnull=True, base_model=base_model)


def _verdict_on(run: Run, version: BenchmarkVersion, start: Checkpoint | None, base_model: str) -> dict[str, Any]:
    """The verdict on one benchmark version, or {"pending": why} when one side is missing."""
    last = (
        _finished(Eval.objects.filter(checkpoint__run=run, benchmark_version=version))
        .order_by("-checkpoint__step", "-created_at")
        .first()
    )
    if last is None:
        return {"pending": f"no finished eval of a checkpoint on {version}"}
    assert last.checkpoint is not None  # filtered on checkpoint__run
    wanted = _settings(last)
    before = next(
        (
            e
            for e in _finished(_start_evals(version, start, base_model)).order_by("-created_at")
            if _settings(e) == wanted
        ),
        None,
    )
    start_label = f"checkpoint {start}" if start is not None else base_model
    if before is None:
        waiting = _start_evals(version, start, base_model).exclude(
            run__status__in=[RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.STOPPED]
        )
        if waiting.exists():
            return {"pending": f"the eval of {start_label} on {version} has not finished"}
        return {"pending": f"no eval of {start_label} on {version} with the checkpoint's settings"}
    compared = eval_compare(before=before, after=last, alpha=ALPHA)
    overall = compared["comparison"]["overall"]
    return {
        "benchmark_version": version.pk,
        "benchmark": str(version),
        "metric": "pass@1" if last.k == 1 else "mean score",
        "n": overall["n"],
        "base": {"eval": before.pk, "model": before.model_label, "score": overall["before_mean"]},
        "checkpoint": {"eval": last.pk, "step": last.checkpoint.step, "score": overall["after_mean"]},
        "diff": overall["diff"],
        "ci": [overall["ci_low"], overall["ci_high"]],
        "p_value": overall["p_two_sided"],
        "test": overall["test"],
        "alpha": ALPHA,
        "verdict": eval_verdict(overall["diff"], overall["p_two_sided"], ALPHA),
    }


def run_learning_evals(run: Run) -> dict[str, Any]:
    """`Run.learning`'s eval part: `evals`, one verdict per benchmark version the run's checkpoints were evaluated
    on (its auto_eval versions first, in their order); `eval`, the first of them (the run page's line); and
    `eval_pending`, why there is none yet."""
    if run.kind != RunKind.TRAIN:
        return {}
    start, base_model = run_start(run)
    order = [pk for pk in (run.spec or {}).get("auto_eval") or [] if isinstance(pk, int)]
    evaluated = set(
        Eval.objects.filter(checkpoint__run=run).values_list("benchmark_version_id", flat=True).distinct()
    ) | set(order)
    versions = {v.pk: v for v in BenchmarkVersion.objects.filter(pk__in=evaluated).select_related("benchmark")}
    ranked = [versions[pk] for pk in order if pk in versions] + [
        versions[pk] for pk in sorted(versions) if pk not in order
    ]
    found: list[dict[str, Any]] = []
    pending: list[str] = []
    for version in ranked:
        result = _verdict_on(run, version, start, base_model)
        if "pending" in result:
            pending.append(result["pending"])
        else:
            found.append(result)
    return {"eval": found[0] if found else None, "evals": found, "eval_pending": "" if found else "; ".join(pending)}


def learning_evals_refresh(*, run: Run) -> dict[str, Any]:
    """Recompute and store a training run's held-out verdicts (`Run.learning`); returns them."""
    part = run_learning_evals(run)
    if part:
        learning_merge(run_id=run.pk, part=part)
    return part


def runs_judged_by(evaluation: Eval) -> QuerySet[Run]:
    """The training runs whose verdict this eval is a side of: the run of its checkpoint, the runs that start from
    that checkpoint, or (an eval of a base model) the runs of that base model with checkpoints evaluated on the
    same benchmark version."""
    runs = Run.objects.filter(kind=RunKind.TRAIN)
    if evaluation.checkpoint_id is not None:
        pk = evaluation.checkpoint_id
        return runs.filter(
            Q(checkpoints__pk=pk) | Q(spec__init_checkpoint__checkpoint=pk) | Q(spec__resume_from__checkpoint=pk)
        ).distinct()
    ids = list(
        runs.filter(
            checkpoints__evals__benchmark_version_id=evaluation.benchmark_version_id,
            spec__config__base_model=evaluation.base_model,
        )
        .exclude(spec__has_key="init_checkpoint")
        .exclude(spec__has_key="resume_from")
        .order_by("-pk")
        .values_list("pk", flat=True)
        .distinct()[:MAX_RUNS_PER_BASE_EVAL]
    )
    return runs.filter(pk__in=ids)


def learning_after_eval(*, run_id: int) -> None:
    """EVAL's succeeded subscriber: refresh the held-out verdict of every training run this eval is a side of."""
    evaluation = Eval.objects.filter(run_id=run_id).first()
    if evaluation is None:
        return
    for run in runs_judged_by(evaluation):
        learning_evals_refresh(run=run)
