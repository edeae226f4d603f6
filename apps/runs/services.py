"""Writes for runs: launch, dispatch, reconcile, cancel, and the ingest of worker events."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import OuterRef, Subquery
from django.utils import timezone
from django.utils.module_loading import import_string
from pydantic import ValidationError as PydanticError
from rest_framework.exceptions import ValidationError

from apps.accounts.models import User
from apps.benchmarks.models import BenchmarkVersion
from apps.datasets.models import DatasetKind, DatasetVersion
from apps.review.models import Flag
from apps.rewards.models import RewardConfigVersion
from apps.runs import ray_jobs
from apps.runs.models import (
    ROLLUP_STEPS,
    TERMINAL_STATUSES,
    Artifact,
    Checkpoint,
    IngestedRange,
    MetricPoint,
    MetricRollup,
    Run,
    RunEvent,
    RunKind,
    RunStatus,
    TaskResult,
    TrajectorySummary,
)
from apps.runs.storage import storage_uri, worker_storage_options
from workers.envs.base import check_reward_compatible, check_task_rows
from workers.envs.registry import get_environment, make_env
from workers.events import EVENTS_LIST
from workers.rl.config import (
    BUILTIN_SHAPES,
    TrainConfig,
    estimate_memory_gb,
    loss_config_for,
    shape_from_hf_config,
)

LOG_TAIL_LINES = 200
RAY_SILENCE_LIMIT = timedelta(seconds=60)

# The module each run kind executes on Ray.
JOB_MODULES = {
    RunKind.RESCORE: "workers.jobs.rescore",
    RunKind.TRAIN: "workers.jobs.train",
    RunKind.INDEX: "workers.jobs.build_index",
    RunKind.DATAGEN: "workers.jobs.datagen",
    RunKind.SFT: "workers.jobs.sft",
    RunKind.EVAL: "workers.jobs.evaluate",
}

# What the control plane does once a run of a kind succeeds, by dotted path (run id in, idempotent: a retried
# task or a second call changes nothing). Run by the `run_succeeded` Celery task after the status commits.
SUCCESS_HOOKS = {
    RunKind.INDEX: "apps.search.index_services.index_finalize",
    RunKind.DATAGEN: "apps.search.datagen_services.datagen_finalize",
    RunKind.EVAL: "apps.benchmarks.services.eval_finalize",
}


# --- ingest tokens -------------------------------------------------------------------------------------------
def ingest_token_for(run: Run) -> str:
    """HMAC of the run id and its nonce: a retried dispatch hands Ray the same token, and it opens nothing else."""
    digest = hmac.new(settings.SECRET_KEY.encode(), f"ingest:{run.pk}:{run.ingest_nonce}".encode(), hashlib.sha256)
    return f"cri_{run.pk}_{digest.hexdigest()}"


def ingest_token_valid(run: Run, token: str) -> bool:
    return bool(run.ingest_nonce) and hmac.compare_digest(ingest_token_for(run), token)


# --- launch --------------------------------------------------------------------------------------------------
@transaction.atomic
def run_launch_rescore(
    *,
    created_by: User,
    dataset_version: DatasetVersion,
    reward_version: RewardConfigVersion,
    name: str = "",
    tags: list[str] | None = None,
) -> Run:
    if dataset_version.dataset.kind != DatasetKind.TRAJECTORIES:
        raise ValidationError(
            {
                "dataset_version": [
                    f"{dataset_version} is a {dataset_version.dataset.kind} dataset; "
                    "re-scoring needs a dataset of kind 'trajectories'"
                ]
            }
        )
    run = Run.objects.create(
        kind=RunKind.RESCORE,
        name=name or f"rescore {dataset_version} with {reward_version}",
        spec={"dataset_version": dataset_version.pk, "reward_version": reward_version.pk},
        dataset_version=dataset_version,
        reward_version=reward_version,
        tags=tags or [],
        ingest_nonce=secrets.token_hex(16),
        created_by=created_by,
        progress_total=dataset_version.row_count,
    )
    _dispatch_on_commit(run)
    return run


def _pydantic_fields(exc: PydanticError, prefix: str) -> dict[str, list[str]]:
    fields: dict[str, list[str]] = {}
    for err in exc.errors()[:20]:
        path = ".".join(str(p) for p in (prefix, *err["loc"]) if p != "")
        fields.setdefault(path or prefix, []).append(err["msg"])
    return fields


def _search_env_params(config: dict[str, Any], corpus_version: DatasetVersion | None) -> dict[str, Any]:
    """The search environment reads a corpus version's index: fill `env_params.index_uri` from the ready index of
    `corpus_version` (400 naming the field when it is missing, not a corpus, or has no index yet)."""
    from apps.search.index_services import ready_index_uri

    if corpus_version is None:
        raise ValidationError(
            {
                "corpus_version": [
                    "environment 'search' needs corpus_version: the id of the corpus dataset version to search"
                ]
            }
        )
    if corpus_version.dataset.kind != DatasetKind.CORPUS:
        raise ValidationError(
            {"corpus_version": [f"{corpus_version} is a {corpus_version.dataset.kind} dataset, not a corpus"]}
        )
    env_params = dict(config.get("env_params") or {})
    env_params["index_uri"] = ready_index_uri(corpus_version)
    return {**config, "env_params": env_params}


def corpus_chunk_ids(corpus_version: DatasetVersion) -> set[str]:
    from workers.search.types import iter_chunks_jsonl

    with corpus_version.file.open("rb") as handle:
        return {chunk.chunk_id for chunk in iter_chunks_jsonl(handle.read())}


def _missing_chunks(rows: list[Any], corpus_version: DatasetVersion, limit: int = 10) -> list[str]:
    from workers.envs.search import SearchEnv

    known = corpus_chunk_ids(corpus_version)
    problems: list[str] = []
    for index, row in enumerate(rows, start=1):
        missing = sorted(SearchEnv.task_chunk_ids(row) - known) if isinstance(row, dict) else []
        if missing:
            problems.append(
                f"task row {index} names chunk(s) not in {corpus_version}: {', '.join(missing[:5])}; "
                "generate the tasks from this corpus version or pick the one they came from"
            )
            if len(problems) >= limit:
                break
    return problems


def _episode_problems(
    problems: dict[str, list[str]],
    *,
    environment: str,
    env_params: dict[str, Any],
    dataset_version: DatasetVersion,
    reward_version: RewardConfigVersion,
    corpus_version: DatasetVersion | None,
) -> list[Any] | None:
    """Add to `problems` what keeps the environment from running the dataset's tasks or the reward from scoring
    its episodes: the environment and its parameters, the dataset's kind, every task row (and, for search, the
    chunks the rows name), the reward's inputs. Returns the task rows when they could be read."""
    try:
        env_cls = get_environment(environment)
        make_env(environment, **env_params)
    except (ValueError, TypeError) as exc:
        problems["config.environment"] = [str(exc)]
        return None
    rows: list[Any] | None = None
    if dataset_version.dataset.kind != DatasetKind.TASKS:
        problems["dataset_version"] = [
            f"{dataset_version} is a {dataset_version.dataset.kind} dataset; this needs a dataset of kind 'tasks'"
        ]
    else:
        try:
            with dataset_version.file.open("rb") as handle:
                rows = [json.loads(line) for line in handle.read().split(b"\n") if line.strip()]
        except (OSError, ValueError) as exc:
            raise ValidationError({"dataset_version": [f"{dataset_version}'s file cannot be read as JSONL: {exc}"]})
        row_problems = check_task_rows(env_cls, rows, max_errors=10)
        if not row_problems and environment == "search" and corpus_version is not None:
            row_problems = _missing_chunks(rows, corpus_version)
        if row_problems:
            problems["dataset_version"] = row_problems
    reward_problems = check_reward_compatible(env_cls, reward_version.spec)
    if reward_problems:
        problems["reward_version"] = reward_problems
    return rows


def train_config_check(
    *,
    config: dict[str, Any],
    dataset_version: DatasetVersion,
    reward_version: RewardConfigVersion,
    corpus_version: DatasetVersion | None = None,
) -> TrainConfig:
    """Everything that can be known before compute starts: a refused run costs a 400 now, not a failure in an hour.
    Checks the typed config, the base model, the environment, every task row, the reward's inputs and memory; for
    the search environment also the corpus version, its index and that every chunk a task names exists."""
    if isinstance(config, dict) and config.get("environment") == "search":
        config = _search_env_params(config, corpus_version)
    try:
        parsed = TrainConfig.model_validate(config)
    except PydanticError as exc:
        raise ValidationError(_pydantic_fields(exc, "config"))
    problems: dict[str, list[str]] = {}
    try:
        loss_config_for(parsed)
    except ValueError as exc:
        problems["config.loss"] = [str(exc)]
    shape = BUILTIN_SHAPES.get(parsed.base_model)
    if shape is None:
        model_dir = Path(parsed.base_model).expanduser()
        if not (model_dir / "config.json").is_file():
            names = ", ".join(sorted(BUILTIN_SHAPES))
            problems["config.base_model"] = [
                f"unknown base model {parsed.base_model!r}: use a built-in name ({names}) or the path of a model "
                "directory with config.json on the control plane host"
            ]
        else:
            try:
                shape = shape_from_hf_config(json.loads((model_dir / "config.json").read_text()))
            except (ValueError, KeyError, TypeError) as exc:
                problems["config.base_model"] = [f"{model_dir}/config.json is not a usable model config ({exc})"]
    rows = _episode_problems(
        problems,
        environment=parsed.environment,
        env_params=parsed.env_params,
        dataset_version=dataset_version,
        reward_version=reward_version,
        corpus_version=corpus_version,
    )
    if rows is not None and len(rows) < parsed.prompts_per_step:
        problems.setdefault("config.prompts_per_step", []).append(
            f"{parsed.prompts_per_step} prompts per step but {dataset_version} has only {len(rows)} tasks"
        )
    if shape is not None and "config.loss" not in problems:
        memory = estimate_memory_gb(parsed, shape)
        if memory["total"] > parsed.compute.memory_gb:
            problems["config.compute.memory_gb"] = [
                f"this run needs about {memory['total']:g} GB ({memory}) but asks for {parsed.compute.memory_gb:g}; "
                "lower max_tokens_per_pack or prompts_per_step x group_size, turn on gradient_checkpointing or "
                "LoRA, or raise compute.memory_gb"
            ]
    if problems:
        raise ValidationError(problems)
    return parsed


@transaction.atomic
def run_launch_train(
    *,
    created_by: User,
    dataset_version: DatasetVersion,
    reward_version: RewardConfigVersion,
    config: dict[str, Any],
    name: str = "",
    tags: list[str] | None = None,
    parent: Run | None = None,
    resume_from: Checkpoint | None = None,
    corpus_version: DatasetVersion | None = None,
    allow_contamination: bool = False,
    auto_eval: list[Any] | None = None,
    allow_excluded: bool = False,
) -> Run:
    from apps.benchmarks.services import contamination_guard
    from apps.review.services import task_exclusion_guard

    parsed = train_config_check(
        config=config, dataset_version=dataset_version, reward_version=reward_version, corpus_version=corpus_version
    )
    contamination = contamination_guard(dataset_version=dataset_version, allow=allow_contamination)
    excluded = task_exclusion_guard(dataset_version=dataset_version, allow=allow_excluded)
    spec: dict[str, Any] = {
        "config": parsed.model_dump(mode="json"),
        "dataset_version": dataset_version.pk,
        "reward_version": reward_version.pk,
    }
    if excluded:
        spec["excluded_tasks"] = excluded
    if contamination:
        spec["contamination"] = contamination
        tags = [*(tags or []), "contaminated"] if "contaminated" not in (tags or []) else tags
    if auto_eval:
        spec["auto_eval"] = [version.pk for version in auto_eval]
    if corpus_version is not None and parsed.environment == "search":
        spec["corpus_version"] = corpus_version.pk
    if resume_from is not None:
        spec["resume_from"] = {"checkpoint": resume_from.pk, "uri": resume_from.uri, "step": resume_from.step}
    run = Run.objects.create(
        kind=RunKind.TRAIN,
        name=name or f"{parsed.algorithm} {parsed.base_model} on {dataset_version.dataset.name}",
        spec=spec,
        dataset_version=dataset_version,
        reward_version=reward_version,
        parent=parent,
        tags=tags or [],
        ingest_nonce=secrets.token_hex(16),
        created_by=created_by,
        progress_done=resume_from.step if resume_from is not None else 0,
        progress_total=parsed.steps,
    )
    _dispatch_on_commit(run)
    return run


@transaction.atomic
def run_launch_sft(
    *,
    created_by: User,
    dataset_version: DatasetVersion,
    reward_version: RewardConfigVersion,
    config: dict[str, Any],
    name: str = "",
    tags: list[str] | None = None,
    corpus_version: DatasetVersion | None = None,
    allow_contamination: bool = False,
) -> Run:
    """An SFT warm-up run: rejection-sample the teacher's trajectories on the tasks, fine-tune the base model on
    the kept ones. Checked like a training run: the config, the models, the environment, every task row, the
    reward's inputs and, for search, the corpus index and the tasks' chunk ids."""
    from workers.jobs.sft import SFTConfig

    if isinstance(config, dict) and config.get("environment", "search") == "search":
        config = _search_env_params({**config, "environment": "search"}, corpus_version)
    try:
        parsed = SFTConfig.model_validate(config)
    except PydanticError as exc:
        raise ValidationError(_pydantic_fields(exc, "config"))
    problems: dict[str, list[str]] = {}
    for field_name in ("teacher_model", "base_model"):
        value = getattr(parsed, field_name)
        if field_name == "teacher_model" and value == "scripted-search":
            continue
        if value not in BUILTIN_SHAPES and not (Path(value).expanduser() / "config.json").is_file():
            problems[f"config.{field_name}"] = [
                f"unknown model {value!r}: use a built-in name ({', '.join(sorted(BUILTIN_SHAPES))}) or a model "
                "directory with config.json"
            ]
    _episode_problems(
        problems,
        environment=parsed.environment,
        env_params=parsed.env_params,
        dataset_version=dataset_version,
        reward_version=reward_version,
        corpus_version=corpus_version,
    )
    if problems:
        raise ValidationError(problems)
    from apps.benchmarks.services import contamination_guard

    contamination = contamination_guard(dataset_version=dataset_version, allow=allow_contamination)
    spec: dict[str, Any] = {"config": parsed.model_dump(mode="json")}
    if contamination:
        spec["contamination"] = contamination
        tags = [*(tags or []), "contaminated"]
    if corpus_version is not None:
        spec["corpus_version"] = corpus_version.pk
    run = Run.objects.create(
        kind=RunKind.SFT,
        name=name or f"SFT warm-up of {parsed.base_model} on {dataset_version.dataset.name}",
        spec=spec,
        dataset_version=dataset_version,
        reward_version=reward_version,
        tags=tags or [],
        ingest_nonce=secrets.token_hex(16),
        created_by=created_by,
    )
    _dispatch_on_commit(run)
    return run


def run_resume(*, run: Run, user: User) -> Run:
    """A new run that continues `run` from its latest checkpoint (step counter, optimizer, RNG, data order)."""
    if run.kind != RunKind.TRAIN:
        raise ValidationError({"run": [f"run {run.pk} is a {run.kind} run; only training runs resume"]})
    if not run.is_terminal:
        raise ValidationError({"run": [f"run {run.pk} is {run.status}; stop it first, then resume"]})
    checkpoint = run.checkpoints.order_by("-step").first()
    if checkpoint is None:
        raise ValidationError({"run": [f"run {run.pk} wrote no checkpoint yet; launch it again instead"]})
    steps = int(run.spec["config"]["steps"])
    if checkpoint.step >= steps:
        raise ValidationError(
            {"run": [f"run {run.pk} finished all {steps} steps; launch a new run with more steps to train further"]}
        )
    assert run.dataset_version is not None and run.reward_version is not None
    return run_launch_train(
        created_by=user,
        dataset_version=run.dataset_version,
        reward_version=run.reward_version,
        config=run.spec["config"],
        name=f"{run.name} (resumed at step {checkpoint.step})"[:200],
        tags=list(run.tags),
        parent=run,
        resume_from=checkpoint,
        allow_contamination=bool(run.spec.get("contamination")),
        allow_excluded=True,  # a resume trains on what is still allowed: excluded tasks are left out, not refused
        auto_eval=list(BenchmarkVersion.objects.filter(pk__in=run.spec.get("auto_eval") or [])),
        corpus_version=(
            DatasetVersion.objects.filter(pk=run.spec["corpus_version"]).first()
            if run.spec.get("corpus_version")
            else None
        ),
    )


def _dispatch_on_commit(run: Run) -> None:
    from apps.runs.tasks import dispatch_run

    transaction.on_commit(lambda: dispatch_run.delay(run.pk))


def worker_spec(run: Run) -> dict[str, Any]:
    """The self-contained JSON a Ray job receives: everything it needs, no database access."""
    ingest_url = f"{settings.CRUCIBLE_PUBLIC_URL.rstrip('/')}/api/v1/runs/{run.pk}/ingest/"
    base = {"run_id": run.pk, "kind": run.kind, "ingest_url": ingest_url, "storage_options": worker_storage_options()}
    if run.kind == RunKind.RESCORE:
        assert run.dataset_version is not None and run.reward_version is not None
        return {
            **base,
            "input_uri": storage_uri(run.dataset_version.file.name),
            "output_uri": storage_uri(f"runs/{run.pk}/scores.jsonl"),
            "reward": run.reward_version.spec,
        }
    if run.kind == RunKind.TRAIN:
        assert run.dataset_version is not None and run.reward_version is not None
        resume = run.spec.get("resume_from")
        return {
            **base,
            "config": run.spec["config"],
            "input_uri": storage_uri(run.dataset_version.file.name),
            "reward": run.reward_version.spec,
            "output_prefix": storage_uri(f"runs/{run.pk}"),
            "resume_from": resume["uri"] if resume else None,
            "exclude_task_ids": list(run.spec.get("excluded_tasks") or []),
        }
    if run.kind == RunKind.SFT:
        assert run.dataset_version is not None and run.reward_version is not None
        return {
            **base,
            "config": run.spec["config"],
            "input_uri": storage_uri(run.dataset_version.file.name),
            "reward": run.reward_version.spec,
            "output_prefix": storage_uri(f"runs/{run.pk}"),
        }
    if run.kind in (RunKind.INDEX, RunKind.DATAGEN, RunKind.EVAL):
        # Their launch services (apps/search, apps/benchmarks) store the job's whole input in the spec at creation.
        return {**base, **run.spec["job"]}
    raise ValueError(f"no worker spec for kind {run.kind}")


# --- lifecycle -----------------------------------------------------------------------------------------------
def _finish(run: Run, status: str, *, reason: str = "", log_tail: str | None = None) -> None:
    run.status = status
    run.finished_at = timezone.now()
    fields = ["status", "finished_at"]
    if reason:
        run.failure_reason = reason
        fields.append("failure_reason")
    if log_tail:
        run.log_tail = log_tail
        fields.append("log_tail")
    run.save(update_fields=fields)
    _publish_status_on_commit(run)
    if status == RunStatus.SUCCEEDED and run.kind in SUCCESS_HOOKS:
        _succeeded_on_commit(run)


def _succeeded_on_commit(run: Run) -> None:
    from apps.runs.tasks import run_succeeded

    transaction.on_commit(lambda: run_succeeded.delay(run.pk))


def run_success_hook(*, run_id: int) -> None:
    """Run the kind's success hook (SUCCESS_HOOKS) for a succeeded run; nothing for other runs."""
    run = Run.objects.get(pk=run_id)
    path = SUCCESS_HOOKS.get(RunKind(run.kind))
    if run.status == RunStatus.SUCCEEDED and path:
        import_string(path)(run_id=run.pk)


def run_dispatch(*, run_id: int, final_attempt: bool = True) -> Run:
    """Submit the run's Ray job. Safe to repeat: the submission id is the run's, so Ray launches it once.

    The submission happens outside the row lock (it uploads the working directory and may take seconds); a cancel
    that lands meanwhile is honoured by stopping the job just submitted."""
    with transaction.atomic():
        run = (
            Run.objects.select_for_update(of=("self",))
            .select_related("dataset_version__dataset", "reward_version")
            .get(pk=run_id)
        )
        if run.is_terminal or run.ray_job_id:
            return run
        if run.cancel_requested_at is not None:
            _finish(run, RunStatus.STOPPED, reason="cancelled before it was submitted")
            return run
        env = {"CRUCIBLE_JOB_SPEC": json.dumps(worker_spec(run)), "CRUCIBLE_INGEST_TOKEN": ingest_token_for(run)}
        submission_id, module = run.submission_id, JOB_MODULES[RunKind(run.kind)]
    try:
        job_id = ray_jobs.submit(submission_id=submission_id, module=module, env_vars=env)
    except ray_jobs.RayUnavailable as exc:
        if not final_attempt:
            raise
        with transaction.atomic():
            run = Run.objects.select_for_update().get(pk=run_id)
            if not run.is_terminal and not run.ray_job_id:
                _finish(run, RunStatus.FAILED, reason=str(exc))
            return run
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        now = timezone.now()
        run.ray_job_id = job_id
        run.ray_address = settings.RAY_ADDRESS
        run.submitted_at = run.submitted_at or now
        run.ray_checked_at = now
        run.save(update_fields=["ray_job_id", "ray_address", "submitted_at", "ray_checked_at"])
        if run.cancel_requested_at is not None:
            _stop_on_commit(run)
        elif not run.is_terminal:
            _publish_status_on_commit(run)
        return run


RAY_TO_STATUS = {
    "PENDING": RunStatus.PENDING,
    "RUNNING": RunStatus.RUNNING,
    "SUCCEEDED": RunStatus.SUCCEEDED,
    "FAILED": RunStatus.FAILED,
    "STOPPED": RunStatus.STOPPED,
}


def run_reconcile(*, run_id: int, now: datetime | None = None) -> Run:
    """Bring one run's row in line with its Ray job. A job Ray no longer knows, or a cluster silent for
    RAY_SILENCE_LIMIT, fails the run with that reason: no row stays running after its job is gone."""
    now = now or timezone.now()
    run = Run.objects.get(pk=run_id)
    if run.is_terminal or not run.ray_job_id:
        return run
    if run.cancel_requested_at is not None:
        # A cancel whose stop request was lost (Ray down at the time) is re-sent on every pass until Ray confirms.
        try:
            ray_jobs.stop(run.ray_job_id, run.ray_address or None)
        except ray_jobs.RayUnavailable:
            pass
    try:
        ray_state = ray_jobs.state(run.ray_job_id, run.ray_address or None)
    except ray_jobs.RayJobNotFound:
        return _reconcile_apply(run_id, RunStatus.FAILED, f"Ray job {run.ray_job_id} no longer exists on the cluster")
    except ray_jobs.RayUnavailable as exc:
        last = run.ray_checked_at or run.submitted_at or run.created_at
        if now - last > RAY_SILENCE_LIMIT:
            return _reconcile_apply(
                run_id,
                RunStatus.FAILED,
                f"Ray cluster at {run.ray_address} has not answered since {last:%H:%M:%S}: {exc}",
            )
        return run
    status = RAY_TO_STATUS.get(ray_state.status, RunStatus.RUNNING)
    tail = None
    if status == RunStatus.FAILED:
        # The worker's own log lines stay; Ray's output (the traceback) follows them.
        ray_tail = ray_jobs.logs_tail(run.ray_job_id, run.ray_address or None)
        reported = run.log_tail.splitlines()[-(LOG_TAIL_LINES // 2) :]
        tail = "\n".join([*reported, "--- Ray job output ---", *ray_tail.splitlines()]) if ray_tail else None
    reason = ray_state.message if status == RunStatus.FAILED else ""
    return _reconcile_apply(run_id, status, reason, log_tail=tail, checked_at=now)


@transaction.atomic
def _reconcile_apply(
    run_id: int, status: str, reason: str, *, log_tail: str | None = None, checked_at: datetime | None = None
) -> Run:
    run = Run.objects.select_for_update().get(pk=run_id)
    if run.is_terminal:
        return run
    if checked_at is not None:
        run.ray_checked_at = checked_at
        run.save(update_fields=["ray_checked_at"])
    if status in TERMINAL_STATUSES:
        _finish(run, status, reason=reason, log_tail=log_tail)
    elif status != run.status:
        run.status = status
        fields = ["status"]
        if status == RunStatus.RUNNING and run.started_at is None:
            run.started_at = timezone.now()
            fields.append("started_at")
        run.save(update_fields=fields)
        _publish_status_on_commit(run)
    return run


def run_cancel(*, run: Run, user: User) -> Run:
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)
        if run.is_terminal:
            raise ValidationError({"status": [f"run {run.pk} is already {run.status}; nothing to cancel"]})
        run.cancel_requested_at = timezone.now()
        run.save(update_fields=["cancel_requested_at"])
        if not run.ray_job_id:
            _finish(run, RunStatus.STOPPED, reason=f"cancelled by {user.username} before it was submitted")
            return run
    _stop_on_commit(run)
    return run


def _stop_on_commit(run: Run) -> None:
    from apps.runs.tasks import cancel_run

    transaction.on_commit(lambda: cancel_run.delay(run.pk))


def run_stop_ray_job(*, run_id: int) -> None:
    run = Run.objects.get(pk=run_id)
    if run.ray_job_id:
        ray_jobs.stop(run.ray_job_id, run.ray_address or None)
    run_reconcile(run_id=run_id)


# --- ingest --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class IngestResult:
    accepted: int
    duplicates: int
    last_seq: int
    payloads: list[dict[str, Any]] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)


def _ts(event: Any, default: datetime) -> datetime:
    if event.time is None:
        return default
    return datetime.fromtimestamp(event.time, tz=timezone.get_current_timezone())


def _rollup_metrics(run_id: int, points: list[tuple[Any, ...]]) -> None:
    """Fold a batch's new metric points (run, step, name, value, time) into the run's roll-up buckets, in the
    ingest transaction: the ledger already made these points new, so each is counted exactly once."""
    if not points:
        return
    buckets: dict[tuple[str, int], list[float]] = {}
    for _, step, name, value, _ in points:
        agg = buckets.get((name, step // ROLLUP_STEPS))
        if agg is None:
            buckets[(name, step // ROLLUP_STEPS)] = [value, value, value, 1.0]
        else:
            agg[0], agg[1] = min(agg[0], value), max(agg[1], value)
            agg[2] += value
            agg[3] += 1
    rows = [(run_id, name, bucket, lo, hi, total, int(n)) for (name, bucket), (lo, hi, total, n) in buckets.items()]
    with connection.cursor() as cursor:
        cursor.executemany(
            """
            INSERT INTO runs_metricrollup (run_id, name, bucket, min, max, sum, count)
            VALUES (%s, %s, %s, %s, %s, %s, %s)
            ON CONFLICT (run_id, name, bucket) DO UPDATE SET
              min = LEAST(runs_metricrollup.min, EXCLUDED.min),
              max = GREATEST(runs_metricrollup.max, EXCLUDED.max),
              sum = runs_metricrollup.sum + EXCLUDED.sum,
              count = runs_metricrollup.count + EXCLUDED.count
            """,
            rows,
        )


def metric_series_replace(*, run_id: int, name: str, points: list[tuple[int, float]]) -> None:
    """Replace one series of a run outside ingest (values the control plane computes, e.g. eval results per
    checkpoint): its points and its roll-ups together, so long-range charts read the same data as short ones."""
    now = timezone.now()
    with transaction.atomic():
        MetricPoint.objects.filter(run_id=run_id, name=name).delete()
        MetricRollup.objects.filter(run_id=run_id, name=name).delete()
        rows = [(run_id, step, name, value, now) for step, value in points]
        _copy_rows(MetricPoint._meta.db_table, ["run_id", "step", "name", "value", "time"], rows)
        _rollup_metrics(run_id, rows)


def metric_rollups_rebuild(*, run_ids: list[int] | None = None) -> None:
    """Recompute roll-ups from the stored points (for data loaded around ingest, e.g. by a bulk COPY)."""
    where, params = ("WHERE run_id = ANY(%s)", [run_ids]) if run_ids is not None else ("", [])
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM runs_metricrollup {where}", params)
        cursor.execute(
            "INSERT INTO runs_metricrollup (run_id, name, bucket, min, max, sum, count) "
            f"SELECT run_id, name, step / %s, min(value), max(value), sum(value), count(*) FROM runs_metricpoint "
            f"{where} GROUP BY run_id, name, step / %s",
            [ROLLUP_STEPS, *params, ROLLUP_STEPS],
        )


def _copy_rows(table: str, columns: list[str], rows: list[tuple[Any, ...]]) -> None:
    if not rows:
        return
    with connection.cursor() as cursor:
        with cursor.cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)


def ingest_batch(*, run_id: int, events: list[Any], publish: bool = True) -> IngestResult:
    """Store a batch of worker events exactly once per (run, seq), then publish the new ones to the run's group.

    With publish=False the caller publishes `payloads` itself after this returns (the transaction has committed):
    the async ingest view does, so the publish reuses the server's event loop and Redis connection."""
    now = timezone.now()
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        unique: dict[int, Any] = {}
        for event in events:
            unique.setdefault(event.seq, event)
        # Seqs above the run's high-water mark cannot be stored yet: only the rest needs a lookup (none when in order).
        maybe_seen = [seq for seq in unique if seq <= run.last_seq]
        existing = _stored_seqs(run.pk, maybe_seen) if maybe_seen else set()
        fresh = [unique[s] for s in sorted(unique) if s not in existing]
        if not fresh:
            return IngestResult(accepted=0, duplicates=len(events), last_seq=run.last_seq)

        run.ingest_batches += 1
        batch_no = run.ingest_batches
        ledger: list[tuple[Any, ...]] = []
        payloads: list[dict[str, Any]] = []
        metrics: list[tuple[Any, ...]] = []
        trajectories: list[TrajectorySummary] = []
        artifacts: list[Artifact] = []
        checkpoints: list[Checkpoint] = []
        task_results: list[TaskResult] = []
        flags: list[Any] = []
        log_events: list[Any] = []
        progress: Any = None
        summary: dict[str, Any] | None = None
        dumped = iter(EVENTS_LIST.dump_python(fresh, mode="json"))
        for event in fresh:
            payload = next(dumped)
            payloads.append(payload)
            kind = event.kind
            if kind != "metric":  # metric values are stored once, as MetricPoint rows
                data = {k: v for k, v in payload.items() if k != "seq"}
                ledger.append((run.pk, event.seq, batch_no, kind, json.dumps(data, allow_nan=False), now))
            if kind == "metric":
                at = _ts(event, now)
                metrics += [(run.pk, event.step, k, v, at) for k, v in event.values.items()]
            elif kind == "log":
                log_events.append(event)
            elif kind == "progress":
                if progress is None or event.seq > progress.seq:
                    progress = event
            elif kind == "trajectory":
                trajectories.append(
                    TrajectorySummary(
                        run=run,
                        trajectory_id=event.trajectory_id,
                        task_id=event.task_id,
                        step=event.step,
                        reward=event.reward,
                        terms=event.terms,
                        num_turns=event.num_turns,
                        error=event.error or "",
                        storage_uri=event.storage_uri,
                    )
                )
            elif kind == "artifact":
                artifacts.append(
                    Artifact(run=run, name=event.name, uri=event.uri, size_bytes=event.size_bytes, meta=event.meta)
                )
            elif kind == "checkpoint":
                checkpoints.append(Checkpoint(run=run, step=event.step, uri=event.uri, metrics=event.metrics))
            elif kind == "task_result":
                task_results.append(TaskResult(run=run, **event.model_dump(exclude={"seq", "time", "kind"})))
            elif kind == "flag":
                flags.append(event)
            elif kind == "summary":
                summary = {**(summary or run.summary), **event.data}
        # COPY, not INSERT: a 1,000-event batch goes in ~10x faster, and the row lock above keeps it exactly-once.
        ranges = [(run.pk, lo, hi, batch_no) for lo, hi in _seq_ranges([e.seq for e in fresh])]
        _copy_rows(IngestedRange._meta.db_table, ["run_id", "lo", "hi", "batch"], ranges)
        _copy_rows(RunEvent._meta.db_table, ["run_id", "seq", "batch", "kind", "data", "created_at"], ledger)
        _copy_rows(MetricPoint._meta.db_table, ["run_id", "step", "name", "value", "time"], metrics)
        _rollup_metrics(run.pk, metrics)
        TrajectorySummary.objects.bulk_create(trajectories, ignore_conflicts=True, batch_size=2000)
        # After the summaries: a flag usually arrives in the same batch as its trajectory.
        _store_flags(run, flags, new_trajectory_ids=[t.trajectory_id for t in trajectories])
        Artifact.objects.bulk_create(artifacts, ignore_conflicts=True)
        Checkpoint.objects.bulk_create(checkpoints, ignore_conflicts=True)
        if checkpoints and run.spec.get("auto_eval"):
            _auto_eval_on_commit(run.pk, [c.step for c in checkpoints])
        TaskResult.objects.bulk_create(task_results, ignore_conflicts=True)

        fields = ["last_seq", "ingest_batches"]
        run.last_seq = max(run.last_seq, fresh[-1].seq)
        # Batches can commit out of seq order (a retry, two flushes racing): progress and the log tail follow
        # seq order, never commit order, so neither goes backwards.
        if progress is not None and progress.seq > run.progress_seq:
            run.progress_done, run.progress_total, run.progress_seq = progress.done, progress.total, progress.seq
            fields += ["progress_done", "progress_total", "progress_seq"]
        if log_events:
            if log_events[0].seq > run.log_seq:
                lines = [line for event in log_events for line in event.lines]
                run.log_tail = "\n".join((run.log_tail.splitlines() + lines)[-LOG_TAIL_LINES:])
            else:
                run.log_tail = _log_tail_from_ledger(run.pk)
            run.log_seq = max(run.log_seq, log_events[-1].seq)
            fields += ["log_tail", "log_seq"]
        if summary is not None:
            run.summary = summary
            fields.append("summary")
        if run.status == RunStatus.PENDING:
            # The worker is talking, so its job runs, whatever the last reconcile saw.
            run.status = RunStatus.RUNNING
            run.started_at = run.started_at or now
            fields += ["status", "started_at"]
        run.save(update_fields=fields)

        from apps.runs.live import publish_events

        state = {**run_state(run), "batch": batch_no}
        if publish:
            transaction.on_commit(lambda: publish_events(run.pk, payloads, state))
        return IngestResult(
            accepted=len(fresh),
            duplicates=len(events) - len(fresh),
            last_seq=run.last_seq,
            payloads=payloads,
            state=state,
        )


def _store_flags(run: Run, flags: list[Any], *, new_trajectory_ids: list[str]) -> None:
    """Store flag events as `Flag` rows, one per (run, trajectory, detector) (a repeat is ignored), linked to the
    run's trajectory summary with that id when there is one. A flag that came before its trajectory's summary is
    linked when the summary arrives."""
    if flags:
        refs = {event.trajectory_id for event in flags}
        summaries = dict(
            TrajectorySummary.objects.filter(run=run, trajectory_id__in=refs).values_list("trajectory_id", "pk")
        )
        _queue_flags_on_commit()
        Flag.objects.bulk_create(
            [
                Flag(
                    run=run,
                    trajectory_id=summaries.get(event.trajectory_id),
                    trajectory_ref=event.trajectory_id,
                    detector=event.detector,
                    detector_version=event.detector_version,
                    severity=event.severity,
                    evidence=event.evidence,
                    step=event.step,
                )
                for event in flags
            ],
            ignore_conflicts=True,
            batch_size=2000,
        )
    if new_trajectory_ids:
        Flag.objects.filter(run=run, trajectory__isnull=True, trajectory_ref__in=new_trajectory_ids).update(
            trajectory=Subquery(
                TrajectorySummary.objects.filter(run=run, trajectory_id=OuterRef("trajectory_ref")).values("pk")[:1]
            )
        )


def _queue_flags_on_commit() -> None:
    """New flags join the review queues that match them right after the commit (beat re-syncs every minute as a
    backstop, so a lost task only delays them)."""
    from apps.review.tasks import review_queues_sync

    transaction.on_commit(review_queues_sync.delay, robust=True)


def _auto_eval_on_commit(run_id: int, steps: list[int]) -> None:
    from apps.runs.tasks import auto_eval_checkpoints

    transaction.on_commit(lambda: auto_eval_checkpoints.delay(run_id, steps), robust=True)


def _seq_ranges(seqs: list[int]) -> list[tuple[int, int]]:
    """Sorted seqs as closed ranges of consecutive numbers: [1, 2, 3, 7] -> [(1, 3), (7, 7)]."""
    ranges: list[tuple[int, int]] = []
    for seq in seqs:
        if ranges and seq == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], seq)
        else:
            ranges.append((seq, seq))
    return ranges


def _stored_seqs(run_id: int, seqs: list[int]) -> set[int]:
    """Which of `seqs` an earlier batch stored (only asked for seqs at or below the run's high-water mark)."""
    low, high = min(seqs), max(seqs)
    ranges = IngestedRange.objects.filter(run_id=run_id, hi__gte=low, lo__lte=high).values_list("lo", "hi")
    return {seq for lo, hi in ranges for seq in seqs if lo <= seq <= hi}


def _log_tail_from_ledger(run_id: int) -> str:
    """The last LOG_TAIL_LINES lines in seq order, rebuilt from the ledger (only when a late batch arrives)."""
    recent = RunEvent.objects.filter(run_id=run_id, kind="log").order_by("-seq").values_list("data", flat=True)
    lines: list[str] = []
    for data in recent[:LOG_TAIL_LINES]:
        lines[:0] = data["lines"]
        if len(lines) >= LOG_TAIL_LINES:
            break
    return "\n".join(lines[-LOG_TAIL_LINES:])


def run_state(run: Run) -> dict[str, Any]:
    return {
        "id": run.pk,
        "status": run.status,
        "progress_done": run.progress_done,
        "progress_total": run.progress_total,
        "failure_reason": run.failure_reason,
        "last_seq": run.last_seq,
    }


def _publish_status_on_commit(run: Run) -> None:
    from apps.runs.live import publish_events

    state = run_state(run)
    transaction.on_commit(lambda: publish_events(run.pk, [], state))
