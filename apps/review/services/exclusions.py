"""The exclusion guard: training and SFT refuse a dataset version holding tasks reviewers excluded, unless allowed."""

from __future__ import annotations

import json
from collections.abc import Sequence

from rest_framework.exceptions import ValidationError

from apps.datasets.models import DatasetVersion
from apps.review.models import (
    TaskExclusion,
)


def excluded_tasks_in(dataset_version: DatasetVersion) -> list[str]:
    """The task ids of `dataset_version` excluded from training (sorted); [] without reading the file when its
    dataset has no exclusions."""
    excluded = set(
        TaskExclusion.objects.filter(dataset_id=dataset_version.dataset_id).values_list("task_id", flat=True)
    )
    if not excluded:
        return []
    found: set[str] = set()
    with dataset_version.file.open("rb") as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and str(row.get("id")) in excluded:
                found.add(str(row["id"]))
    return sorted(found)


def task_exclusion_guard(*, dataset_version: DatasetVersion, allow: bool) -> list[str]:
    """Refuse training on a dataset version holding excluded tasks (a 400 naming them), or, with `allow`, return
    them for the run's spec to record."""
    found = excluded_tasks_in(dataset_version)
    if found and not allow:
        shown: Sequence[str] = found[:20]
        more = f" and {len(found) - 20} more" if len(found) > 20 else ""
        raise ValidationError(
            {
                "dataset_version": [
                    f"{dataset_version} holds {len(found)} task(s) excluded from training after review: "
                    f"{', '.join(shown)}{more}. Upload a version without them, or launch with allow_excluded"
                ]
            }
        )
    return found
