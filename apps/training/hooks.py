"""Registered when the app registry is ready (apps.common autodiscovers every app's `hooks` module): the run kinds
training owns (apps.runs.kinds), and its reaction to evals of its checkpoints."""

from __future__ import annotations

from apps.runs import kinds
from apps.runs.models import RunKind
from apps.training import lifecycle
from apps.training.api import TrainingLaunchSerializer, launch_from_api
from apps.training.external import EXTERNAL
from apps.training.lineage import lineage_advance
from workers.specs import RescoreSpec, SFTSpec, TrainSpec

# All three launch through `POST /api/v1/runs/` with one input; training's checkpoints start its auto-evals.
for kind, spec, job, on_checkpoints in (
    (RunKind.TRAIN, TrainSpec, lifecycle.train_job, lifecycle.auto_eval_checkpoints),
    (RunKind.SFT, SFTSpec, lifecycle.sft_job, None),
    (RunKind.RESCORE, RescoreSpec, lifecycle.rescore_job, None),
):
    kinds.register(
        kinds.RunKindHandler(
            kind=kind,
            app="training",
            job_spec=spec,
            on_checkpoints=on_checkpoints,
            job_from_row=job,
            launch_input=TrainingLaunchSerializer,
            launch=launch_from_api,
        )
    )
# Trained elsewhere, reporting through the SDK (apps.training.external): no Ray job, ended by its reporter.
kinds.register(kinds.RunKindHandler(kind=EXTERNAL, app="training", job_spec=None))
kinds.subscribe(RunKind.EVAL, "succeeded", "training.eval_curve", lifecycle.eval_curve_after_eval)
for kind in (RunKind.SFT, RunKind.TRAIN):  # the next stage of an SFT → RL → RFT → RL lineage
    kinds.subscribe(kind, "succeeded", "training.lineage", lineage_advance)
