"""Reads for benchmarks and evals: per-task scores, paired comparisons, headline metrics, contamination findings."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rest_framework.exceptions import ValidationError

from apps.benchmarks.models import BenchmarkTask, BenchmarkVersion, Eval
from apps.datasets.models import DatasetVersion
from apps.runs.models import TaskResult
from workers.evals.paired import TaskScore


def eval_metrics(results: Iterable[TaskResult], k: int, task_count: int | None = None) -> dict[str, float]:
    """Headline metrics from per-task results: pass@1..k (unbiased), mean_score, the task count, and how many of
    the version's `task_count` tasks reported nothing (`missing_tasks`; each counts as k failed attempts, so a
    lost result can only lower a score, never raise it)."""
    from workers.evals.stats import pass_at_ks

    rows = list(results)
    missing = max(0, (task_count or len(rows)) - len(rows))
    counts = [(r.samples, r.passed) for r in rows] + [(k, 0)] * missing
    if not counts:
        return {"tasks": 0.0}
    metrics = pass_at_ks(counts, min(k, min(n for n, _ in counts)))
    metrics["mean_score"] = sum(r.score for r in rows) / len(counts)
    metrics["tasks"] = float(len(counts))
    metrics["missing_tasks"] = float(missing)
    return metrics


def eval_metrics_for(evaluation: Eval) -> dict[str, float]:
    return eval_metrics(
        TaskResult.objects.filter(run_id=evaluation.run_id), evaluation.k, evaluation.benchmark_version.task_count
    )


def eval_task_scores(evaluation: Eval) -> dict[str, TaskScore]:
    """Per-task scores of an eval, with each task's tags, difficulty and provenance for slicing."""
    meta = {
        t.task_id: t
        for t in BenchmarkTask.objects.filter(version_id=evaluation.benchmark_version_id).only(
            "task_id", "tags", "difficulty", "provenance"
        )
    }
    scores: dict[str, TaskScore] = {}
    for result in TaskResult.objects.filter(run_id=evaluation.run_id).only("task_id", "score"):
        task = meta.get(result.task_id)
        scores[result.task_id] = TaskScore(
            score=result.score,
            tags=tuple(task.tags) if task else (),
            difficulty=task.difficulty if task else "",
            source=task.provenance if task else "",
        )
    return scores


def eval_compare(*, before: Eval, after: Eval, slice_by: Sequence[str] = (), alpha: float = 0.05) -> dict[str, Any]:
    """Two evals compared task by task (`workers.evals.paired.compare_paired`), with the per-task differences."""
    from workers.evals.paired import compare_paired

    bad = [s for s in slice_by if s not in ("tag", "difficulty", "source")]
    if bad:
        raise ValidationError({"slice_by": [f"unknown slice {bad[0]!r}; use tag, difficulty or source"]})
    if not 0 < alpha < 0.5:
        raise ValidationError({"alpha": [f"must be between 0 and 0.5 (got {alpha})"]})
    a, b = eval_task_scores(before), eval_task_scores(after)
    if not set(a) & set(b):
        raise ValidationError(
            {"after": [f"evals {before.pk} and {after.pk} share no task; compare evals of the same benchmark"]}
        )
    comparison = compare_paired(a, b, alpha=alpha, slice_by=slice_by)
    tasks = [
        {
            "task_id": task_id,
            "before": a[task_id].score,
            "after": b[task_id].score,
            "diff": b[task_id].score - a[task_id].score,
        }
        for task_id in sorted(set(a) & set(b))
    ]
    return {
        "before": {"eval": before.pk, "model": before.model_label, "benchmark_version": before.benchmark_version_id},
        "after": {"eval": after.pk, "model": after.model_label, "benchmark_version": after.benchmark_version_id},
        "alpha": alpha,
        "comparison": comparison.to_dict(),
        "tasks": tasks,
    }


def _normalized(text: str) -> str:
    return " ".join(text.lower().split())


def task_fingerprints(row: Mapping[str, Any]) -> set[str]:
    """sha1 of each prompt-like text of a task row (prompt text or message contents, code_prompt), normalised
    for case and whitespace: two rows sharing one are the same task for contamination purposes."""
    texts: list[str] = []
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        texts.append(prompt)
    elif isinstance(prompt, list):
        texts.append("\n".join(str(m.get("content", "")) for m in prompt if isinstance(m, dict)))
    for key in ("code_prompt", "question"):
        if isinstance(row.get(key), str):
            texts.append(row[key])
    return {hashlib.sha1(_normalized(t).encode()).hexdigest() for t in texts if _normalized(t)}


def contamination_check(
    *, dataset_version: DatasetVersion, versions: Sequence[BenchmarkVersion] | None = None
) -> list[dict[str, Any]]:
    """What training on `dataset_version` would contaminate: for every benchmark version a gate pins (or each of
    `versions`), whether it lists this dataset version as never-train-on, and which of its tasks appear in the
    data. [] when clean."""
    chosen = (
        BenchmarkVersion.objects.filter(pk__in=[v.pk for v in versions])
        if versions is not None
        else BenchmarkVersion.objects.filter(gates__isnull=False)
    )
    gated = list(chosen.distinct().select_related("benchmark").prefetch_related("gates", "excluded_training_data"))
    if not gated:
        return []
    training: set[str] = set()
    with dataset_version.file.open("rb") as handle:
        for line in handle:
            if line.strip():
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict):
                    training |= task_fingerprints(row)
    found: list[dict[str, Any]] = []
    for version in gated:
        excluded = any(dv.pk == dataset_version.pk for dv in version.excluded_training_data.all())
        overlapping = sorted(
            task.task_id
            for task in version.tasks.only("task_id", "payload")
            if task_fingerprints(task.payload) & training
        )
        if excluded or overlapping:
            found.append(
                {
                    "benchmark_version": version.pk,
                    "benchmark": str(version),
                    "gates": sorted(g.name for g in version.gates.all()),
                    "excluded": excluded,
                    "overlapping_tasks": overlapping,
                }
            )
    return found
