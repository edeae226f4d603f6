"""The training run's launch page (`/runs/new/train/`, routed in `apps.training.pages`): the form's fields from
TrainConfig's own descriptions, what an empty choice means (the environment's or the algorithm's default), the
recipe presets and defaults that pair, and the nested config read back from the flat form; the models SFT warm-ups
fine-tuned, offered as base models here and on the SFT form."""

from __future__ import annotations

import json
from typing import Any, get_args

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods
from pydantic import BaseModel
from rest_framework.exceptions import ValidationError

from apps.accounts.decorators import needs
from apps.accounts.models import Capability
from apps.accounts.permissions import request_user
from apps.common.errors import validation_messages
from apps.common.forms import posted_values
from apps.datasets.models import DatasetKind, DatasetVersion
from apps.rewards.models import RewardConfigVersion
from apps.runs.models import Run
from apps.training import services
from apps.training.launch_form import (
    BASIC_FIELDS,
    DEFAULT_RECIPE,
    dataset_environments,
    recipe_presets,
    reward_environments,
    run_time_rates,
    training_checkpoints,
    with_fits,
)
from workers.envs.registry import ENVIRONMENTS, environment_choices
from workers.models.registry import BUILTINS
from workers.rl.config import TrainConfig
from workers.rl.config_sections import (
    FALLBACK_GROUP_SIZE,
    ComputeRequest,
    CurriculumConfig,
    LearnerConfig,
    LoraConfig,
    SamplingConfig,
)

ALGORITHM_DEFAULTED = ("scale_rewards", "drop_equal_groups", "dynamic_sampling", "overlong_penalty")
"""Form fields whose empty choice keeps the algorithm's own default."""


def _recipe_label(what: str, values: dict[str, Any], otherwise: str) -> str:
    """'(the environment's recipe default: kimi on swarm, ...; grpo otherwise)' from the environments' own values."""
    listed = ", ".join(f"{value} on {name}" for name, value in sorted(values.items()) if value is not None)
    return f"(the environment's recipe {what}: {listed}; {otherwise})" if listed else f"({otherwise})"


EMPTY_CHOICE_LABELS = {
    "algorithm": _recipe_label(
        "default", {name: cls.default_algorithm for name, cls in ENVIRONMENTS.items()}, "grpo otherwise"
    ),
    **{name: "(the algorithm's default)" for name in ALGORITHM_DEFAULTED},
}
"""What the empty choice of a select means, per field."""

SUBSTEPS_LABEL = "substeps " + _recipe_label(
    "default", {name: cls.default_substeps for name, cls in ENVIRONMENTS.items()}, "1 otherwise"
).replace("(the", "(empty: the", 1)
"""The substeps field's label: empty takes the environment's recipe value (Environment.default_substeps)."""

GROUP_SIZE_LABEL = "group size " + _recipe_label(
    "default", {name: cls.default_group_size for name, cls in ENVIRONMENTS.items()}, "4 otherwise"
).replace("(the", "(empty: the", 1)
"""The group size field's label: empty takes the environment's recipe value (Environment.default_group_size)."""

TOKEN_CAP_LABEL = "sampling: max new tokens " + _recipe_label(
    "default", {name: cls.default_max_new_tokens for name, cls in ENVIRONMENTS.items()}, "64 otherwise"
).replace("(the", "(empty: the", 1)
"""The per-turn cap's label: empty takes the environment's value (Environment.default_max_new_tokens)."""


def recipe_reward_environments() -> list[str]:
    """The environments that bring a recipe reward (Environment.default_reward): a launch on them may name none."""
    return [name for name, cls in sorted(ENVIRONMENTS.items()) if cls.default_reward() is not None]


# The form's fields, in the order shown; help text and defaults come from TrainConfig's own Field descriptions.
TRAIN_FORM_FIELDS = [
    "base_model",
    "environment",
    "algorithm",
    "learning_rate",
    "steps",
    "prompts_per_step",
    "group_size",
    "substeps",
    "curriculum.by",
    "scale_rewards",
    "drop_equal_groups",
    "dynamic_sampling",
    "overlong_penalty",
    "sampling.max_new_tokens",
    "sampling.temperature",
    "mode",
    "max_staleness",
    "weight_sync",
    "checkpoint_every",
    "gradient_checkpointing",
    "lora.rank",
    "max_tokens_per_pack",
    "compute.cpus",
    "compute.gpus",
    "compute.memory_gb",
    "compute.rollout_workers",
    "compute.placement",
    "learner.strategy",
    "learner.ranks",
    "seed",
]


def _train_form_fields(values: dict[str, str]) -> list[dict[str, Any]]:
    nested: dict[str, type[BaseModel]] = {
        "sampling": SamplingConfig,
        "compute": ComputeRequest,
        "lora": LoraConfig,
        "learner": LearnerConfig,
        "curriculum": CurriculumConfig,
    }
    fields = []
    for path in TRAIN_FORM_FIELDS:
        owner, _, leaf = path.rpartition(".")
        info = (nested[owner] if owner else TrainConfig).model_fields[leaf]
        default = info.get_default(call_default_factory=True)
        choices = [str(c) for c in get_args(info.annotation)] if leaf not in ("base_model", "environment") else []
        if path in ALGORITHM_DEFAULTED:
            # Empty means "the algorithm's" (workers.rl.algorithms): the run page shows what it resolved to.
            inner = next(a for a in get_args(info.annotation) if a is not type(None))
            choices = ["", "true", "false"] if inner is bool else ["", *(str(c) for c in get_args(inner))]
        if leaf == "algorithm":
            # Empty means "the environment's" (Environment.default_algorithm, resolved by TrainConfig): a run that
            # names no algorithm on coding_agent gets composer; the run page says where it came from.
            choices, default = ["", *choices], None
        label = path.replace("_", " ").replace(".", ": ")
        if leaf == "substeps":
            # Empty means the environment's (Environment.default_substeps: search's 4), else 1.
            default, label = None, SUBSTEPS_LABEL
        if path == "group_size":
            # Empty means the environment's (Environment.default_group_size: search's 8), else 4.
            default, label = None, GROUP_SIZE_LABEL
        if path == "sampling.max_new_tokens":
            # Empty means the environment's (Environment.default_max_new_tokens: search's 256), else 64.
            default, label = None, TOKEN_CAP_LABEL
        if leaf == "base_model":
            choices = model_choices()
        if leaf == "environment":
            choices = [name for name, _ in environment_choices()]
        kind = "checkbox" if isinstance(default, bool) else ("select" if choices else "number")
        if leaf == "base_model":
            kind = "model"  # a text box offering the known models: a Hub id (org/name@revision) or a path is typed
        if path == "lora.rank":
            label, default = "LoRA rank (empty: full parameters)", ""
        fields.append(
            {
                "name": path,
                "label": label,
                "help": info.description or "",
                "kind": kind,
                "choices": choices,
                "empty_label": EMPTY_CHOICE_LABELS.get(path, ""),
                "value": values.get(path, "" if default is None else str(default)),
                "checked": values.get(path, "on" if default is True else "") == "on",
            }
        )
    return fields


def _train_config_from_post(post: Any) -> dict[str, Any]:
    """Nested config dict from the flat form; blank fields keep TrainConfig's defaults."""
    config: dict[str, Any] = {}
    for path in TRAIN_FORM_FIELDS:
        raw = post.get(path, "")
        owner, _, leaf = path.rpartition(".")
        if path == "gradient_checkpointing":
            value: Any = raw == "on"
        elif raw == "":
            continue
        else:
            value = raw
        (config.setdefault(owner, {}) if owner else config)[leaf] = value
    for name in ("loss", "env_params", "compute.per_rank", "compute.per_engine"):
        text = post.get(name, "").strip()
        if text:
            owner, _, leaf = name.rpartition(".")
            try:
                (config.setdefault(owner, {}) if owner else config)[leaf] = json.loads(text)
            except ValueError as exc:
                raise ValidationError({f"config.{name}": [f"not valid JSON ({exc}); write an object like {{}}"]})
    return config


# Over 60 lines, moved whole from apps.training.pages: the GET defaults, the POST launch and the one context both
# render read top to bottom, as in sft_new and rescore_new.
@needs(Capability.LAUNCH)
@require_http_methods(["GET", "POST"])
def train_new(request: HttpRequest) -> HttpResponse:
    versions = DatasetVersion.objects.filter(
        dataset__kind__in=[DatasetKind.TASKS, DatasetKind.REPO_TASKS]
    ).select_related("dataset")
    corpora = DatasetVersion.objects.filter(dataset__kind=DatasetKind.CORPUS).select_related("dataset")
    rewards = RewardConfigVersion.objects.select_related("config").order_by("config__name", "-number")
    errors: list[str] = []
    values = posted_values(request)
    if request.method == "GET" and request.GET.get("init_checkpoint", "").isdigit():
        values["init_checkpoint"] = request.GET["init_checkpoint"]  # "train from here" on a run's checkpoints
    fits = reward_environments(rewards)
    kinds = dataset_environments()
    recipes = recipe_presets({f["name"]: f["value"] for f in _train_form_fields({})})
    if request.method == "GET":
        # Defaults that pair: the first tasks dataset the default environment accepts and the first reward that
        # scores it, with the example's recipe (a run that finishes in minutes here).
        environment = str(TrainConfig.model_fields["environment"].default)
        first = next((pk for pk, envs in fits.items() if environment in envs), None)
        if first is not None:
            values["reward_version"] = str(first)
        dataset = next((v for v in versions if environment in kinds.get(v.dataset.kind, [])), None)
        if dataset is not None and "dataset_version" not in values:
            values["dataset_version"] = str(dataset.pk)
        values.setdefault("recipe", DEFAULT_RECIPE)
        chosen = next((r for r in recipes if r["name"] == values["recipe"]), recipes[0])
        for key, value in chosen["settings"].items():
            values.setdefault(key, value)
    if request.method == "POST":
        init_id = request.POST.get("init_checkpoint", "")
        init = training_checkpoints().filter(pk=int(init_id)).first() if init_id.isdigit() else None
        try:
            dataset_version = versions.get(pk=int(request.POST.get("dataset_version", "0")))
            reward_id = request.POST.get("reward_version", "")
            # Empty: the environment's recipe reward (services.run_launch_train refuses an environment without one).
            reward_version = rewards.get(pk=int(reward_id)) if reward_id else None
        except (ValueError, DatasetVersion.DoesNotExist, RewardConfigVersion.DoesNotExist):
            errors.append("pick a tasks dataset version and a reward config version")
        else:
            corpus_id = request.POST.get("corpus_version", "")
            try:
                config = _train_config_from_post(request.POST)
                if init is not None:
                    config.pop("base_model", None)  # the checkpoint's own base model
                elif init_id:
                    raise ValidationError({"init_checkpoint": [f"no training run has a checkpoint {init_id}"]})
                run = services.run_launch_train(
                    created_by=request_user(request),
                    dataset_version=dataset_version,
                    reward_version=reward_version,
                    config=config,
                    name=request.POST.get("name", "")[:200],
                    corpus_version=corpora.filter(pk=int(corpus_id)).first() if corpus_id.isdigit() else None,
                    init_checkpoint=init,
                )
            except ValidationError as exc:
                errors = validation_messages(exc)
            else:
                return redirect("runs:detail", run_id=run.pk)
    fields = _train_form_fields(values)
    return render(
        request,
        "runs/train_new.html",
        {
            "versions": [(v, " ".join(kinds.get(v.dataset.kind, []))) for v in versions],
            "recipes": recipes,
            "basic_fields": [f for f in fields if f["name"] in BASIC_FIELDS],
            "advanced_fields": [f for f in fields if f["name"] not in BASIC_FIELDS],
            "rewards": [with_fits(r, fits) for r in rewards],
            "recipe_reward_envs": " ".join(recipe_reward_environments()),
            "recipe_reward_label": _recipe_label(
                "reward",
                {name: RECIPE_REWARD_NAMES.get(name, "its own") for name in recipe_reward_environments()},
                "none otherwise: pick one",
            ),
            "corpora": corpora,
            "checkpoints": training_checkpoints()[:50],
            "run_time_rates": run_time_rates(),
            # What an empty group size field means per environment, for the run-time estimate (launch.js).
            "group_sizes": {
                "fallback": FALLBACK_GROUP_SIZE,
                **{name: cls.default_group_size for name, cls in ENVIRONMENTS.items() if cls.default_group_size},
            },
            # What an empty per-turn cap means per environment, for the same estimate.
            "token_caps": {
                "fallback": SamplingConfig.model_fields["max_new_tokens"].default,
                **{
                    name: cls.default_max_new_tokens for name, cls in ENVIRONMENTS.items() if cls.default_max_new_tokens
                },
            },
            "errors": errors,
            "values": values,
            "per_rank": values.get("compute.per_rank", ""),
            "per_engine": values.get("compute.per_engine", ""),
        },
    )


RECIPE_REWARD_NAMES = {"search": "Context-1's X2-X5", "swarm": "Kimi K2.5's PARL (K1)"}
"""How the launch form names each environment's recipe reward (Environment.default_reward)."""


def model_choices() -> list[str]:
    """What a model box offers: the built-in models, the models SFT warm-ups fine-tuned and the Hub models runs
    have already resolved (so they are in the cluster's cache)."""
    return [*BUILTINS, *fine_tuned_models(), *cached_hub_models()]


def cached_hub_models(limit: int = 200) -> list[str]:
    """Hub ids (with the revision asked for, unless `main`) that runs resolved on the cluster, newest first; the
    preflight records them in the run's summary (`workers.jobs.preflight`)."""
    seen: list[str] = []
    for summary in (
        Run.objects.filter(summary__has_key="models").order_by("-pk").values_list("summary", flat=True)[:limit]
    ):
        for record in (summary.get("models") or {}).values():
            if isinstance(record, dict) and record.get("source") == "hub":
                revision = record.get("revision") or "main"
                name = str(record.get("id")) + ("" if revision == "main" else f"@{revision}")
                if name not in seen:
                    seen.append(name)
    return seen


def fine_tuned_models(limit: int = 20) -> list[str]:
    """The models SFT warm-ups fine-tuned (their directories), newest first: what an RL run starts from after a
    warm-up, offered beside the built-in models."""
    runs = Run.objects.filter(kind="sft", status="succeeded").order_by("-pk")[:limit]
    paths = []
    for run in runs:
        uri = (run.summary or {}).get("model_uri") or ""
        if uri.startswith("file://"):
            paths.append(uri.removeprefix("file://"))
    return paths
