"""The launches of real-time RL's run kinds through `POST /api/v1/runs/ {"kind": ...}` (apps.runs.kinds): each
kind's body (a serializer, validated by the runs API) and the service it calls. Registered in `hooks`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rest_framework import serializers

from apps.accounts.models import User
from apps.datasets.models import DatasetVersion
from apps.gates.models import Gate
from apps.realtime.services.loops import BASELINES
from apps.realtime.services.serving import (
    SERVE,
    SESSIONTRAIN,
    SIMULATE,
    serve_launch,
    session_train_launch,
    simulate_launch,
)
from apps.rewards.models import RewardConfigVersion
from apps.runs.models import Checkpoint, Run


def _launcher(service: Callable[..., Run]) -> Callable[[User, dict[str, Any]], Run]:
    """The launch the runs API calls: the validated body (every field but `kind`) as the service's arguments."""

    def launch(user: User, data: dict[str, Any]) -> Run:
        return service(user=user, **{name: value for name, value in data.items() if name != "kind"})

    return launch


class AbSerializer(serializers.Serializer):
    deployment = serializers.IntegerField(min_value=1, max_value=2**63 - 1, help_text="Arm b's deployment")
    share = serializers.FloatField(default=0.5, min_value=0.0, max_value=1.0, help_text="Arm b's share, in (0, 1)")


class ServeLaunchSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=[SERVE])
    model_name = serializers.RegexField(
        r"^[A-Za-z0-9._:/-]{1,100}$", max_length=100, help_text="The `model` clients ask for"
    )
    gate = serializers.PrimaryKeyRelatedField(
        queryset=Gate.objects.all(),
        required=False,
        allow_null=True,
        default=None,
        help_text="Serve this gate's current deployment (followed as it changes)",
    )
    checkpoint = serializers.PrimaryKeyRelatedField(
        queryset=Checkpoint.objects.select_related("run"),
        required=False,
        allow_null=True,
        default=None,
        help_text="Or serve this checkpoint",
    )
    base_model = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=500,
        help_text="The base model (a gate without a deployment serves it; alone, it is what is served)",
    )
    replicas = serializers.IntegerField(default=1, help_text="Replicas per arm")
    ab = AbSerializer(required=False, allow_null=True, default=None, help_text="An A/B split: arm b's deployment")
    http_host = serializers.CharField(default="127.0.0.1", max_length=200)
    http_port = serializers.IntegerField(default=8100)
    options = serializers.DictField(
        required=False,
        default=dict,
        help_text="Further workers.specs.ServeSpec settings: backend, threads, max_new_tokens, max_context, ...",
    )
    name = serializers.CharField(required=False, allow_blank=True, default="", max_length=200)
    tags = serializers.ListField(child=serializers.CharField(max_length=50), required=False, default=list)


serve_launch_from_api = _launcher(serve_launch)


class SimulateLaunchSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=[SIMULATE])
    serve_run = serializers.PrimaryKeyRelatedField(queryset=Run.objects.all(), help_text="The serving run to play")
    dataset_version = serializers.PrimaryKeyRelatedField(
        queryset=DatasetVersion.objects.select_related("dataset"), help_text="A repo_tasks dataset version"
    )
    sessions = serializers.IntegerField(default=8, help_text="Sessions to play")
    concurrency = serializers.IntegerField(default=2, help_text="Sessions in flight at once")
    noise = serializers.FloatField(default=0.0, help_text="Chance a user's feedback is flipped")
    tolerates_questions = serializers.FloatField(
        default=0.0, help_text="Share of users who never complain about a clarifying question"
    )
    options = serializers.DictField(
        required=False,
        default=dict,
        help_text="Further workers.specs.SimulateSpec settings: max_turns, max_tokens, temperature, seed, ...",
    )
    name = serializers.CharField(required=False, allow_blank=True, default="", max_length=200)
    tags = serializers.ListField(child=serializers.CharField(max_length=50), required=False, default=list)


simulate_launch_from_api = _launcher(simulate_launch)


class SessionTrainLaunchSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=[SESSIONTRAIN])
    dataset_version = serializers.PrimaryKeyRelatedField(
        queryset=DatasetVersion.objects.select_related("dataset"), help_text="A sessions dataset version"
    )
    reward_version = serializers.PrimaryKeyRelatedField(
        queryset=RewardConfigVersion.objects.all(), help_text="A session reward (with a session_feedback term)"
    )
    base_model = serializers.CharField(max_length=500)
    checkpoint = serializers.PrimaryKeyRelatedField(
        queryset=Checkpoint.objects.select_related("run"),
        required=False,
        allow_null=True,
        default=None,
        help_text="Start from this checkpoint (the deployed one); none: the base model",
    )
    config = serializers.DictField(required=False, default=dict, help_text="workers.rl.config.TrainConfig")
    baseline = serializers.ChoiceField(choices=list(BASELINES), default="batch_mean")
    max_samples = serializers.IntegerField(default=4096)
    name = serializers.CharField(required=False, allow_blank=True, default="", max_length=200)
    tags = serializers.ListField(child=serializers.CharField(max_length=50), required=False, default=list)


session_train_launch_from_api = _launcher(session_train_launch)
