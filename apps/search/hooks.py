"""Registered when the app registry is ready (apps.common autodiscovers every app's `hooks` module): the run kinds
search owns, index builds and synthetic-task generation (apps.runs.kinds)."""

from __future__ import annotations

from apps.runs import kinds
from apps.runs.models import RunKind
from apps.search.services.datagen import datagen_finalize
from apps.search.services.indexes import index_finalize
from workers.specs import BuildIndexSpec, DatagenSpec

kinds.register(
    kinds.RunKindHandler(kind=RunKind.INDEX, app="search", job_spec=BuildIndexSpec, on_succeeded=index_finalize)
)
kinds.register(
    kinds.RunKindHandler(kind=RunKind.DATAGEN, app="search", job_spec=DatagenSpec, on_succeeded=datagen_finalize)
)
