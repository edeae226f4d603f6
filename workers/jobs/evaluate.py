"""The eval job (`python -m workers.jobs.evaluate`): a model or a checkpoint on one benchmark version.

For every task of the version it runs `k` episodes in the benchmark's environment, scores each by the
benchmark's `score_field` (an episode metric such as `tests_passed`, or `reward`), and reports as it goes:
- one `task_result` event per task (`passed` of `k` attempts, the mean score, how the attempts ended), which the
  control plane stores as the eval's per-task results and streams to the page;
- a trajectory summary per attempt, with the full records written to object storage in shards;
- the trajectory detectors' flags on every attempt (workers.detectors; `detectors` in the job spec, all of them
  with their defaults when left out) and the running flag rates beside pass@1;
- progress, and at the end a summary with pass@1 .. pass@k (the unbiased estimator, `workers.evals.stats`).

A checkpoint is a trainer checkpoint (`workers.rl.learner`): it is loaded onto its base model (LoRA adapters
merged) before generation. An attempt whose environment hit an infrastructure error (the sandbox could not start)
fails the job rather than counting as a failed answer: a broken harness must not look like a weak model.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from workers.detectors.registry import flag_metrics
from workers.envs.registry import configure_storage, get_environment
from workers.evals.stats import pass_at_ks
from workers.findings import Finding
from workers.jobs.common import load_spec, reporter_for
from workers.jobs.preflight import preflight_models
from workers.models import make_backend
from workers.models.registry import resolve_base_model
from workers.reporting import configure_logging, report_flags
from workers.rl.checkpoints import checkpoint_policy_state
from workers.rl.rollout import RolloutWorker
from workers.rl.steps import trajectory_summary
from workers.search.metrics import mean_metrics
from workers.specs import EvalConfig, EvalSpec
from workers.storage import read_bytes, write_bytes

log = logging.getLogger("crucible.evaluate")

PASS_THRESHOLD = 1.0 - 1e-9
"""An attempt passes when its score reaches 1 (all tests, the exact answer); a partial score counts in `score`."""


def task_result(task_id: str, samples: Sequence[Any], score_field: str) -> dict[str, Any]:
    """The `task_result` event fields of one task's attempts (rollout samples)."""
    scores = [attempt_score(sample, score_field) for sample in samples]
    outcomes: Counter[str] = Counter()
    for sample in samples:
        sandbox = sample.trajectory.get("sandbox") or {}
        outcomes[sandbox.get("outcome") or ("error" if sample.error else "completed")] += 1
    return {
        "task_id": task_id,
        "samples": len(samples),
        "passed": sum(1 for score in scores if score >= PASS_THRESHOLD),
        "score": min(1.0, max(0.0, sum(scores) / len(scores))),
        "outcomes": dict(outcomes),
        "trajectory_ids": [sample.trajectory["id"] for sample in samples],
    }


def attempt_score(sample: Any, score_field: str) -> float:
    """One attempt's score in [0, 1]: the reward, or the named episode metric."""
    value = sample.reward if score_field == "reward" else sample.episode_metrics.get(score_field)
    if value is None:
        raise ValueError(
            f"score_field {score_field!r} is not an episode metric of this environment; "
            f"it reports: reward, {', '.join(sorted(sample.episode_metrics)) or 'nothing else'}"
        )
    return min(1.0, max(0.0, float(value)))


def load_policy(config: EvalConfig, opts: dict[str, Any]) -> Any:
    """The transformers backend for the base model, with the checkpoint's weights loaded when one is named."""

    backend = make_backend("transformers", str(resolve_base_model(config.base_model)), threads=config.threads)
    if config.checkpoint_uri:
        state, version = checkpoint_policy_state(config.base_model, config.checkpoint_uri, opts, config.threads)
        backend.load_state_dict(state, version)
    return backend


def run(spec: EvalSpec) -> dict[str, Any]:
    # One function on purpose: a job's wiring, read top to bottom (read the tasks, load the model, run the episodes,
    # write and report).
    config, opts = spec.config, spec.storage_options
    configure_storage(opts)
    started = time.perf_counter()
    with reporter_for(spec) as reporter:
        preflight_models(spec, reporter)  # the models it names are here, or the run fails now
        env_cls = get_environment(config.environment)
        rows = [json.loads(line) for line in read_bytes(spec.tasks_uri, opts).split(b"\n") if line.strip()]
        if not rows:
            raise ValueError(f"{spec.tasks_uri} holds no tasks: a benchmark version needs at least one")
        for index, row in enumerate(rows, start=1):
            env_cls.validate_task_row(row, index=index)
        what = config.checkpoint_uri or config.base_model
        reporter.log(f"evaluating {what} on {len(rows)} tasks x {config.k} attempts ({config.environment})")
        reporter.progress(0, len(rows), phase="evaluation")
        worker = RolloutWorker(
            load_policy(config, opts),
            environment=config.environment,
            env_params=config.env_params,
            reward=spec.reward,
            temperature=config.temperature,
            top_p=config.top_p,
            max_new_tokens=config.max_new_tokens,
            detectors=spec.detectors,
        )
        ensembles: list[dict[str, float]] = []  # per task, the k attempts fused (Context-1's "4x")
        counts: list[tuple[int, int]] = []
        findings_per_attempt: list[list[Finding]] = []
        scores: list[float] = []
        outcomes: Counter[str] = Counter()
        for shard, at in enumerate(range(0, len(rows), config.tasks_per_batch), start=1):
            batch = rows[at : at + config.tasks_per_batch]
            result = worker.rollout(batch, group_size=config.k, seed=config.seed + at, id_prefix=f"eval-{shard}-")
            broken = [s for s in result.samples if s.error and s.error.startswith("sandbox error")]
            if broken:
                raise RuntimeError(f"task {broken[0].task_id}: {broken[0].error}; the eval stops (nothing is scored)")
            uri = f"{spec.output_prefix}/eval/trajectories-{shard:05d}.jsonl"
            write_bytes(uri, "".join(json.dumps(s.trajectory) + "\n" for s in result.samples).encode(), opts)
            by_task: dict[str, list[Any]] = {}
            for sample in result.samples:
                by_task.setdefault(sample.task_id, []).append(sample)
                reporter.trajectory(**trajectory_summary(sample, 0), storage_uri=uri)
                report_flags(reporter, sample.findings, step=0)  # after its trajectory, so ingest links them
                findings_per_attempt.append(sample.findings)
            for task_id, samples in by_task.items():
                fused = env_cls.ensemble_metrics([s.trajectory for s in samples])
                if fused is not None:
                    ensembles.append(fused)
                fields = task_result(task_id, samples, config.score_field)
                reporter.task_result(**fields)
                counts.append((fields["samples"], fields["passed"]))
                scores.append(fields["score"])
                outcomes.update(fields["outcomes"])
            done = min(at + config.tasks_per_batch, len(rows))
            reporter.progress(done, len(rows), phase="evaluation")
            running = pass_at_ks(counts, 1)
            values = {"eval/pass@1": running["pass@1"], "eval/mean_score": sum(scores) / len(scores)}
            values.update(flag_metrics(findings_per_attempt, spec.detectors))
            reporter.metric(done, values)
            reporter.log(f"{done}/{len(rows)} tasks: pass@1 so far {running['pass@1']:.3f}")
        metrics = {**pass_at_ks(counts, config.k), "mean_score": sum(scores) / len(scores)}
        if ensembles:
            metrics.update({f"ensemble_{config.k}x/{k}": v for k, v in mean_metrics(ensembles).items()})
        summary = {
            "eval": {
                "tasks": len(rows),
                "k": config.k,
                "metrics": metrics,
                "outcomes": dict(outcomes),
                "seconds": round(time.perf_counter() - started, 1),
            }
        }
        reporter.summary(summary)
        return summary


def main() -> None:
    configure_logging()
    run(load_spec(EvalSpec))


if __name__ == "__main__":
    main()
