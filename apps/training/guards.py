"""What a training or SFT launch checks before any compute starts: a refused run costs a 400 now, not a failure in
an hour. The typed config, the models, the environment and every task row, the reward's inputs, memory, and the
training-data guards that training and SFT share (contamination of a gating benchmark, tasks reviewers excluded)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.conf import settings
from pydantic import ValidationError as PydanticError
from rest_framework.exceptions import ValidationError

from apps.benchmarks.services import contamination_guard
from apps.common.errors import pydantic_problems
from apps.datasets.models import DatasetVersion
from apps.review.services import task_exclusion_guard
from apps.rewards.models import RewardConfigVersion
from apps.search.services.envs import corpus_missing_chunks, with_index_uri
from workers.envs.checks import check_reward_compatible, check_task_rows
from workers.envs.registry import get_environment, make_env
from workers.models.hub import ModelUnavailable, classify_model_name, hub_config, parse_hub_id
from workers.models.registry import BUILTIN_SHAPES, ModelShape, model_name_problems
from workers.rl.algorithms import SettingsError
from workers.rl.config import TrainConfig, memory_problem, settings_for, shape_from_hf_config
from workers.rl.sampling import Curriculum


def with_corpus_index(config: dict[str, Any], corpus_version: DatasetVersion | None) -> dict[str, Any]:
    """`config` with `env_params.index_uri` filled from `corpus_version` when its environment searches a corpus."""
    environment = config.get("environment")
    try:
        needs_index = isinstance(environment, str) and get_environment(environment).needs_corpus_index
    except ValueError:  # an unknown environment: the typed check names it
        return config
    if not needs_index:
        return config
    params = dict(config.get("env_params") or {})
    return {**config, "env_params": with_index_uri(params, corpus_version, environment=str(environment))}


def episode_problems(
    problems: dict[str, list[str]],
    *,
    environment: str,
    env_params: dict[str, Any],
    dataset_version: DatasetVersion,
    reward_version: RewardConfigVersion,
    corpus_version: DatasetVersion | None,
) -> list[Any] | None:
    """Add to `problems` what keeps the environment from running the dataset's tasks or the reward from scoring
    its episodes: the environment and its parameters, the dataset's kind, every task row (and, for an environment
    that searches a corpus, the chunks the rows name), the reward's inputs. Returns the task rows when read."""
    try:
        env_cls = get_environment(environment)
        make_env(environment, **env_params)
    except (ValueError, TypeError) as exc:
        problems["config.environment"] = [str(exc)]
        return None
    rows: list[Any] | None = None
    if dataset_version.dataset.kind != env_cls.dataset_kind:
        problems["dataset_version"] = [
            f"{dataset_version} is a {dataset_version.dataset.kind} dataset; environment '{environment}' trains on "
            f"a dataset of kind '{env_cls.dataset_kind}'"
        ]
    else:
        try:
            with dataset_version.file.open("rb") as handle:
                rows = [json.loads(line) for line in handle.read().split(b"\n") if line.strip()]
        except (OSError, ValueError) as exc:
            raise ValidationError({"dataset_version": [f"{dataset_version}'s file cannot be read as JSONL: {exc}"]})
        row_problems = check_task_rows(env_cls, rows, max_errors=10)
        if not row_problems and env_cls.needs_corpus_index and corpus_version is not None:
            row_problems = corpus_missing_chunks(rows, corpus_version, environment=environment)
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
    """Everything that can be known before compute starts: the typed config, the base model, the environment,
    every task row, the reward's inputs and memory; for an environment that searches a corpus also the corpus
    version, its index and that every chunk a task names exists."""
    if isinstance(config, dict):
        config = with_corpus_index(config, corpus_version)
    try:
        parsed = TrainConfig.model_validate(config)
    except PydanticError as exc:
        raise ValidationError(pydantic_problems(exc, "config"))
    problems: dict[str, list[str]] = {}
    shortest = 2 * settings.RECONCILE_SECONDS  # the watchdog looks once per reconcile: a shorter limit cannot hold
    limits = {"stall_after_seconds": parsed.stall_after_seconds} | {
        f"stall_limits.{phase}": value for phase, value in parsed.stall_limits.model_dump().items() if value
    }
    for field, value in limits.items():
        if value < shortest:
            problems[f"config.{field}"] = [
                f"{value} s is shorter than the watchdog can tell (it checks every "
                f"{settings.RECONCILE_SECONDS} s, CRUCIBLE_RECONCILE_SECONDS): use at least {shortest}"
            ]
    settings_ok = True
    try:
        settings_for(parsed)  # the algorithm's defaults merged with the overrides: a combination that cannot work
    except SettingsError as exc:
        problems[f"config.{exc.field}"] = [str(exc)]
        settings_ok = False
    shape = BUILTIN_SHAPES.get(parsed.base_model)
    if shape is None:
        shape = _model_shape(parsed.base_model, problems)
    rows = episode_problems(
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
    if rows is not None and parsed.curriculum.by != "off":
        try:
            Curriculum.from_rows([r for r in rows if isinstance(r, dict)], parsed.curriculum, parsed.steps, 0)
        except ValueError as exc:
            problems.setdefault("config.curriculum.by", []).append(str(exc))
    if shape is not None and settings_ok and (found := memory_problem(parsed, shape)):
        problems[found[0]] = [found[1]]
    if problems:
        raise ValidationError(problems)
    return parsed


def training_data_guards(
    *, dataset_version: DatasetVersion, allow_contamination: bool, allow_excluded: bool
) -> dict[str, Any]:
    """The guards every run that trains on `dataset_version` passes (training and SFT alike): it must not overlap a
    benchmark that gates deployments, nor hold tasks reviewers excluded. Each refuses with a 400 unless allowed;
    what an allowed launch carries goes into the run's spec (`contamination`, `excluded_tasks`)."""
    carried: dict[str, Any] = {}
    contamination = contamination_guard(dataset_version=dataset_version, allow=allow_contamination)
    if contamination:
        carried["contamination"] = contamination
    excluded = task_exclusion_guard(dataset_version=dataset_version, allow=allow_excluded)
    if excluded:
        carried["excluded_tasks"] = excluded
    return carried


def _model_shape(name: str, problems: dict[str, list[str]]) -> ModelShape | None:
    """The shape of a base model that is not built in, for the memory estimate, from what this host can see: a
    Hub id's config.json when the Hub answers (a typo is a 400), a path's when the directory is here. A path that is
    not here is left to the workers (the model lives there), and so is a Hub the control plane cannot reach."""
    kind = classify_model_name(name, frozenset(BUILTIN_SHAPES))
    config: dict[str, Any] | None = None
    if kind is None:
        problems["config.base_model"] = model_name_problems(name)
        return None
    if kind == "hub":
        try:
            config = hub_config(parse_hub_id(name))
        except ModelUnavailable as exc:
            problems["config.base_model"] = [str(exc)]
            return None
    elif (Path(name).expanduser() / "config.json").is_file():
        try:
            config = json.loads((Path(name).expanduser() / "config.json").read_text())
        except ValueError as exc:
            problems["config.base_model"] = [f"{name}/config.json is not JSON ({exc})"]
            return None
    if config is None:
        return None
    try:
        return shape_from_hf_config(config)
    except (ValueError, KeyError, TypeError) as exc:
        problems["config.base_model"] = [f"{name}: its config.json is not a usable model config ({exc})"]
        return None
