"""Repository tasks (issue 17): import an upload, generate from libraries, register what the jobs kept.

Both ways in are runs, because both run code: an import checks every task in the sandbox (`repoimport`), the
generator mutates libraries and runs their tests (`codegen`). The launch functions check what is knowable at once
(the upload parses, the target dataset fits, the parameters are valid: a 400 naming the field, nothing created);
`repo_tasks_finalize`, both kinds' success hook, turns the job's rows into the next version of the target dataset
of kind `repo_tasks`. Snapshots live in storage under `repo-snapshots/<sha256>.tar.gz`, content-addressed: the jobs
write them there before any row names them, so a crash leaves at worst an unreferenced archive, never a row
without its snapshot.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import transaction
from django.utils import timezone
from pydantic import ValidationError as PydanticError
from rest_framework.exceptions import ValidationError

from apps.accounts.models import User
from apps.common.errors import pydantic_problems
from apps.common.validators import SLUG
from apps.datasets.models import Dataset, DatasetKind, DatasetVersion
from apps.datasets.services import dataset_create, dataset_file_check_size, repo_tasks_version_create
from apps.runs.models import Run, RunStatus
from apps.runs.services import run_create
from apps.runs.storage import storage_uri
from workers.coding.bundle import BundleError, is_archive, parse_upload
from workers.coding.candidates import CodegenParams
from workers.coding.mining import MineParams

REPOIMPORT = "repoimport"
CODEGEN = "codegen"
REPOMINE = "repomine"
SNAPSHOT_FOLDER = "repo-snapshots"
UPLOAD_FOLDER = "repo-uploads"
TASKS_FILE = "tasks.jsonl"
REPORT_FILE = "report.json"


def snapshot_root() -> str:
    """The storage folder (as a worker URI) every repository snapshot is written to and read from."""
    return storage_uri(SNAPSHOT_FOLDER)


def job_outputs(run: Run) -> dict[str, str]:
    """Where an import or generation run's job writes its rows and report (storage names); the nonce keeps a reset
    database's reused run ids from finding an older run's files."""
    folder = f"runs/{run.pk}/{run.kind}-{run.ingest_nonce[:8]}"
    return {"tasks": f"{folder}/{TASKS_FILE}", "report": f"{folder}/{REPORT_FILE}"}


def job_report(run: Run) -> dict[str, Any] | None:
    """The job's report from storage, or None while it has not been written."""
    name = job_outputs(run)["report"]
    if not default_storage.exists(name):
        return None
    with default_storage.open(name, "rb") as handle:
        report: dict[str, Any] = json.loads(handle.read())
    return report


def target_problems(target_dataset: str) -> list[str]:
    """Why `target_dataset` cannot receive repository tasks ([] when it can: a new name or a repo_tasks dataset)."""
    if not SLUG.fullmatch(target_dataset or ""):
        return ["use 1-100 letters, digits, '-' or '_' (e.g. slugify-repairs)"]
    existing = Dataset.objects.filter(name=target_dataset).first()
    if existing is not None and existing.kind != DatasetKind.REPO_TASKS:
        return [f"{target_dataset!r} is a {existing.kind} dataset; name a repo_tasks dataset or a new name"]
    return []


def repo_import_launch(
    *, target_dataset: str, data: bytes, filename: str, user: User, notes: str = "", keep_valid: bool = False
) -> Run:
    """An import run of an upload (`workers.coding.bundle`) into `target_dataset`. The upload is parsed now, so
    a malformed file is a 400 listing every problem and creates nothing; the sandbox checks run in the job."""
    dataset_file_check_size(len(data))
    problems: dict[str, list[str]] = {}
    if found := target_problems(target_dataset):
        problems["target_dataset"] = found
    try:
        tasks = parse_upload(data)
    except BundleError as exc:
        problems["file"] = exc.problems
        tasks = []
    if problems:
        raise ValidationError(problems)
    digest = hashlib.sha256(data).hexdigest()
    upload = f"{UPLOAD_FOLDER}/{digest}.{'bundle' if is_archive(data) else 'jsonl'}"
    if not default_storage.exists(upload):
        default_storage.save(upload, ContentFile(data))

    def job(run: Run) -> dict[str, Any]:
        names = job_outputs(run)
        return {
            "upload_uri": storage_uri(upload),
            "output_uri": storage_uri(names["tasks"]),
            "report_uri": storage_uri(names["report"]),
            "snapshot_root": snapshot_root(),
            "keep_valid": keep_valid,
        }

    return run_create(
        kind=REPOIMPORT,
        name=f"import {len(tasks)} repository task(s) from {filename[-80:]} into {target_dataset}",
        job=job,
        spec={
            "target_dataset": target_dataset,
            "upload": {"name": filename[-200:], "sha256": digest, "bytes": len(data), "tasks": len(tasks)},
            "notes": notes,
            "keep_valid": keep_valid,
        },
        created_by=user,
        progress_total=len(tasks),
    )


def repo_mine_launch(
    *, target_dataset: str, source: str, repo: str, params: Any, user: User, benchmark: Any = None
) -> Run:
    """A mining run (`workers.coding.mining`, `workers.jobs.repomine`) of the git history at `source` (a path on the
    cluster, a URL it can clone, or a git bundle's storage URI) into `target_dataset`. The fields are checked now (a
    400 naming each); whether the source exists is known on the cluster, where the job fails with the reason. With
    `benchmark`, the kept tasks are split by commit time (the newest `test_fraction` held out) and pinned."""
    problems: dict[str, list[str]] = {}
    if benchmark is not None and (found := benchmark_option_problems(benchmark)):
        problems["benchmark"] = found
    if found := target_problems(target_dataset):
        problems["target_dataset"] = found
    if not isinstance(source, str) or not source.strip() or len(source) > 1000:
        problems["location"] = ["give a path on the cluster, a URL git can clone, or a git bundle's storage URI"]
    if not isinstance(repo, str) or not re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
        problems["repo"] = ["name the repository as owner/name, e.g. pytoolz/toolz"]
    parsed: MineParams | None = None
    if not isinstance(params, dict):
        problems["params"] = ['must be a JSON object of mining settings, e.g. {"max_commits": 500}']
    else:
        try:
            parsed = MineParams.model_validate(params)
            re.compile(parsed.test_pattern)
            re.compile(parsed.code_pattern)
        except PydanticError as exc:
            problems.update(pydantic_problems(exc, "params"))
        except re.error as exc:
            problems["params"] = [f"test_pattern or code_pattern is not a regular expression: {exc}"]
    if problems or parsed is None:
        raise ValidationError(problems)
    chosen = parsed

    def job(run: Run) -> dict[str, Any]:
        names = job_outputs(run)
        return {
            **chosen.model_dump(mode="json"),
            "source": source.strip(),
            "repo": repo,
            "output_uri": storage_uri(names["tasks"]),
            "report_uri": storage_uri(names["report"]),
            "snapshot_root": snapshot_root(),
        }

    return run_create(
        kind=REPOMINE,
        name=f"mine repository tasks from {repo} ({chosen.max_commits} commits) into {target_dataset}",
        job=job,
        spec={
            "target_dataset": target_dataset,
            "source": source.strip(),
            "repo": repo,
            "params": chosen.model_dump(mode="json"),
            "keep_valid": True,
            **({"benchmark": {"test_fraction": 0.25, **benchmark, "split": "time"}} if benchmark is not None else {}),
        },
        created_by=user,
    )


def benchmark_option_problems(benchmark: Any) -> list[str]:
    """Why a generation's `benchmark` option ({"name", "test_fraction"}: a held-out benchmark made from the kept
    tasks, apps.benchmarks.services.suites) is malformed ([] when it is well formed)."""
    if not isinstance(benchmark, dict) or set(benchmark) - {"name", "test_fraction"}:
        return ['give {"name": "<benchmark>", "test_fraction": 0.25} (test_fraction optional)']
    if not isinstance(benchmark.get("name"), str) or not SLUG.fullmatch(benchmark["name"]):
        return ["name: use 1-100 letters, digits, '-' or '_'"]
    fraction = benchmark.get("test_fraction", 0.25)
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction < 1:
        return ["test_fraction: a number between 0 and 1 (exclusive), e.g. 0.25"]
    return []


def codegen_launch(*, target_dataset: str, params: Any, user: User, benchmark: Any = None) -> Run:
    """A generation run over vendored libraries (`workers.coding.candidates.CodegenParams`) into `target_dataset`.
    Parameters are checked now (a 400 naming `params.<field>`); every kept task is verified in the job. With
    `benchmark` ({"name", "test_fraction"}), the kept tasks are then split and the test part becomes a held-out
    benchmark version (excluded from training)."""
    problems: dict[str, list[str]] = {}
    if benchmark is not None and (found := benchmark_option_problems(benchmark)):
        problems["benchmark"] = found
    if found := target_problems(target_dataset):
        problems["target_dataset"] = found
    parsed: CodegenParams | None = None
    if not isinstance(params, dict):
        problems["params"] = ['must be a JSON object of generation settings, e.g. {"sources": ["toolz"]}']
    else:
        try:
            parsed = CodegenParams.model_validate(params)
        except PydanticError as exc:
            problems.update(pydantic_problems(exc, "params"))
    if problems or parsed is None:
        raise ValidationError(problems)
    chosen = parsed

    def job(run: Run) -> dict[str, Any]:
        names = job_outputs(run)
        return {
            **chosen.model_dump(mode="json"),
            "output_uri": storage_uri(names["tasks"]),
            "report_uri": storage_uri(names["report"]),
            "snapshot_root": snapshot_root(),
        }

    return run_create(
        kind=CODEGEN,
        name=f"generate {chosen.max_tasks} repository tasks from {', '.join(chosen.sources)} into {target_dataset}",
        job=job,
        spec={
            "target_dataset": target_dataset,
            "params": chosen.model_dump(mode="json"),
            "keep_valid": True,
            **({"benchmark": {"test_fraction": 0.25, **benchmark}} if benchmark is not None else {}),
        },
        created_by=user,
        progress_total=chosen.max_tasks,
    )


def _read(name: str) -> bytes:
    with default_storage.open(name, "rb") as handle:
        data: bytes = handle.read()
    return data


def repo_tasks_finalize(*, run_id: int) -> None:
    """Register a succeeded import or generation run's kept tasks as the next version of its target dataset.

    Idempotent: the outcome lands in `run.summary["repo_tasks"]` under the run's row lock, and a run that has one
    is left alone. Nothing is stored when the job kept no task, when an import refused a task and did not ask to
    keep the valid ones, or when the rows equal an existing version (that version is linked instead)."""
    with transaction.atomic():
        run = Run.objects.select_for_update().select_related("created_by").get(pk=run_id)
        if run.status != RunStatus.SUCCEEDED or (run.summary or {}).get("repo_tasks", {}).get("finalized"):
            return
        report = json.loads(_read(job_outputs(run)["report"]))
        refused = report.get("refused") or []
        outcome: dict[str, Any] = {
            "finalized": True,
            "finalized_at": timezone.now().isoformat(),
            "kept": report.get("kept", 0),
            "refused": len(refused),
            "version": None,
            "dataset": None,
        }
        verb = "generated" if run.kind == CODEGEN else "imported"
        outcome.update(
            repo_tasks_register(
                target=run.spec["target_dataset"],
                rows=_read(job_outputs(run)["tasks"]),
                report={"run": run.pk, **report},
                user=run.created_by,
                notes=run.spec.get("notes") or f"{report.get('kept')} task(s) {verb} and verified by run {run.pk}",
                keep_valid=run.spec.get("keep_valid", True),
                origin=f"{verb} by run {run.pk}",
            )
        )
        run.summary = {**(run.summary or {}), "repo_tasks": outcome}
        run.save(update_fields=["summary"])


def repo_tasks_register(
    *,
    target: str,
    rows: bytes,
    report: dict[str, Any],
    user: User,
    notes: str,
    keep_valid: bool,
    origin: str,
) -> dict[str, Any]:
    """The outcome of registering verified rows as the next version of `target` (created as a repo_tasks dataset
    if missing): {"outcome", "version", "dataset"}, with "error" when the dataset refused them. Nothing is stored
    when no task was kept, or when one was refused and `keep_valid` is off (an upload is imported whole or not)."""
    refused = report.get("refused") or []
    if report.get("kept", 0) == 0:
        return {"outcome": "no task was kept, so no dataset version was created; the report says why"}
    if refused and not keep_valid:
        return {
            "outcome": f"{len(refused)} task(s) were refused, so nothing was stored (an upload is imported whole or "
            "not at all); fix them or import again keeping the valid ones"
        }
    dataset = Dataset.objects.filter(name=target).first()
    if dataset is None:
        dataset = dataset_create(
            name=target, kind=DatasetKind.REPO_TASKS, owner=user, description=f"Repository tasks ({origin})"
        )
    if dataset.kind != DatasetKind.REPO_TASKS:
        return {"outcome": f"not registered: {target!r} is now a {dataset.kind} dataset", "error": True}
    same = DatasetVersion.objects.filter(dataset=dataset, content_hash=hashlib.sha256(rows).hexdigest()).first()
    if same is not None:
        return {"version": same.pk, "dataset": dataset.pk, "outcome": f"identical tasks are already {same}; linked it"}
    try:
        version = repo_tasks_version_create(dataset=dataset, data=rows, created_by=user, notes=notes, report=report)
    except ValidationError as exc:
        return {"outcome": f"not registered: the dataset refused the rows ({exc.detail})", "error": True}
    return {"version": version.pk, "dataset": dataset.pk, "outcome": f"created {version}"}
