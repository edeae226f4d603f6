"""Launches of the real-time RL run kinds: `serve` (an OpenAI-compatible endpoint for a gate's deployment, a
checkpoint or a base model), `simulate` (simulated users against a serving run) and `sessiontrain` (one update
from recorded sessions, started by a loop's cycle).

Each launch checks what is knowable now and refuses with a 400 naming the field (a gate with no deployment and no
base model, an A/B deployment on another base model, a dataset of the wrong kind, a setting the worker's spec
refuses) and creates nothing; otherwise it makes the run with `apps.runs.services.run_create`, which dispatches it
once the transaction commits.

A serving run's spec holds what it serves (`gate`, `checkpoint`, `ab`, `base_model`); the job reads its target from
`GET <control_url>target/` (apps.realtime.selectors.serve_target) every `poll_seconds`, so a new deployment of the
gate, or a changed A/B split (`serve_split_update`), reaches the replicas as a hot swap without a restart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import fsspec
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from pydantic import ValidationError as PydanticError
from rest_framework.exceptions import ValidationError

from apps.accounts.authentication import LAST_USED_RESOLUTION
from apps.accounts.models import ApiToken, Capability, User, hash_secret
from apps.common.errors import pydantic_problems
from apps.datasets.models import DatasetKind, DatasetVersion
from apps.gates.models import Deployment, Gate
from apps.gates.selectors import current_deployment
from apps.rewards.models import RewardConfigVersion
from apps.runs.models import Checkpoint, Run, RunKind
from apps.runs.services import ingest_token_valid, run_create
from apps.runs.storage import file_uri, storage_uri, worker_storage_options
from workers.models.registry import model_name_problems
from workers.rl.config import TrainConfig
from workers.specs import JobSpec, ServeSpec, SessionTrainSpec, SimulateSpec

SERVE = "serve"
SIMULATE = "simulate"
SESSIONTRAIN = "sessiontrain"

Problems = dict[str, list[str]]


# --- shared checks ----------------------------------------------------------------------------------------------


def _spec_problems(
    spec_cls: type[JobSpec], job: Mapping[str, Any], *, options: Mapping[str, Any] | None = None
) -> Problems:
    """What `spec_cls` refuses in `job` plus `options`, named by field as the caller wrote it: a launch field by its
    name, an option as `options.<name>`."""
    envelope = {"run_id": 1, "kind": "check", "ingest_url": "http://check/"}
    options = options or {}
    try:
        spec_cls.model_validate({**envelope, **job, **options})
    except PydanticError as exc:
        return {
            (f"options.{path}" if path.split(".")[0] in options else path): messages
            for path, messages in pydantic_problems(exc).items()
        }
    return {}


def checkpoint_base_model(checkpoint: Checkpoint) -> str:
    """The model a checkpoint was trained from (its run's `config.base_model`, as evals read it)."""
    return str((checkpoint.run.spec.get("config") or {}).get("base_model", ""))


def _checkpoint_exists(uri: str) -> bool:
    try:
        fs, path = fsspec.core.url_to_fs(uri, **worker_storage_options())
        return bool(fs.exists(path))
    except (OSError, ValueError):
        return False


def _servable_checkpoint(problems: Problems, field: str, checkpoint: Checkpoint, base_model: str) -> None:
    """Why `checkpoint` cannot be hot-swapped onto `base_model`, into problems[field]."""
    if checkpoint.run.kind == RunKind.SFT:
        problems.setdefault(field, []).append(
            f"{checkpoint} is an SFT model directory, not a trainer checkpoint; serve it as base_model instead"
        )
        return
    trained_from = checkpoint_base_model(checkpoint)
    if base_model and trained_from != base_model:
        problems.setdefault(field, []).append(
            f"{checkpoint} was trained from {trained_from!r}, and this endpoint serves {base_model!r}"
        )
    elif not _checkpoint_exists(checkpoint.uri):
        problems.setdefault(field, []).append(f"checkpoint file {checkpoint.uri} does not exist (deleted?)")


def serve_endpoint_url(run: Run) -> str:
    """The OpenAI base URL of a serving run (what a client passes as `base_url`)."""
    job = run.spec.get("job") or {}
    host = str(job.get("http_host") or "127.0.0.1")
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://{host}:{job.get('http_port', 8100)}{job.get('route_prefix', f'/serve/{run.pk}')}/v1"


def _ab_problems(problems: Problems, ab: Any, base_model: str) -> dict[str, Any] | None:
    """The A/B option as stored in the run's spec ({"deployment": id, "share": float}), or None; what is wrong with
    it goes to problems["ab.<field>"]."""
    if ab is None:
        return None
    if not isinstance(ab, Mapping) or set(ab) - {"deployment", "share"} or "deployment" not in ab:
        problems["ab"] = ['give {"deployment": <deployment id>, "share": 0.5} (share optional: arm b\'s traffic)']
        return None
    raw = ab["deployment"]
    deployment_id = raw.pk if isinstance(raw, Deployment) else raw
    share = ab.get("share", 0.5)
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0.0 < float(share) < 1.0:
        problems["ab.share"] = ["the share of sessions arm b gets: a number between 0 and 1 (exclusive), e.g. 0.5"]
    if isinstance(deployment_id, bool) or not isinstance(deployment_id, int):
        problems["ab.deployment"] = ["a deployment id (a whole number)"]
        return None
    deployment = Deployment.objects.select_related("checkpoint__run", "gate").filter(pk=deployment_id).first()
    if deployment is None:
        problems["ab.deployment"] = [f"deployment {deployment_id} does not exist"]
        return None
    _servable_checkpoint(problems, "ab.deployment", deployment.checkpoint, base_model)
    return {"deployment": deployment.pk, "share": float(share) if isinstance(share, int | float) else share}


# --- serve --------------------------------------------------------------------------------------------------------


def serve_launch(
    *,
    user: User,
    model_name: str,
    gate: Gate | None = None,
    checkpoint: Checkpoint | None = None,
    base_model: str = "",
    replicas: int = 1,
    ab: Mapping[str, Any] | None = None,
    http_host: str = "127.0.0.1",
    http_port: int = 8100,
    options: Mapping[str, Any] | None = None,
    name: str = "",
    tags: Sequence[str] = (),
) -> Run:
    """A serving run (kind `serve`) of `gate`'s current deployment (a gate with none yet serves `base_model`, policy
    version 0, until one is deployed), of one `checkpoint`, or of `base_model` alone; with `ab`
    ({"deployment": id, "share": 0.5}) a second arm "b" serves that deployment to `share` of the sessions (by a hash
    of the session id). `options` are further ServeSpec settings (backend, threads, max_new_tokens, max_context,
    poll_seconds, key_cache_seconds, record, ...). The base model is the checkpoint's or the deployment's own; a
    `base_model` that differs from it is a 400."""
    problems: Problems = {}
    options = dict(options or {})
    reserved = sorted(set(options) & {"model_name", "base_model", "control_url", "route_prefix", "replicas"})
    if reserved or not all(isinstance(k, str) for k in options):
        problems["options"] = [f"{', '.join(reserved) or 'keys'}: set these as the launch's own fields"]
    if gate is not None and checkpoint is not None:
        problems["checkpoint"] = ["serve a gate's deployment or one checkpoint, not both"]
    serving: Checkpoint | None = checkpoint
    if gate is not None:
        deployment = current_deployment(gate)
        serving = deployment.checkpoint if deployment is not None else None
        if serving is None and not base_model:
            problems["base_model"] = [
                f"gate {gate.name!r} has no deployment yet: name the base model it serves until one is deployed"
            ]
    if serving is not None:
        trained_from = checkpoint_base_model(serving)
        if base_model and base_model != trained_from:
            problems["base_model"] = [f"{serving} was trained from {trained_from!r}; leave base_model empty"]
        elif not trained_from:
            problems["checkpoint" if gate is None else "gate"] = [f"{serving}'s run records no base model"]
        else:
            base_model = trained_from
            _servable_checkpoint(problems, "checkpoint" if gate is None else "gate", serving, base_model)
    elif gate is None and not base_model:
        problems["base_model"] = ["name the model to serve: a gate, a checkpoint or a base model"]
    if base_model and (found := model_name_problems(base_model)):
        problems.setdefault("base_model", []).extend(found)
    stored_ab = _ab_problems(problems, ab, base_model)
    job_fields = {
        "model_name": model_name,
        "base_model": base_model or "unknown",
        "replicas": replicas,
        "http_host": http_host,
        "http_port": http_port,
        **options,
    }
    derived = {"control_url": "http://check/", "route_prefix": "/check"}
    problems.update(_spec_problems(ServeSpec, {**job_fields, **derived}, options=options))
    if problems:
        raise ValidationError(problems)

    def job(run: Run) -> dict[str, Any]:
        return {
            **job_fields,
            "control_url": f"{settings.CRUCIBLE_PUBLIC_URL.rstrip('/')}/api/v1/serving/{run.pk}/",
            "route_prefix": f"/serve/{run.pk}",
        }

    what = f"gate {gate.name}" if gate else str(checkpoint) if checkpoint else base_model
    return run_create(
        kind=SERVE,
        name=name
        or f"serve {what} as {model_name}" + (f" (A/B with deployment {stored_ab['deployment']})" if stored_ab else ""),
        job=job,
        spec={
            "gate": gate.pk if gate else None,
            "checkpoint": checkpoint.pk if checkpoint else None,
            "ab": stored_ab,
            "base_model": base_model,
            "model_name": model_name,
        },
        created_by=user,
        tags=tags,
    )


def serve_split_update(*, run: Run, ab: Mapping[str, Any] | None) -> Run:
    """Start, change or end (ab=None) the A/B split of a live serving run; the replicas follow at their next poll of
    the target (its revision changes)."""
    if run.kind != SERVE:
        raise ValidationError({"run": [f"run {run.pk} is a {run.kind} run, not a serving run"]})
    if run.is_terminal:
        raise ValidationError({"run": [f"serving run {run.pk} has ended ({run.status})"]})
    problems: Problems = {}
    stored = _ab_problems(problems, ab, str(run.spec.get("base_model", "")))
    if problems:
        raise ValidationError(problems)
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        locked.spec = {**locked.spec, "ab": stored}
        locked.save(update_fields=["spec"])
    return locked


# --- simulate -----------------------------------------------------------------------------------------------------


def simulate_launch(
    *,
    user: User,
    serve_run: Run,
    dataset_version: DatasetVersion,
    sessions: int = 8,
    concurrency: int = 2,
    noise: float = 0.0,
    tolerates_questions: float = 0.0,
    options: Mapping[str, Any] | None = None,
    name: str = "",
    tags: Sequence[str] = (),
) -> Run:
    """Simulated users (kind `simulate`) playing `sessions` coding sessions on the tasks of `dataset_version` (a
    repo_tasks dataset) against `serve_run`'s endpoint, posting feedback with their own run token. `options` are
    further SimulateSpec settings (max_turns, max_tokens, temperature, seed, users, ...)."""
    problems: Problems = {}
    options = dict(options or {})
    derived = {"base_url", "model_name", "feedback_url", "tasks_uri"}
    if reserved := sorted(set(options) & (derived | {"sessions", "concurrency", "noise", "tolerates_questions"})):
        problems["options"] = [f"{', '.join(reserved)}: set by the launch itself, or as its own fields"]
    if serve_run.kind != SERVE:
        problems["serve_run"] = [f"run {serve_run.pk} is a {serve_run.kind} run; name a serving run (kind serve)"]
    elif serve_run.is_terminal:
        problems["serve_run"] = [f"serving run {serve_run.pk} has ended ({serve_run.status}); start a new one"]
    if dataset_version.dataset.kind != DatasetKind.REPO_TASKS:
        problems["dataset_version"] = [
            f"{dataset_version} is a {dataset_version.dataset.kind} dataset; simulated users play repo_tasks"
        ]
    job_fields: dict[str, Any] = {
        "model_name": str(serve_run.spec.get("model_name") or "unknown"),
        "sessions": sessions,
        "concurrency": concurrency,
        "noise": noise,
        "tolerates_questions": tolerates_questions,
    }
    feedback_url = f"{settings.CRUCIBLE_PUBLIC_URL.rstrip('/')}/api/v1/"
    derived_values = {"base_url": "http://check/v1", "feedback_url": feedback_url, "tasks_uri": "file:///check"}
    problems.update(_spec_problems(SimulateSpec, {**job_fields, **derived_values}, options=options))
    if problems:
        raise ValidationError(problems)
    job = {
        **job_fields,
        **options,
        "base_url": serve_endpoint_url(serve_run),
        "feedback_url": feedback_url,
        "tasks_uri": file_uri(dataset_version.file),
    }
    return run_create(
        kind=SIMULATE,
        name=name or f"simulate {sessions} session(s) of {dataset_version} against serving run {serve_run.pk}",
        job=job,
        spec={"serve_run": serve_run.pk, "dataset_version": dataset_version.pk},
        dataset_version=dataset_version,
        created_by=user,
        tags=tags,
        progress_total=sessions,
    )


# --- sessiontrain -------------------------------------------------------------------------------------------------


def has_session_feedback_term(spec: Any) -> bool:
    """Whether a reward spec (JSON) holds a session_feedback term: what a session reward needs."""
    terms = spec.get("terms") if isinstance(spec, Mapping) else None
    return any(isinstance(term, Mapping) and term.get("type") == "session_feedback" for term in terms or [])


def session_train_launch(
    *,
    user: User,
    dataset_version: DatasetVersion,
    reward_version: RewardConfigVersion,
    base_model: str,
    checkpoint: Checkpoint | None = None,
    config: Mapping[str, Any] | None = None,
    baseline: str = "batch_mean",
    max_samples: int = 4096,
    name: str = "",
    tags: Sequence[str] = (),
    spec: Mapping[str, Any] | None = None,
) -> Run:
    """One real-time RL update (kind `sessiontrain`): a single epoch over the sessions of `dataset_version` (a
    `sessions` dataset, session/v1 rows) scored by `reward_version` (holding a session_feedback term), from
    `checkpoint` (the deployed one; None: `base_model` itself), with the recorded log-probabilities as the
    behaviour policy and `baseline` for ungrouped samples (batch_mean | task_type_mean | none). `config` is a
    workers.rl.config.TrainConfig (its base_model is `base_model`). The run's spec keeps `config` (with the base
    model, so evals and gates of its checkpoints load the right model) and `spec` (e.g. {"cycle": id})."""
    problems: Problems = {}
    if dataset_version.dataset.kind != DatasetKind.SESSIONS:
        problems["dataset_version"] = [
            f"{dataset_version} is a {dataset_version.dataset.kind} dataset; session training reads a sessions dataset"
        ]
    if not has_session_feedback_term(reward_version.spec):
        problems["reward_version"] = [f"{reward_version} has no session_feedback term; sessions need one"]
    raw = dict(config or {})
    if raw.get("base_model", base_model) != base_model:
        problems["config.base_model"] = [f"sessions train {base_model!r} (the base_model); leave this out"]
    if found := model_name_problems(base_model):
        problems["base_model"] = found
    if checkpoint is not None:
        _servable_checkpoint(problems, "checkpoint", checkpoint, base_model)
    parsed: TrainConfig | None = None
    try:
        parsed = TrainConfig.model_validate({**raw, "base_model": base_model})
    except PydanticError as exc:
        problems.update(pydantic_problems(exc, "config"))
    fields = {"baseline": baseline, "max_samples": max_samples}
    placeholders = {"sessions_uri": "x", "reward": {}, "output_prefix": "x", "base_model": "x", "config": {}}
    problems.update(_spec_problems(SessionTrainSpec, {**placeholders, **fields}))
    if problems or parsed is None:
        raise ValidationError(problems)
    stored_config = parsed.model_dump(mode="json")

    def job(run: Run) -> dict[str, Any]:
        return {
            "sessions_uri": file_uri(dataset_version.file),
            "reward": reward_version.spec,
            "output_prefix": storage_uri(f"runs/{run.pk}"),
            "base_model": base_model,
            "checkpoint_uri": checkpoint.uri if checkpoint else None,
            # The version the sessions' on-policy share is measured against: the checkpoint trained from.
            "policy_version": checkpoint.pk if checkpoint else 0,
            "config": stored_config,
            **fields,
        }

    start = f"checkpoint {checkpoint}" if checkpoint else base_model
    return run_create(
        kind=SESSIONTRAIN,
        name=name or f"session training of {start} on {dataset_version}",
        job=job,
        spec={
            **dict(spec or {}),
            "config": stored_config,
            "checkpoint": checkpoint.pk if checkpoint else None,
            "baseline": baseline,
        },
        dataset_version=dataset_version,
        reward_version=reward_version,
        created_by=user,
        tags=tags,
    )


# --- client keys ----------------------------------------------------------------------------------------------------


class RunTokenError(Exception):
    """A `cri_` run token that opens nothing here (the message says why)."""


def simulate_run_for_token(token: str) -> Run:
    """The active simulate run whose own ingest token `token` is (`cri_<run id>_<hex>`); RunTokenError otherwise."""
    parts = token.split("_")
    if len(parts) != 3 or parts[0] != "cri" or not parts[1].isdigit() or len(parts[1]) > 18:
        raise RunTokenError("not a run token (cri_<run id>_<hex>)")
    run = (
        Run.objects.filter(pk=int(parts[1])).only("pk", "kind", "status", "spec", "ingest_nonce", "created_by").first()
    )
    if run is None or not ingest_token_valid(run, token):
        raise RunTokenError("unknown or invalid run token")
    if run.kind != SIMULATE:
        raise RunTokenError(f"run {run.pk} is a {run.kind} run; only a simulate run's token calls as a client")
    if run.is_terminal:
        raise RunTokenError(f"simulate run {run.pk} has ended ({run.status}); its token no longer calls")
    return run


def serve_key_verify(*, run: Run, key: str) -> dict[str, Any]:
    """Whether `key` (the bearer a client sent to serving run `run`) may call it: an API token (crk_) of an active
    user whose scopes and role hold `serve`, or the run token (cri_) of an active simulate run that targets `run`.
    {"valid": true, "token_id", "user"} or {"valid": false, "status": 401 | 403, "reason"}."""
    if key.startswith("crk_"):
        token = ApiToken.objects.select_related("user").filter(key_hash=hash_secret(key)).first()
        now = timezone.now()
        if token is None or token.revoked_at is not None or not token.user.is_active:
            return {"valid": False, "status": 401, "reason": "invalid or revoked API key"}
        if token.expires_at is not None and token.expires_at <= now:
            return {"valid": False, "status": 401, "reason": "API key expired; create a new one under /api/v1/tokens/"}
        if Capability.SERVE not in token.scopes or not token.user.can(Capability.SERVE):
            return {
                "valid": False,
                "status": 403,
                "reason": "this API key lacks the serve scope; create a token with scopes including 'serve'",
            }
        if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return {"valid": True, "token_id": token.pk, "user": token.user.username}
    if key.startswith("cri_"):
        try:
            simulate = simulate_run_for_token(key)
        except RunTokenError as exc:
            return {"valid": False, "status": 401, "reason": str(exc)}
        if simulate.spec.get("serve_run") != run.pk:
            return {
                "valid": False,
                "status": 403,
                "reason": f"simulate run {simulate.pk} plays against serving run {simulate.spec.get('serve_run')}",
            }
        return {"valid": True, "token_id": None, "user": simulate.created_by.username}
    return {"valid": False, "status": 401, "reason": "send an API key (crk_...) with the serve scope"}
