"""Launch pages for training, SFT and re-scoring runs, and resuming a training run (URL names in `web:`). The
training run's launch form is in `apps.training.pages_train`; its route is here."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path as route
from django.views.decorators.http import require_http_methods, require_POST
from rest_framework.exceptions import ValidationError

from apps.accounts.decorators import needs
from apps.accounts.models import Capability
from apps.accounts.permissions import request_user
from apps.common.errors import validation_messages
from apps.common.forms import number_fields, posted_numbers, posted_values
from apps.datasets.models import DatasetKind, DatasetVersion
from apps.rewards.models import RewardConfig, RewardConfigVersion
from apps.runs.models import Run, TrajectorySummary
from apps.training import services
from apps.training.pages_train import model_choices, train_new
from apps.training.rft import rft_dataset_create
from workers.envs.registry import environment_choices
from workers.models.registry import BUILTINS
from workers.rewards.schema import RewardSpecError
from workers.rl.config_sections import SFTConfig


@needs(Capability.LAUNCH)
@require_http_methods(["GET", "POST"])
def rescore_new(request: HttpRequest) -> HttpResponse:
    versions = DatasetVersion.objects.filter(dataset__kind=DatasetKind.TRAJECTORIES).select_related("dataset")
    rewards = RewardConfigVersion.objects.select_related("config").order_by("config__name", "-number")
    errors: list[str] = []
    if request.method == "POST":
        try:
            dataset_version = versions.get(pk=int(request.POST.get("dataset_version", "0")))
            reward_version = rewards.get(pk=int(request.POST.get("reward_version", "0")))
        except (ValueError, DatasetVersion.DoesNotExist, RewardConfigVersion.DoesNotExist):
            errors.append("pick a trajectories dataset version and a reward config version")
        else:
            try:
                run = services.run_launch_rescore(
                    created_by=request_user(request),
                    dataset_version=dataset_version,
                    reward_version=reward_version,
                    name=request.POST.get("name", ""),
                )
            except ValidationError as exc:
                errors = validation_messages(exc)
            else:
                return redirect("runs:detail", run_id=run.pk)
    return render(request, "runs/rescore_new.html", {"versions": versions, "rewards": rewards, "errors": errors})


SFT_NUMBERS = ("epochs", "max_tasks", "rollouts_per_task", "learning_rate", "seed")


def _sft_config_from_post(post: Any) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for name in ("teacher_model", "base_model", "environment"):
        if value := post.get(name, "").strip():
            config[name] = value
    config.update(posted_numbers(post, SFT_NUMBERS))
    if text := post.get("env_params", "").strip():
        try:
            config["env_params"] = json.loads(text)
        except ValueError as exc:
            raise ValidationError({"config.env_params": [f"not valid JSON ({exc}); write an object like {{}}"]})
    return config


@needs(Capability.LAUNCH)
@require_http_methods(["GET", "POST"])
def sft_new(request: HttpRequest) -> HttpResponse:
    """The SFT warm-up's launch form: a teacher (a model, or the scripted agent of the environment) plays the
    tasks, its episodes are filtered, the base model is fine-tuned on the kept ones (services.run_launch_sft)."""
    versions = DatasetVersion.objects.filter(
        dataset__kind__in=[DatasetKind.TASKS, DatasetKind.REPO_TASKS]
    ).select_related("dataset")
    corpora = DatasetVersion.objects.filter(dataset__kind=DatasetKind.CORPUS).select_related("dataset")
    rewards = RewardConfigVersion.objects.select_related("config").order_by("config__name", "-number")
    errors: list[str] = []
    values = posted_values(request)
    if request.method == "POST":
        try:
            dataset_version = versions.get(pk=int(request.POST.get("dataset_version", "0")))
            reward_version = rewards.get(pk=int(request.POST.get("reward_version", "0")))
        except (ValueError, DatasetVersion.DoesNotExist, RewardConfigVersion.DoesNotExist):
            errors.append("pick a tasks dataset version and a reward config version")
        else:
            corpus_id = request.POST.get("corpus_version", "")
            try:
                run = services.run_launch_sft(
                    created_by=request_user(request),
                    dataset_version=dataset_version,
                    reward_version=reward_version,
                    config=_sft_config_from_post(request.POST),
                    name=request.POST.get("name", "")[:200],
                    corpus_version=corpora.filter(pk=int(corpus_id)).first() if corpus_id.isdigit() else None,
                )
            except ValidationError as exc:
                errors = validation_messages(exc)
            else:
                return redirect("runs:detail", run_id=run.pk)
    defaults = SFTConfig()
    numbers = number_fields(SFTConfig, SFT_NUMBERS, values)
    return render(
        request,
        "runs/sft_new.html",
        {
            "versions": versions,
            "rewards": rewards,
            "corpora": corpora,
            "errors": errors,
            "values": values,
            "numbers": numbers,
            "teachers": [*services.SCRIPTED_TEACHERS, *BUILTINS],
            "base_models": model_choices(),
            "environments": [name for name, _ in environment_choices()],
            "defaults": defaults,
        },
    )


@needs(Capability.LAUNCH)
@require_POST
def run_resume_view(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(Run, pk=run_id)
    try:
        child = services.run_resume(run=run, user=request_user(request))
    except ValidationError as exc:
        messages.error(request, "; ".join(validation_messages(exc)))
        return redirect("runs:detail", run_id=run.pk)
    messages.info(request, f"Run {child.pk} resumes run {run.pk} from its latest checkpoint.")
    return redirect("runs:detail", run_id=child.pk)


@needs(Capability.LAUNCH)
@require_POST
def run_rft_view(request: HttpRequest, run_id: int) -> HttpResponse:
    """The run page's "Export for RFT" form: its successful trajectories as a trajectories dataset version."""
    run = get_object_or_404(Run, pk=run_id)
    raw_reward, raw_per_task = request.POST.get("min_reward", "1").strip(), request.POST.get("per_task", "1").strip()
    try:
        min_reward: Any = float(raw_reward)
    except ValueError:
        min_reward = raw_reward  # the service names the field
    per_task: Any = int(raw_per_task) if raw_per_task.isdigit() else raw_per_task
    try:
        version = rft_dataset_create(
            run=run,
            dataset=request.POST.get("dataset", "").strip(),
            user=request_user(request),
            min_reward=min_reward,
            per_task=per_task,
        )
    except ValidationError as exc:
        messages.error(request, "; ".join(validation_messages(exc)))
        return redirect("runs:detail", run_id=run.pk)
    kept = version.validation_report.get("rft", {}).get("kept")
    messages.info(request, f"{version} holds {kept} trajectories of run {run.pk} for RFT.")
    return redirect("datasets:detail", dataset_id=version.dataset_id)


JUDGE_SAMPLE = 5000
"""Most recent trajectories of a reward version's runs that the judge agreement reads."""


@needs(Capability.READ)
def judge_agreement_view(request: HttpRequest, config_id: int) -> HttpResponse:
    """The reward config page's fragment: for each version with a rubric_judge term, how its judgements agree with
    the version's other (code-verified) gain terms over the trajectories its runs scored (Kimi K2.5's GRMs sit "on
    top of verified reward signals": this says whether the judge sees what the verified reward sees)."""
    from workers.rewards.judge import agreement
    from workers.rewards.schema import validate_reward_spec

    config = get_object_or_404(RewardConfig, pk=config_id)
    tables = []
    for version in config.versions.order_by("-number"):
        try:
            spec = validate_reward_spec(version.spec)
        except RewardSpecError:
            continue
        judged = [t.name for t in spec.terms if t.type == "rubric_judge"]
        verified = [t.name for t in spec.terms if t.kind == "gain" and t.type != "rubric_judge"]
        if not judged:
            continue
        terms = list(
            TrajectorySummary.objects.filter(run__reward_version=version)
            .order_by("-pk")
            .values_list("terms", flat=True)[:JUDGE_SAMPLE]
        )
        rows = []
        for j in judged:
            for v in verified:
                pairs = [
                    (float(t[j]), float(t[v]))
                    for t in terms
                    if isinstance(t, dict) and isinstance(t.get(j), int | float) and isinstance(t.get(v), int | float)
                ]
                rows.append(agreement(pairs, j, v))
        tables.append({"version": version, "rows": rows, "trajectories": len(terms)})
    return render(request, "rewards/_judge_agreement.html", {"tables": tables})


app_name = "training"
urlpatterns = [
    route("runs/new/rescore/", rescore_new, name="rescore-new"),
    route("runs/new/train/", train_new, name="train-new"),
    route("runs/new/sft/", sft_new, name="sft-new"),
    route("runs/<int:run_id>/resume/", run_resume_view, name="resume"),
    route("runs/<int:run_id>/rft/", run_rft_view, name="rft"),
    route("rewards/<int:config_id>/judge-agreement/", judge_agreement_view, name="judge-agreement"),
]
