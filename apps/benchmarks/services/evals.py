"""Evals: an eval is a run of kind `eval` whose per-task results stream in as `task_result` events;
`eval_finalize`, the kind's success hook, stores its headline metrics once the run succeeds (gates and training
subscribe to that point, apps.runs.kinds)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import fsspec
from django.db import transaction
from pydantic import ValidationError as PydanticError
from rest_framework.exceptions import ValidationError

from apps.accounts.models import User
from apps.benchmarks.models import BenchmarkVersion, Eval
from apps.benchmarks.selectors import eval_metrics_for
from apps.benchmarks.services.benchmarks import canonical_json
from apps.benchmarks.services.learning import run_start
from apps.common.errors import pydantic_problems
from apps.runs import kinds
from apps.runs.models import Checkpoint, Run, RunKind, RunStatus
from apps.runs.services import run_create
from apps.runs.storage import file_uri, storage_uri, worker_storage_options
from workers.envs.registry import get_environment
from workers.models.registry import model_name_problems
from workers.rewards.schema import validate_reward_spec
from workers.specs import EvalConfig

DEFAULT_EVAL_TOKENS = 384
"""An eval's completion budget per turn when its caller names none."""


def _checkpoint_exists(uri: str) -> bool:
    try:
        fs, path = fsspec.core.url_to_fs(uri, **worker_storage_options())
        return bool(fs.exists(path))
    except (OSError, ValueError):
        return False


def eval_config_hash(config: Mapping[str, Any], benchmark_version: BenchmarkVersion) -> str:
    return hashlib.sha256(
        canonical_json({"config": dict(config), "version": benchmark_version.content_hash}).encode()
    ).hexdigest()


def _eval_model(
    problems: dict[str, list[str]], *, checkpoint: Checkpoint | None, base_model: str
) -> tuple[str, str | None]:
    """(base model, trainer checkpoint URI or None) that an eval of `checkpoint` or `base_model` loads; what is
    wrong with them goes to `problems`."""
    checkpoint_uri: str | None = None
    if checkpoint is not None:
        model = (checkpoint.run.spec.get("config") or {}).get("base_model", "")
        if base_model and base_model != model:
            problems["base_model"] = [f"checkpoint {checkpoint} was trained from {model!r}; leave base_model empty"]
        base_model, checkpoint_uri = model, checkpoint.uri
        if not _checkpoint_exists(checkpoint.uri):
            problems["checkpoint"] = [f"checkpoint file {checkpoint.uri} does not exist (deleted from storage?)"]
        elif checkpoint.run.kind == RunKind.SFT or checkpoint.run.kind in kinds.external_kinds():
            # An SFT run saves a whole model directory, not a trainer checkpoint, and so does a trainer outside
            # Crucible (TRL's checkpoint-N, any transformers Trainer): evaluate it as the base model.
            if not checkpoint.uri.startswith("file://"):
                problems["checkpoint"] = [
                    f"{checkpoint.uri} is an SFT model in object storage; evals load SFT models from local storage "
                    "only (copy it to a model directory and pass base_model)"
                ]
            base_model, checkpoint_uri = checkpoint.uri.removeprefix("file://"), None
    elif not base_model:
        problems["base_model"] = ["name a base model or a checkpoint to evaluate"]
    if base_model and (found := model_name_problems(base_model)):
        problems.setdefault("base_model", []).extend(found)
    return base_model, checkpoint_uri


def _eval_config(
    benchmark_version: BenchmarkVersion,
    *,
    checkpoint: Checkpoint | None,
    base_model: str,
    k: int,
    temperature: float | None,
    max_new_tokens: int,
) -> EvalConfig:
    """The eval job's config, or a 400 naming what is wrong (no tasks, the model, the checkpoint, a setting)."""
    problems: dict[str, list[str]] = {}
    if benchmark_version.task_count == 0 or not benchmark_version.tasks_file:
        problems["benchmark_version"] = [f"{benchmark_version} has no tasks; add a version with tasks"]
    base_model, checkpoint_uri = _eval_model(problems, checkpoint=checkpoint, base_model=base_model)
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
    except PydanticError as exc:
        raise ValidationError(pydantic_problems(exc))
    return config


def eval_launch(
    *,
    benchmark_version: BenchmarkVersion,
    created_by: User,
    checkpoint: Checkpoint | None = None,
    base_model: str = "",
    k: int = 1,
    temperature: float | None = None,
    max_new_tokens: int = DEFAULT_EVAL_TOKENS,
    reuse: bool = True,
) -> tuple[Eval, bool]:
    """Start an eval of `checkpoint` (on its run's base model) or of `base_model` on `benchmark_version`; returns
    (eval, created). With `reuse`, an eval of the same model, version and settings that has not failed is returned
    instead of starting another."""
    config = _eval_config(
        benchmark_version,
        checkpoint=checkpoint,
        base_model=base_model,
        k=k,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
    )
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
        label = f"run {checkpoint.run_id} step {checkpoint.step}" if checkpoint else config.base_model
        reward = validate_reward_spec(get_environment(config.environment).eval_reward()).model_dump(mode="json")
        run = run_create(
            kind=RunKind.EVAL,
            name=f"Eval of {label} on {benchmark_version}",
            job=lambda run: {
                "config": payload,
                "tasks_uri": file_uri(benchmark_version.tasks_file),
                "reward": reward,
                "output_prefix": storage_uri(f"runs/{run.pk}"),
            },
            spec={"benchmark_version": benchmark_version.pk},
            created_by=created_by,
        )
        evaluation = Eval.objects.create(
            run=run,
            benchmark_version=benchmark_version,
            checkpoint=checkpoint,
            base_model=config.base_model,  # resolved: the checkpoint's base model, or an SFT run's model directory
            k=k,
            config_hash=config_hash,
            created_by=created_by,
        )
    return evaluation, True


def eval_finalize(*, run_id: int) -> None:
    """Success hook of eval runs: store the headline metrics computed from the stored per-task results. Gates
    and training react to it as subscribers of the EVAL kind's `succeeded` point."""
    evaluation = Eval.objects.select_related("run", "benchmark_version").get(run_id=run_id)
    evaluation.metrics = eval_metrics_for(evaluation)
    evaluation.save(update_fields=["metrics"])


def auto_eval_max_new_tokens(run: Run) -> int:
    """The completion budget of a run's auto-evals: the run's own `sampling.max_new_tokens` (the budget its policy
    was trained to answer within; base and checkpoints are evaluated alike, so the verdict pairs them), else the
    eval default."""
    sampling = (run.spec.get("config") or {}).get("sampling") or {}
    value = sampling.get("max_new_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else DEFAULT_EVAL_TOKENS


def eval_auto(*, run_id: int, steps: Sequence[int]) -> int:
    """Auto-eval: each new checkpoint of a run is evaluated on every benchmark version its spec's `auto_eval`
    names (an existing eval of the same checkpoint and settings is reused, so a retried call starts nothing).

    With them, once per version, the model the run starts from (its base model, or the checkpoint it resumed from
    or was initialised from) is evaluated with the same settings, so the run's held-out verdict (last checkpoint
    against its start, docs/did-it-learn.md) needs nobody to ask for it. It is its own eval run, started beside the
    first checkpoint's: the training job never waits for it, and an identical eval (another run of the same base
    model on the same version) is reused, not run again. Returns how many evals started."""
    run = Run.objects.select_related("created_by").get(pk=run_id)
    versions = list(BenchmarkVersion.objects.filter(pk__in=run.spec.get("auto_eval") or []).select_related("benchmark"))
    if not versions:
        return 0
    started = 0
    errors: list[str] = []
    tokens = auto_eval_max_new_tokens(run)
    for checkpoint in Checkpoint.objects.filter(run=run, step__in=list(steps)).select_related("run"):
        for version in versions:
            try:
                _, created = eval_launch(
                    benchmark_version=version, checkpoint=checkpoint, created_by=run.created_by, max_new_tokens=tokens
                )
            except ValidationError as exc:  # one bad version must not skip the others: record it on the run
                errors.append(f"step {checkpoint.step} on {version}: {exc.detail}")
                continue
            started += int(created)
    start, base_model = run_start(run)
    for version in versions:
        try:
            _, created = eval_launch(
                benchmark_version=version,
                checkpoint=start,
                base_model="" if start else base_model,
                created_by=run.created_by,
                max_new_tokens=tokens,
            )
        except ValidationError as exc:
            errors.append(f"the base eval ({start or base_model}) on {version}: {exc.detail}")
            continue
        started += int(created)
    if errors:
        with transaction.atomic():
            locked = Run.objects.select_for_update().get(pk=run.pk)
            previous = locked.summary.get("auto_eval_errors", [])
            fresh = [e for e in errors if e not in previous]  # a base eval that cannot start fails on every call
            locked.summary = {**locked.summary, "auto_eval_errors": [*previous, *fresh]}
            locked.save(update_fields=["summary"])
    return started
