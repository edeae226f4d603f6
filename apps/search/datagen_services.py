"""Synthetic-task generation (issue 4, section 5): launch a datagen run on a corpus version, register its output.

`datagen_launch` checks everything knowable up front (the corpus version's kind, the target dataset, the typed
parameters) and creates the run with the job's whole input in `spec["job"]`; `datagen_finalize`, the run kind's
success hook, turns the job's task rows into the next version of the target tasks dataset, with the verification
report in the version's `validation_report["verification"]`, and records the outcome in `run.summary["datagen"]`.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from pathlib import Path
from typing import Any

from django.core.files.storage import default_storage
from django.db import transaction
from django.utils import timezone
from pydantic import ValidationError as PydanticError
from rest_framework.exceptions import ValidationError

from apps.accounts.models import User
from apps.datasets.models import Dataset, DatasetKind, DatasetVersion
from apps.datasets.services import SLUG, dataset_create, dataset_version_create
from apps.runs.models import Run, RunKind, RunStatus
from apps.runs.storage import storage_uri
from workers.models import BUILTIN_MODELS
from workers.search.synth import SynthParams

TASKS_FILE = "tasks.jsonl"
REPORT_FILE = "report.json"


def datagen_params_check(params: Any) -> SynthParams:
    """The typed parameters, or a 400 naming each bad field as `params.<field>`."""
    parsed, problems = _params_problems(params)
    if parsed is None:
        raise ValidationError(problems)
    return parsed


def _params_problems(params: Any) -> tuple[SynthParams | None, dict[str, list[str]]]:
    if not isinstance(params, dict):
        return None, {"params": ["must be a JSON object of generation settings (empty for the defaults)"]}
    try:
        parsed = SynthParams.model_validate(params)
    except PydanticError as exc:
        fields: dict[str, list[str]] = {}
        for err in exc.errors()[:20]:
            path = ".".join(str(p) for p in ("params", *err["loc"]))
            fields.setdefault(path, []).append(err["msg"])
        return None, fields
    if parsed.generator == "llm" and parsed.model not in BUILTIN_MODELS:
        if not (Path(parsed.model).expanduser() / "config.json").is_file():
            names = ", ".join(sorted(BUILTIN_MODELS))
            message = (
                f"unknown model {parsed.model!r}: use a built-in name ({names}) or the path of a model directory "
                "with config.json"
            )
            return None, {"params.model": [message]}
    return parsed, {}


@transaction.atomic
def datagen_launch(*, corpus_version: DatasetVersion, target_dataset: str, params: Any, user: User) -> Run:
    """A datagen run from `corpus_version` into the tasks dataset `target_dataset` (created at finalize if it does
    not exist), dispatched to Ray once this transaction commits."""
    problems: dict[str, list[str]] = {}
    if corpus_version.dataset.kind != DatasetKind.CORPUS:
        problems["corpus_version"] = [
            f"{corpus_version} is a {corpus_version.dataset.kind} dataset; task generation needs a dataset of kind "
            "'corpus'"
        ]
    if not SLUG.fullmatch(target_dataset or ""):
        problems["target_dataset"] = ["use 1-100 letters, digits, '-' or '_' (e.g. stdlib-tasks)"]
    else:
        existing = Dataset.objects.filter(name=target_dataset).first()
        if existing is not None and existing.kind != DatasetKind.TASKS:
            problems["target_dataset"] = [
                f"{target_dataset!r} is a {existing.kind} dataset; name a tasks dataset or a new name"
            ]
    parsed, param_problems = _params_problems(params)
    problems.update(param_problems)
    if problems or parsed is None:
        raise ValidationError(problems)

    run = Run.objects.create(
        kind=RunKind.DATAGEN,
        name=f"datagen {parsed.generator} {parsed.num_tasks} tasks from {corpus_version} into {target_dataset}"[:200],
        spec={},
        dataset_version=corpus_version,
        ingest_nonce=secrets.token_hex(16),
        created_by=user,
        progress_total=parsed.num_tasks,
    )
    # The nonce keeps a reset database's reused run ids from finding an older run's files.
    folder = f"runs/{run.pk}/datagen-{run.ingest_nonce[:8]}"
    outputs = {"tasks": f"{folder}/{TASKS_FILE}", "report": f"{folder}/{REPORT_FILE}"}
    run.spec = {
        "params": parsed.model_dump(mode="json"),
        "target_dataset": target_dataset,
        "corpus_version": corpus_version.pk,
        "outputs": outputs,
        "job": {
            "corpus_uri": storage_uri(str(corpus_version.file.name)),
            "corpus_label": str(corpus_version),
            "corpus_hash": corpus_version.content_hash,
            "output_uri": storage_uri(outputs["tasks"]),
            "report_uri": storage_uri(outputs["report"]),
            **parsed.model_dump(mode="json"),
        },
    }
    run.save(update_fields=["spec"])

    from apps.runs.tasks import dispatch_run

    transaction.on_commit(lambda: dispatch_run.delay(run.pk))
    return run


def datagen_report(run: Run) -> dict[str, Any] | None:
    """The job's verification report from storage, or None while the job has not written it."""
    name = (run.spec.get("outputs") or {}).get("report")
    if not name or not default_storage.exists(name):
        return None
    with default_storage.open(name, "rb") as handle:
        report: dict[str, Any] = json.loads(handle.read())
    return report


def _read_output(run: Run, key: str) -> bytes:
    with default_storage.open(run.spec["outputs"][key], "rb") as handle:
        data: bytes = handle.read()
    return data


def _version_notes(run: Run, report: dict[str, Any]) -> str:
    dropped = ", ".join(f"{k} {v}" for k, v in report["dropped"].items() if v) or "none"
    return (
        f"Generated by run {run.pk} with {report['generator']} from {report['corpus']} (seed "
        f"{report['params']['seed']}): kept {report['kept']} of {report['candidates']} candidates; dropped: "
        f"{dropped}. The verification report is in validation_report['verification']."
    )


def datagen_finalize(*, run_id: int) -> None:
    """Register a succeeded datagen run's tasks as the next version of its target dataset (created if missing).

    Idempotent: the outcome lands in `run.summary["datagen"]` under the run's row lock, and a run that has one is
    left alone. A job that kept no tasks, content identical to an existing version, or a target that became another
    kind are recorded there too, never as an empty or duplicate version. Storage errors propagate (the Celery task
    retries them)."""
    with transaction.atomic():
        run = Run.objects.select_for_update().select_related("created_by").get(pk=run_id)
        if run.kind != RunKind.DATAGEN or run.status != RunStatus.SUCCEEDED:
            return
        if (run.summary or {}).get("datagen", {}).get("finalized"):
            return
        report = json.loads(_read_output(run, "report"))
        outcome: dict[str, Any] = {
            "finalized": True,
            "finalized_at": timezone.now().isoformat(),
            "kept": report["kept"],
            "candidates": report["candidates"],
            "tasks_version": None,
            "tasks_dataset": None,
        }
        target = run.spec["target_dataset"]
        if report["kept"] == 0:
            outcome["outcome"] = "the job kept no tasks, so no dataset version was created; see the report's drops"
        else:
            outcome.update(_register_tasks(run, target, _read_output(run, "tasks"), report))
        run.summary = {**(run.summary or {}), "datagen": outcome}
        run.save(update_fields=["summary"])


def _register_tasks(run: Run, target: str, data: bytes, report: dict[str, Any]) -> dict[str, Any]:
    dataset = Dataset.objects.filter(name=target).first()
    if dataset is None:
        dataset = dataset_create(
            name=target,
            kind=DatasetKind.TASKS,
            owner=run.created_by,
            description=f"Synthetic search tasks (created by datagen run {run.pk})",
        )
    if dataset.kind != DatasetKind.TASKS:
        return {"outcome": f"not registered: {target!r} is now a {dataset.kind} dataset", "error": True}
    content_hash = hashlib.sha256(data).hexdigest()
    same = DatasetVersion.objects.filter(dataset=dataset, content_hash=content_hash).first()
    if same is not None:
        return {
            "tasks_version": same.pk,
            "tasks_dataset": dataset.pk,
            "outcome": f"identical tasks are already {same}; linked it instead of adding a version",
        }
    try:
        version = dataset_version_create(
            dataset=dataset,
            data=data,
            filename=TASKS_FILE,
            created_by=run.created_by,
            notes=_version_notes(run, report),
        )
    except ValidationError as exc:
        return {"outcome": f"not registered: the dataset refused the file ({exc.detail})", "error": True}
    version.validation_report = {**version.validation_report, "verification": report, "run": run.pk}
    version.save(update_fields=["validation_report"])
    return {"tasks_version": version.pk, "tasks_dataset": dataset.pk, "outcome": f"created {version}"}
