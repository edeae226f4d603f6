"""How `POST /api/v1/runs/` launches training, SFT and re-scoring runs (registered as the kinds' launch input)."""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.models import Capability, User
from apps.accounts.permissions import request_user
from apps.benchmarks.models import BenchmarkVersion
from apps.common.routers import AppRouter
from apps.datasets.models import DatasetVersion
from apps.rewards.models import RewardConfigVersion
from apps.runs.api import RunSerializer
from apps.runs.models import Checkpoint, Run, RunKind
from apps.training import services
from apps.training.external import ExternalRunViewSet
from apps.training.lineage import lineage_launch
from apps.training.rft import MAX_PER_TASK, rft_dataset_create


class TrainingLaunchSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=[RunKind.TRAIN, RunKind.SFT, RunKind.RESCORE])
    dataset_version = serializers.PrimaryKeyRelatedField(queryset=DatasetVersion.objects.select_related("dataset"))
    reward_version = serializers.PrimaryKeyRelatedField(
        queryset=RewardConfigVersion.objects.all(),
        required=False,
        allow_null=True,
        default=None,
        help_text="Required for sft and rescore. kind=train: left out or null, the environment's recipe reward "
        "(search: Context-1's X2-X5, swarm: Kimi K2.5's PARL), kept as reward config recipe-<environment>; an "
        "environment without one needs a reward version",
    )
    name = serializers.CharField(required=False, allow_blank=True, default="", max_length=200)
    tags = serializers.ListField(child=serializers.CharField(max_length=50), required=False, default=list)
    config = serializers.JSONField(
        required=False,
        default=dict,
        help_text="kind=train: workers.rl.config.TrainConfig; kind=sft: workers.rl.config_sections.SFTConfig; omitted "
        "fields take defaults",
    )
    corpus_version = serializers.PrimaryKeyRelatedField(
        queryset=DatasetVersion.objects.select_related("dataset"),
        required=False,
        allow_null=True,
        default=None,
        help_text="kind=train or sft with environment 'search': the corpus version whose index the agent searches",
    )
    auto_eval = serializers.PrimaryKeyRelatedField(
        many=True,
        queryset=BenchmarkVersion.objects.all(),
        required=False,
        default=list,
        help_text="kind=train: benchmark versions every new checkpoint is evaluated on (results on the run page)",
    )
    allow_contamination = serializers.BooleanField(
        default=False,
        help_text="Launch even if the tasks overlap a benchmark that gates deployments; the run is flagged instead",
    )
    allow_excluded = serializers.BooleanField(
        default=False,
        help_text="kind=train or sft: launch although reviewers excluded some of the tasks; those tasks are left out",
    )
    init_checkpoint = serializers.PrimaryKeyRelatedField(
        queryset=Checkpoint.objects.select_related("run"),
        required=False,
        allow_null=True,
        default=None,
        help_text="kind=train or sft: a training run's checkpoint (id) whose policy this run starts from (LoRA "
        "merged; fresh optimizer and step counter); base_model follows the checkpoint. SFT → RL → RL chains",
    )


def launch_from_api(user: User, data: dict[str, Any]) -> Run:
    common = {
        "created_by": user,
        "dataset_version": data["dataset_version"],
        "reward_version": data["reward_version"],
        "name": data["name"],
        "tags": data["tags"],
    }
    start = data["init_checkpoint"]
    if data["reward_version"] is None and data["kind"] != RunKind.TRAIN:
        raise ValidationError({"reward_version": [f"{data['kind']} runs need a reward config version: name its id"]})
    if data["kind"] == RunKind.RESCORE:
        if start is not None:
            raise ValidationError({"init_checkpoint": ["only training and SFT runs start from a checkpoint"]})
        return services.run_launch_rescore(**common)
    config = data["config"]
    if not isinstance(config, dict):
        raise ValidationError({"config": [f"must be a JSON object of {data['kind']} settings"]})
    if data["kind"] == RunKind.TRAIN and config.get("checkpoint_uri"):
        raise ValidationError(
            {"config.checkpoint_uri": ["set by init_checkpoint: name the checkpoint's id there instead of its URI"]}
        )
    guards = {"allow_contamination": data["allow_contamination"], "allow_excluded": data["allow_excluded"]}
    common["corpus_version"] = data["corpus_version"]
    if data["kind"] == RunKind.SFT:
        config = services.from_checkpoint(config, start) if start is not None else config
        return services.run_launch_sft(**common, config=config, **guards)
    return services.run_launch_train(
        **common, config=config, auto_eval=data["auto_eval"], init_checkpoint=start, **guards
    )


class RFTSerializer(serializers.Serializer):
    dataset = serializers.CharField(max_length=100, help_text="The trajectories dataset to add a version to (created)")
    min_reward = serializers.FloatField(default=1.0, help_text="Keep trajectories with at least this reward")
    per_task = serializers.IntegerField(
        default=1, min_value=1, max_value=MAX_PER_TASK, help_text="Trajectories kept per task, best first"
    )


class RFTResultSerializer(serializers.Serializer):
    dataset = serializers.CharField()
    dataset_version = serializers.IntegerField()
    report = serializers.JSONField()


class RunResumeViewSet(viewsets.GenericViewSet):
    """`POST /api/v1/runs/<id>/resume/` and `.../rft/`: training owns resuming and RFT exports, so the routes live
    here beside the runs API."""

    queryset = Run.objects.all()
    serializer_class = RunSerializer
    capability_map = {"resume": Capability.LAUNCH, "rft": Capability.LAUNCH}

    @extend_schema(request=RFTSerializer, responses={201: RFTResultSerializer})
    @action(detail=True, methods=["post"])
    def rft(self, request: Request, pk: str | None = None) -> Response:
        """The run's successful trajectories (reward >= min_reward, best per_task of each task, stored records only)
        as a new version of a trajectories dataset: RFT data for a later SFT run (Kimi K2.5)."""
        body = RFTSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        version = rft_dataset_create(
            run=get_object_or_404(Run, pk=pk), user=request_user(request), **body.validated_data
        )
        out = {"dataset": version.dataset.name, "dataset_version": version.pk, "report": version.validation_report}
        return Response(out, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={201: RunSerializer})
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str | None = None) -> Response:
        """Continue a stopped or failed training run from its latest checkpoint, as a new run linked to it."""
        run = services.run_resume(run=get_object_or_404(Run, pk=pk), user=request_user(request))
        return Response(RunSerializer(run).data, status=status.HTTP_201_CREATED)


class LineageSerializer(serializers.Serializer):
    dataset_version = serializers.PrimaryKeyRelatedField(queryset=DatasetVersion.objects.select_related("dataset"))
    reward_version = serializers.PrimaryKeyRelatedField(queryset=RewardConfigVersion.objects.all())
    corpus_version = serializers.PrimaryKeyRelatedField(
        queryset=DatasetVersion.objects.select_related("dataset"), required=False, allow_null=True, default=None
    )
    name = serializers.CharField(required=False, allow_blank=True, default="", max_length=150)
    sft = serializers.JSONField(default=dict, help_text="Stage 1: workers.rl.config_sections.SFTConfig (a teacher)")
    rl = serializers.JSONField(default=dict, help_text="Stage 2: TrainConfig without base_model")
    rft = serializers.JSONField(default=dict, help_text="Stage 3: min_reward, per_task, epochs, learning_rate")
    rl2 = serializers.JSONField(default=dict, help_text="Stage 4: TrainConfig without base_model")


class LineageViewSet(viewsets.GenericViewSet):
    """`POST /api/v1/lineages/`: SFT → RL → RFT → RL as one lineage (apps.training.lineage); returns stage 1's run."""

    queryset = Run.objects.all()
    serializer_class = LineageSerializer
    capability_map = {"create": Capability.LAUNCH}

    @extend_schema(request=LineageSerializer, responses={201: RunSerializer})
    def create(self, request: Request) -> Response:
        body = LineageSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        run = lineage_launch(created_by=request_user(request), **body.validated_data)
        return Response(RunSerializer(run).data, status=status.HTTP_201_CREATED)


router = AppRouter()  # controlplane.urls gathers every app's router into the one API root
router.register("runs", RunResumeViewSet, basename="run-resume")
router.register("lineages", LineageViewSet, basename="lineage")
router.register("external-runs", ExternalRunViewSet, basename="external-run")
