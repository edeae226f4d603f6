"""Kimi K2.5's training chain as one lineage (docs/methods.md section 1: SFT, RL, then RFT "a self-improving data
pipeline" for later RL): SFT → RL → RFT → RL launched by one request, each stage a run of its own, started when the
stage before it succeeds, and linked to it as its parent.

1. `sft`: the SFT warm-up on the tasks with a teacher (a model or a scripted agent);
2. `rl`: training from the model stage 1 fine-tuned;
3. `rft`: the successful trajectories of stage 2 exported as a trajectories dataset (`apps.training.rft`), then an
   SFT run on those records starting from stage 2's latest checkpoint (rejection-sampling fine-tuning);
4. `rl2`: training again, from the model stage 3 fine-tuned.

Every stage's settings are checked when the lineage is launched, so a mistake in stage 4 is a 400 now, not an
error an hour later. A stage that cannot start (stage 2 kept no trajectory good enough to export) stops the lineage
and says why in the last run's summary (`lineage.stopped`); a stage that fails stops it the way any failed run does.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import transaction
from pydantic import ValidationError as PydanticError
from rest_framework.exceptions import ValidationError

from apps.accounts.models import User
from apps.common.errors import pydantic_problems
from apps.datasets.models import DatasetVersion
from apps.rewards.models import RewardConfigVersion
from apps.runs.models import Checkpoint, Run, RunStatus
from apps.training import services
from apps.training.guards import train_config_check
from apps.training.rft import rft_dataset_create
from workers.rl.config import TrainConfig
from workers.rl.config_sections import SFTConfig

STAGES = ("sft", "rl", "rft", "rl2")
STAGE_MODEL = "(the model of the stage before)"
"""Placeholder base model of a later stage, replaced when the stage starts."""


def _check_stages(sft: Any, rl: Any, rft: Any, rl2: Any) -> dict[str, list[str]]:
    problems: dict[str, list[str]] = {}
    for name, value in (("sft", sft), ("rl", rl), ("rft", rft), ("rl2", rl2)):
        if not isinstance(value, dict):
            problems[name] = [f"must be a JSON object of the {name} stage's settings (empty for the defaults)"]
    if problems:
        return problems
    try:
        SFTConfig.model_validate(sft)
    except PydanticError as exc:
        problems.update(pydantic_problems(exc, "sft"))
    for name, config in (("rl", rl), ("rl2", rl2)):
        if "base_model" in config:
            problems[f"{name}.base_model"] = ["set by the lineage: the model the stage before fine-tuned"]
            continue
        try:
            TrainConfig.model_validate({**config, "environment": sft.get("environment", "search")})
        except PydanticError as exc:
            problems.update(pydantic_problems(exc, name))
    unknown = sorted(set(rft) - {"min_reward", "per_task", "epochs", "learning_rate"})
    if unknown:
        problems["rft"] = [f"unknown setting(s) {', '.join(unknown)}; use min_reward, per_task, epochs, learning_rate"]
    return problems


@transaction.atomic
def lineage_launch(
    *,
    created_by: User,
    dataset_version: DatasetVersion,
    reward_version: RewardConfigVersion,
    sft: Any,
    rl: Any,
    rft: Any,
    rl2: Any,
    corpus_version: DatasetVersion | None = None,
    name: str = "",
) -> Run:
    """Launch stage 1 (the SFT warm-up) of a new lineage; the later stages start from `lineage_advance`."""
    problems = _check_stages(sft, rl, rft, rl2)
    if not problems:
        # The RL stages against the data now, with stage 1's base model standing in for the model each will start
        # from (a fine-tuned copy has its shape): too few tasks, a reward the environment cannot feed, ... are 400s.
        stand_in = SFTConfig.model_validate(sft).base_model
        environment = sft.get("environment", SFTConfig.model_fields["environment"].default)
        for stage, config in (("rl", rl), ("rl2", rl2)):
            try:
                train_config_check(
                    config={**config, "environment": environment, "base_model": stand_in},
                    dataset_version=dataset_version,
                    reward_version=reward_version,
                    corpus_version=corpus_version,
                )
            except ValidationError as exc:
                detail = exc.detail if isinstance(exc.detail, dict) else {"config": exc.detail}
                for key, value in detail.items():
                    messages = value if isinstance(value, list) else [value]
                    problems[f"{stage}.{key.removeprefix('config.')}"] = [str(m) for m in messages]
    if problems:
        raise ValidationError(problems)
    lineage = {
        "id": uuid.uuid4().hex[:12],
        "name": name or f"lineage on {dataset_version.dataset.name}",
        "stage": "sft",
        "stages": {"sft": sft, "rl": rl, "rft": rft, "rl2": rl2},
        "dataset_version": dataset_version.pk,
        "reward_version": reward_version.pk,
        "corpus_version": corpus_version.pk if corpus_version is not None else None,
    }
    run = services.run_launch_sft(
        created_by=created_by,
        dataset_version=dataset_version,
        reward_version=reward_version,
        config=sft,
        name=f"{lineage['name']}: 1/4 SFT",
        corpus_version=corpus_version,
    )
    run.spec = {**run.spec, "lineage": lineage}
    run.save(update_fields=["spec"])
    return run


def _stop(run: Run, why: str) -> None:
    lineage = dict(run.spec.get("lineage") or {})
    run.summary = {**(run.summary or {}), "lineage": {"id": lineage.get("id"), "stopped": why}}
    run.save(update_fields=["summary"])


def _model_dir(run: Run) -> str | None:
    uri = str((run.summary or {}).get("model_uri") or "")
    return uri.removeprefix("file://") if uri.startswith("file://") else None


def lineage_advance(*, run_id: int) -> None:
    """Start the stage after `run_id`'s, when that run belongs to a lineage and succeeded. Idempotent: a run that
    already has a child in the lineage is left alone."""
    with transaction.atomic():
        run = Run.objects.select_for_update().select_related("created_by").get(pk=run_id)
        lineage = run.spec.get("lineage")
        if not isinstance(lineage, dict) or run.status != RunStatus.SUCCEEDED:
            return
        if Run.objects.filter(parent=run, spec__lineage__id=lineage.get("id")).exists():
            return
        stage = lineage.get("stage")
        if stage == "rl2":
            run.summary = {**(run.summary or {}), "lineage": {"id": lineage["id"], "complete": True}}
            run.save(update_fields=["summary"])
            return
        dataset = DatasetVersion.objects.get(pk=lineage["dataset_version"])
        reward = RewardConfigVersion.objects.get(pk=lineage["reward_version"])
        corpus_pk = lineage.get("corpus_version")
        corpus = DatasetVersion.objects.filter(pk=corpus_pk).first() if corpus_pk is not None else None
        stages = lineage["stages"]
        environment = stages["sft"].get("environment", "search")
        try:
            if stage in ("sft", "rft"):  # the next stage trains RL from the model this SFT run fine-tuned
                model = _model_dir(run)
                if model is None:
                    _stop(run, "the SFT run left no model directory to train from")
                    return
                following = "rl" if stage == "sft" else "rl2"
                child = services.run_launch_train(
                    created_by=run.created_by,
                    dataset_version=dataset,
                    reward_version=reward,
                    config={**stages[following], "environment": environment, "base_model": model},
                    name=f"{lineage['name']}: {'2' if following == 'rl' else '4'}/4 RL",
                    corpus_version=corpus,
                )
            else:  # stage "rl": RFT = export its successful trajectories, fine-tune from its latest checkpoint
                checkpoint = Checkpoint.objects.filter(run=run).order_by("-step").first()
                if checkpoint is None:
                    _stop(run, "the RL run saved no checkpoint to fine-tune from")
                    return
                settings = stages["rft"]
                version = rft_dataset_create(
                    run=run,
                    dataset=f"lineage-{lineage['id']}-rft",
                    user=run.created_by,
                    min_reward=settings.get("min_reward", 1.0),
                    per_task=settings.get("per_task", 1),
                )
                following = "rft"
                config = {
                    "teacher_model": services.RECORDS_TEACHER,
                    "base_model": run.spec["config"]["base_model"],
                    "checkpoint_uri": checkpoint.uri,
                    "environment": environment,
                    **{k: settings[k] for k in ("epochs", "learning_rate") if k in settings},
                }
                child = services.run_launch_sft(
                    created_by=run.created_by,
                    dataset_version=version,
                    reward_version=reward,
                    config=config,
                    name=f"{lineage['name']}: 3/4 RFT",
                )
        except ValidationError as exc:
            _stop(run, f"stage after {stage} refused: {exc.detail}")
            return
        child.parent = run
        child.spec = {**child.spec, "lineage": {**lineage, "stage": following}}
        child.save(update_fields=["parent", "spec"])
