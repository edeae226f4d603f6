"""The run kinds training owns (apps.runs.kinds), and its reaction to evals of its checkpoints."""

from __future__ import annotations

from apps.runs import kinds
from apps.runs.models import RunKind
from apps.training import services
from apps.training.api import TrainingLaunchSerializer, launch_from_api
from workers.jobs.specs import RescoreSpec, SFTSpec, TrainSpec


def register_kinds() -> None:
    launch = {"launch_input": TrainingLaunchSerializer, "launch": launch_from_api}
    kinds.register(
        kinds.RunKindHandler(
            kind=RunKind.TRAIN,
            app="training",
            job_spec=TrainSpec,
            on_checkpoints=services.auto_eval_checkpoints,
            job_from_row=services.train_job,
            **launch,  # type: ignore[arg-type]
        )
    )
    kinds.register(
        kinds.RunKindHandler(
            kind=RunKind.SFT,
            app="training",
            job_spec=SFTSpec,
            job_from_row=services.sft_job,
            **launch,  # type: ignore[arg-type]
        )
    )
    kinds.register(
        kinds.RunKindHandler(
            kind=RunKind.RESCORE,
            app="training",
            job_spec=RescoreSpec,
            job_from_row=services.rescore_job,
            **launch,  # type: ignore[arg-type]
        )
    )
    kinds.subscribe(RunKind.EVAL, "succeeded", "training.eval_curve", services.eval_curve_after_eval)
