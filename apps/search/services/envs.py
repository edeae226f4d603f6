"""What a launch must check and fill in for an environment that searches a corpus (`needs_corpus_index`):
the corpus version's ready index in `env_params.index_uri`, and that every chunk a task names exists in it.
Training, SFT and benchmarks call these; each refusal is a 400 naming the field and the fix."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rest_framework.exceptions import ValidationError

from apps.datasets.models import DatasetKind, DatasetVersion
from apps.search.selectors import ready_index_uri
from workers.envs.registry import get_environment
from workers.search.tools import referenced_doc_ids
from workers.search.types import also_in, doc_of, iter_chunks_jsonl


def with_index_uri(
    env_params: dict[str, Any], corpus_version: DatasetVersion | None, *, environment: str = "search"
) -> dict[str, Any]:
    """`env_params` with `index_uri` set to the ready index of `corpus_version` (400 naming `corpus_version` when it
    is missing, not a corpus, or has no index yet); `environment` names the environment in the message."""
    if corpus_version is None:
        raise ValidationError(
            {
                "corpus_version": [
                    f"environment '{environment}' needs corpus_version: the id of the corpus dataset version to search"
                ]
            }
        )
    if corpus_version.dataset.kind != DatasetKind.CORPUS:
        raise ValidationError(
            {"corpus_version": [f"{corpus_version} is a {corpus_version.dataset.kind} dataset, not a corpus"]}
        )
    return {**env_params, "index_uri": ready_index_uri(corpus_version)}


def corpus_chunk_ids(corpus_version: DatasetVersion) -> set[str]:
    """Every chunk id the corpus answers to: stored chunks and the ids of copies merged into a shared chunk."""
    with corpus_version.file.open("rb") as handle:
        return {ident for chunk in iter_chunks_jsonl(handle.read()) for ident in (chunk.chunk_id, *also_in(chunk))}


def corpus_missing_chunks(
    rows: Sequence[Any], corpus_version: DatasetVersion, *, environment: str, limit: int = 10
) -> list[str]:
    """One message per task row (up to `limit`) that names chunks `corpus_version` does not hold (the chunks the
    environment says a row references)."""
    env_cls = get_environment(environment)
    known = corpus_chunk_ids(corpus_version)
    documents = {doc_of(ident) for ident in known}
    problems: list[str] = []
    for index, row in enumerate(rows, start=1):
        missing = sorted(env_cls.referenced_chunk_ids(row) - known) if isinstance(row, dict) else []
        absent = sorted(referenced_doc_ids(row) - documents) if isinstance(row, dict) else []
        if missing:
            problems.append(
                f"task row {index} names chunk(s) not in {corpus_version}: {', '.join(missing[:5])}; "
                "generate the tasks from this corpus version or pick the one they came from"
            )
        elif absent:
            problems.append(
                f"task row {index} names document(s) not in {corpus_version}: {', '.join(absent[:5])}; pick the "
                "corpus version the tasks were imported with"
            )
        if len(problems) >= limit:
            break
    return problems
