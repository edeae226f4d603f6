"""What the runs app calls back for training's run kinds (registered in `apps.training.hooks`): the job input each
kind's worker receives, built from the run row, and what follows a training run's checkpoints (auto-eval) and the
evals of those checkpoints (the eval curve and the run-level detectors). Launches and resume are in
`apps.training.services`."""

from __future__ import annotations

from typing import Any

from apps.benchmarks.models import Eval
from apps.benchmarks.services import eval_auto
from apps.review.services import flags_record
from apps.runs.models import Checkpoint, Run, RunKind, RunStatus
from apps.runs.selectors import metric_series
from apps.runs.services import metric_series_replace
from apps.runs.storage import file_uri, storage_uri
from workers.detectors.registry import DetectorConfig, run_run_detectors
from workers.rewards.schema import with_anneal_horizon


# --- the job input each kind's worker receives (workers.specs), built from the run row -------------------
def rescore_job(run: Run) -> dict[str, Any]:
    assert run.dataset_version is not None and run.reward_version is not None
    return {
        "input_uri": file_uri(run.dataset_version.file),
        "output_uri": storage_uri(f"runs/{run.pk}/scores.jsonl"),
        "reward": run.reward_version.spec,
    }


def train_job(run: Run) -> dict[str, Any]:
    assert run.dataset_version is not None and run.reward_version is not None
    resume = run.spec.get("resume_from")
    steps = run.spec["config"].get("steps")
    reward = run.reward_version.spec
    return {
        "config": run.spec["config"],
        "input_uri": file_uri(run.dataset_version.file),
        # An annealed term with an empty horizon (PARL's λ1, λ2 by default) anneals over this run's steps.
        "reward": with_anneal_horizon(reward, steps) if isinstance(steps, int) else reward,
        "output_prefix": storage_uri(f"runs/{run.pk}"),
        "resume_from": resume["uri"] if resume else None,
        "exclude_task_ids": list(run.spec.get("excluded_tasks") or []),
    }


def sft_job(run: Run) -> dict[str, Any]:
    return {key: value for key, value in train_job(run).items() if key != "resume_from"}


# --- lifecycle hooks (registered in apps.training.hooks) ------------------------------------------------------
def auto_eval_checkpoints(*, run_id: int, steps: list[int]) -> None:
    """TRAIN's checkpoints hook: evaluate the new checkpoints on the benchmark versions the run's spec names (none:
    nothing starts)."""
    eval_auto(run_id=run_id, steps=steps)


def eval_curve_after_eval(*, run_id: int) -> None:
    """EVAL's succeeded subscriber: an eval of a training run's checkpoint updates that run's eval curve."""
    evaluation = Eval.objects.select_related("benchmark_version__benchmark").filter(run_id=run_id).first()
    if evaluation is not None and evaluation.checkpoint_id is not None:
        training_run_eval_curve(evaluation=evaluation)


def training_run_eval_curve(*, evaluation: Eval) -> list[Any]:
    """After an eval of a training run's checkpoint: chart the run's eval results per checkpoint step
    (`eval/<benchmark>/<metric>` metric points on the training run) and run the run-level detectors
    (reward-eval divergence: training reward rising while this held-out eval falls) on the run's reward and
    these points. A divergence is stored as a `Flag` of the run (trajectory_ref "run:<id>"), once per detector.
    Returns the findings."""
    assert evaluation.checkpoint_id is not None
    checkpoint = Checkpoint.objects.select_related("run").get(pk=evaluation.checkpoint_id)
    run = checkpoint.run
    if run.kind != RunKind.TRAIN:
        return []
    version = evaluation.benchmark_version
    evals = (
        Eval.objects.filter(checkpoint__run=run, benchmark_version=version, run__status=RunStatus.SUCCEEDED)
        .exclude(metrics={})
        .select_related("checkpoint")
        .order_by("checkpoint__step", "-created_at")
    )
    points: dict[int, dict[str, float]] = {}
    for other in evals:
        assert other.checkpoint is not None  # filtered on checkpoint__run
        points.setdefault(other.checkpoint.step, other.metrics)  # the newest eval of each checkpoint
    names = [m for m in ("pass@1", "mean_score") if any(m in metrics for metrics in points.values())]
    for metric in names:
        # Rewritten whole: a retried hook or a re-run eval never leaves a duplicate point.
        metric_series_replace(
            run_id=run.pk,
            name=f"eval/{version.benchmark.name}/{metric}"[:100],
            points=[(step, float(metrics[metric])) for step, metrics in sorted(points.items()) if metric in metrics],
        )
    if not names:
        return []
    reward = metric_series(run_id=run.pk, name="reward_mean", max_points=2000)
    series = {
        "reward_mean": list(zip(reward["steps"], reward["mean"], strict=True)),
        "eval/pass@1": [(step, float(m[names[0]])) for step, m in sorted(points.items()) if names[0] in m],
    }
    config = DetectorConfig.model_validate((run.spec.get("config") or {}).get("detectors") or {})
    findings = run_run_detectors(series, config)
    flags_record(
        run=run,
        findings=findings,
        step=max(points),
        evidence={"benchmark_version": version.pk, "eval_metric": names[0]},
    )
    return findings
