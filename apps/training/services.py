"""Writes for training, SFT warm-up and offline re-scoring runs: launch (with an environment's recipe reward when a
launch names none) and resume. What follows their checkpoints (auto-eval) and the evals of those checkpoints (the
eval curve and the run-level detectors), and the job input each kind's worker receives, are in
`apps.training.lifecycle`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import transaction
from pydantic import ValidationError as PydanticError
from rest_framework.exceptions import ValidationError

from apps.accounts.models import User
from apps.benchmarks.models import BenchmarkVersion
from apps.common.errors import pydantic_problems
from apps.datasets.models import DatasetKind, DatasetVersion
from apps.rewards.models import RewardConfig, RewardConfigVersion
from apps.rewards.services import reward_spec_validate, reward_version_create
from apps.runs.models import Checkpoint, Run, RunKind
from apps.runs.services import run_create
from apps.training.checkpoints import latest_in_lineage
from apps.training.guards import (
    episode_problems,
    train_config_check,
    training_data_guards,
    with_corpus_index,
)
from apps.training.lifecycle import rescore_job, sft_job, train_job
from workers.envs.registry import ENVIRONMENTS, get_environment
from workers.models.registry import model_name_problems
from workers.rewards.schema import spec_hash
from workers.rl.config import TrainConfig
from workers.rl.config_sections import SFTConfig

SCRIPTED_TEACHERS = {
    "scripted-search": "search",
    "scripted-coding": "coding_agent",
    "scripted-coding-search": "coding_agent",
    "scripted-swarm": "swarm",
}
RECORDS_TEACHER = "records"
"""`teacher_model` of an SFT run on a trajectories dataset (RFT): the stored records are the examples."""
"""Agents written as code that the SFT warm-up takes as its teacher, with the environment each one plays."""
"""Teachers that are programs, not models (workers.search.teacher): no model check for them."""


# --- an environment's recipe reward ------------------------------------------------------------------------
RECIPE_REWARD_PREFIX = "recipe-"
"""Reward config `recipe-<environment>` keeps the recipe reward (`Environment.default_reward`) runs defaulted to."""


def recipe_reward_version(*, environment: str, user: User) -> RewardConfigVersion | None:
    """The reward config version holding `environment`'s recipe reward (`Environment.default_reward`): a version of
    reward config `recipe-<environment>`, made (owned by `user`) the first time a launch needs it and again only
    when the recipe changes; None for an unknown environment or one without a recipe reward."""
    try:
        spec = get_environment(environment).default_reward()
    except ValueError:
        return None
    if spec is None:
        return None
    digest = spec_hash(reward_spec_validate(spec))
    with transaction.atomic():
        config, _ = RewardConfig.objects.get_or_create(
            name=f"{RECIPE_REWARD_PREFIX}{environment}",
            defaults={
                "owner": user,
                "description": f"The recipe reward of environment {environment} (Environment.default_reward): "
                "what a training launch on it that names no reward config trains with.",
            },
        )
        RewardConfig.objects.select_for_update().get(pk=config.pk)
        version = config.versions.filter(content_hash=digest).order_by("-number").first()
        if version is None:
            version = reward_version_create(
                config=config, spec=spec, created_by=user, notes=f"{environment}'s default_reward()"
            )
    return version


def _reward_or_recipe(
    reward_version: RewardConfigVersion | None, config: Any, user: User
) -> tuple[RewardConfigVersion, str | None]:
    """The launch's reward config version, or, when it names none, its environment's recipe reward and the
    environment's name (recorded as `reward_default_of`). A 400 naming reward_version when there is none."""
    if reward_version is not None:
        return reward_version, None
    environment = config.get("environment") if isinstance(config, dict) else None
    environment = environment or TrainConfig.model_fields["environment"].default
    recipe = recipe_reward_version(environment=environment, user=user) if isinstance(environment, str) else None
    if recipe is None:
        with_recipe = ", ".join(name for name, cls in ENVIRONMENTS.items() if cls.default_reward() is not None)
        raise ValidationError(
            {
                "reward_version": [
                    f"environment {environment!r} has no recipe reward: name a reward config version (only "
                    f"{with_recipe or 'no environment'} bring{'s' if ',' not in with_recipe else ''} their own)"
                ]
            }
        )
    return recipe, environment


# --- launches ----------------------------------------------------------------------------------------------
def run_launch_rescore(
    *,
    created_by: User,
    dataset_version: DatasetVersion,
    reward_version: RewardConfigVersion,
    name: str = "",
    tags: Sequence[str] = (),
) -> Run:
    # Sessions (session/v1 rows a real-time RL cycle froze) re-score like trajectories: workers.jobs.rescore reads both.
    if dataset_version.dataset.kind not in (DatasetKind.TRAJECTORIES, DatasetKind.SESSIONS):
        raise ValidationError(
            {
                "dataset_version": [
                    f"{dataset_version} is a {dataset_version.dataset.kind} dataset; "
                    "re-scoring needs a dataset of kind 'trajectories' or 'sessions'"
                ]
            }
        )
    return run_create(
        kind=RunKind.RESCORE,
        name=name or f"rescore {dataset_version} with {reward_version}",
        job=rescore_job,
        spec={"dataset_version": dataset_version.pk, "reward_version": reward_version.pk},
        dataset_version=dataset_version,
        reward_version=reward_version,
        tags=tags,
        created_by=created_by,
        progress_total=dataset_version.row_count,
    )


def _with_contamination_tag(tags: Sequence[str], carried: dict[str, Any]) -> list[str]:
    if carried.get("contamination") and "contaminated" not in tags:
        return [*tags, "contaminated"]
    return list(tags)


def from_checkpoint(config: Any, checkpoint: Checkpoint) -> dict[str, Any]:
    """`config` set to start from `checkpoint` (a training run's): its `checkpoint_uri`, and its base model, the one
    the checkpoint was trained from (a different `base_model` in `config` is refused, naming both)."""
    if not isinstance(config, dict):
        raise ValidationError({"config": ["must be a JSON object of the run's settings"]})
    if checkpoint.run.kind != RunKind.TRAIN:
        raise ValidationError(
            {
                "init_checkpoint": [
                    f"checkpoint {checkpoint.pk} belongs to a {checkpoint.run.kind} run, not a training run"
                ]
            }
        )
    trained_from = str((checkpoint.run.spec.get("config") or {}).get("base_model", ""))
    if config.get("base_model") not in (None, "", trained_from):
        raise ValidationError(
            {
                "config.base_model": [
                    f"checkpoint {checkpoint.pk} was trained from {trained_from!r}, not {config['base_model']!r}: "
                    "leave base_model out (it follows the checkpoint) or set it to that model"
                ]
            }
        )
    return {**config, "base_model": trained_from, "checkpoint_uri": checkpoint.uri}


def run_launch_train(
    *,
    created_by: User,
    dataset_version: DatasetVersion,
    reward_version: RewardConfigVersion | None,
    config: dict[str, Any],
    name: str = "",
    tags: Sequence[str] = (),
    parent: Run | None = None,
    resume_from: Checkpoint | None = None,
    init_checkpoint: Checkpoint | None = None,
    corpus_version: DatasetVersion | None = None,
    allow_contamination: bool = False,
    auto_eval: Sequence[BenchmarkVersion] = (),
    allow_excluded: bool = False,
    reward_default_of: str | None = None,
) -> Run:
    """A training run. `init_checkpoint`: start from that checkpoint's policy (another training run's) with a fresh
    optimizer and step counter; the run is linked to the checkpoint's run as its child. No `reward_version`: the
    environment's recipe reward (`recipe_reward_version`), recorded as `reward_default_of` in the run's spec
    (`reward_default_of` itself: a resume carrying its parent's)."""
    if init_checkpoint is not None:
        config = from_checkpoint(config, init_checkpoint)
        parent = parent or init_checkpoint.run
    if reward_version is None:
        reward_version, reward_default_of = _reward_or_recipe(reward_version, config, created_by)
    parsed = train_config_check(
        config=config, dataset_version=dataset_version, reward_version=reward_version, corpus_version=corpus_version
    )
    carried = training_data_guards(
        dataset_version=dataset_version, allow_contamination=allow_contamination, allow_excluded=allow_excluded
    )
    spec: dict[str, Any] = {
        "config": parsed.model_dump(mode="json"),
        "dataset_version": dataset_version.pk,
        "reward_version": reward_version.pk,
        **carried,
    }
    if reward_default_of is not None:
        spec["reward_default_of"] = reward_default_of
    if auto_eval:
        spec["auto_eval"] = [version.pk for version in auto_eval]
    if corpus_version is not None and get_environment(parsed.environment).needs_corpus_index:
        spec["corpus_version"] = corpus_version.pk
    if resume_from is not None:
        spec["resume_from"] = {"checkpoint": resume_from.pk, "uri": resume_from.uri, "step": resume_from.step}
    if init_checkpoint is not None:
        spec["init_checkpoint"] = {
            "checkpoint": init_checkpoint.pk,
            "run": init_checkpoint.run_id,
            "step": init_checkpoint.step,
            "uri": init_checkpoint.uri,
        }
    return run_create(
        kind=RunKind.TRAIN,
        name=name or f"{parsed.algorithm} {parsed.base_model} on {dataset_version.dataset.name}",
        job=train_job,
        spec=spec,
        dataset_version=dataset_version,
        reward_version=reward_version,
        parent=parent,
        tags=_with_contamination_tag(tags, carried),
        created_by=created_by,
        progress_done=resume_from.step if resume_from is not None else 0,
        progress_total=parsed.steps,
    )


def run_launch_sft(
    *,
    created_by: User,
    dataset_version: DatasetVersion,
    reward_version: RewardConfigVersion,
    config: dict[str, Any],
    name: str = "",
    tags: Sequence[str] = (),
    corpus_version: DatasetVersion | None = None,
    allow_contamination: bool = False,
    allow_excluded: bool = False,
) -> Run:
    """An SFT warm-up run: rejection-sample the teacher's trajectories on the tasks, fine-tune the base model on
    the kept ones. Checked like a training run: the config, the models, the environment, every task row, the
    reward's inputs, the training-data guards and, for search, the corpus index and the tasks' chunk ids."""
    config = {"environment": SFTConfig.model_fields["environment"].default, **config}
    if dataset_version.dataset.kind != DatasetKind.TRAJECTORIES:  # on records no environment runs: no index
        config = with_corpus_index(config, corpus_version)
    try:
        parsed = SFTConfig.model_validate(config)
    except PydanticError as exc:
        raise ValidationError(pydantic_problems(exc, "config"))
    problems: dict[str, list[str]] = {}
    on_records = dataset_version.dataset.kind == DatasetKind.TRAJECTORIES
    if on_records != (parsed.teacher_model == RECORDS_TEACHER):
        problems["config.teacher_model"] = [
            f"an SFT run on a trajectories dataset trains on its records: set teacher_model to {RECORDS_TEACHER!r}"
            if on_records
            else f"teacher_model {RECORDS_TEACHER!r} trains on stored trajectories: pick a trajectories dataset "
            "version (an RFT export), or a teacher"
        ]
    allowed = (*SCRIPTED_TEACHERS, RECORDS_TEACHER)
    for field, model in (("teacher_model", parsed.teacher_model), ("base_model", parsed.base_model)):
        # (not `name`: that is the run's name, given by the caller)
        if found := model_name_problems(model, allow=allowed if field == "teacher_model" else ()):
            problems[f"config.{field}"] = found
    plays = SCRIPTED_TEACHERS.get(parsed.teacher_model)
    if plays is not None and plays != parsed.environment:
        problems["config.teacher_model"] = [
            f"{parsed.teacher_model!r} is an agent for environment {plays!r}, not {parsed.environment!r}; pick the "
            "scripted agent of this environment or a model"
        ]
    if not on_records:
        episode_problems(
            problems,
            environment=parsed.environment,
            env_params=parsed.env_params,
            dataset_version=dataset_version,
            reward_version=reward_version,
            corpus_version=corpus_version,
        )
    if problems:
        raise ValidationError(problems)
    spec: dict[str, Any] = {"config": parsed.model_dump(mode="json")}
    parent: Run | None = None
    if on_records:
        # RFT: the records were filtered at export; the run continues the lineage of the run that wrote them.
        source = (dataset_version.validation_report or {}).get("rft", {}).get("run")
        parent = Run.objects.filter(pk=source).first() if isinstance(source, int) else None
        default_name, run_tags = f"RFT of {parsed.base_model} on {dataset_version}", list(tags)
    else:
        carried = training_data_guards(
            dataset_version=dataset_version, allow_contamination=allow_contamination, allow_excluded=allow_excluded
        )
        spec.update(carried)
        if corpus_version is not None:
            spec["corpus_version"] = corpus_version.pk
        default_name = f"SFT warm-up of {parsed.base_model} on {dataset_version.dataset.name}"
        run_tags = _with_contamination_tag(tags, carried)
    return run_create(
        kind=RunKind.SFT,
        name=name or default_name,
        job=sft_job,
        spec=spec,
        dataset_version=dataset_version,
        reward_version=reward_version,
        parent=parent,
        tags=run_tags,
        created_by=created_by,
    )


def run_resume(*, run: Run, user: User) -> Run:
    """A new run that continues `run` from the latest checkpoint in its lineage (step counter, optimizer, RNG,
    data order): its own, or, when it died before writing one, the one its parent resumed from or wrote later;
    checkpoints that are whole in storage count even when their report was lost (apps.training.checkpoints)."""
    if run.kind != RunKind.TRAIN:
        raise ValidationError({"run": [f"run {run.pk} is a {run.kind} run; only training runs resume"]})
    if not run.is_terminal:
        raise ValidationError({"run": [f"run {run.pk} is {run.status}; stop it first, then resume"]})
    checkpoint = latest_in_lineage(run)
    if checkpoint is None:
        raise ValidationError(
            {"run": [f"neither run {run.pk} nor a run it was resumed from wrote a checkpoint; launch it again instead"]}
        )
    steps = int(run.spec["config"]["steps"])
    if checkpoint.step >= steps:
        raise ValidationError(
            {
                "run": [
                    f"run {run.pk} finished all {steps} steps; to train further, launch a new run from its checkpoint "
                    f"(init_checkpoint {checkpoint.pk})"
                ]
            }
        )
    assert run.dataset_version is not None and run.reward_version is not None
    corpus_id = run.spec.get("corpus_version")
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
        reward_default_of=run.spec.get("reward_default_of"),
        auto_eval=list(BenchmarkVersion.objects.filter(pk__in=run.spec.get("auto_eval") or [])),
        corpus_version=DatasetVersion.objects.filter(pk=corpus_id).first() if corpus_id else None,
    )
