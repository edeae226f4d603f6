"""Registered when the app registry is ready (apps.common autodiscovers every app's `hooks` module): the run kinds
this app owns, importing repository tasks and generating them (apps.runs.kinds)."""

from __future__ import annotations

from apps.coding.services import CODEGEN, REPOIMPORT, REPOMINE, repo_tasks_finalize
from apps.runs import kinds
from workers.specs import CodegenSpec, RepoImportSpec, RepoMineSpec

kinds.register(
    kinds.RunKindHandler(kind=REPOIMPORT, app="coding", job_spec=RepoImportSpec, on_succeeded=repo_tasks_finalize)
)
kinds.register(kinds.RunKindHandler(kind=CODEGEN, app="coding", job_spec=CodegenSpec, on_succeeded=repo_tasks_finalize))
kinds.register(
    kinds.RunKindHandler(kind=REPOMINE, app="coding", job_spec=RepoMineSpec, on_succeeded=repo_tasks_finalize)
)
