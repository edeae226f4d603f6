"""The contamination guard: training data that overlaps a benchmark that gates deployments is refused (or, when
allowed, carried by the run as a flag)."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ValidationError

from apps.benchmarks.selectors import contamination_check
from apps.datasets.models import DatasetVersion


def contamination_guard(*, dataset_version: DatasetVersion, allow: bool) -> list[dict[str, Any]]:
    """Refuse training data that overlaps a gating benchmark (ValidationError naming the benchmark, its gates and
    the first overlapping tasks), or, with `allow`, return the findings for the run to carry as a flag."""
    found = contamination_check(dataset_version=dataset_version)
    if found and not allow:
        messages = []
        for item in found:
            why = "lists it as never-train-on data" if item["excluded"] else ""
            if item["overlapping_tasks"]:
                tasks = ", ".join(item["overlapping_tasks"][:10])
                more = len(item["overlapping_tasks"]) - 10
                why = (why + "; " if why else "") + f"shares {len(item['overlapping_tasks'])} tasks ({tasks}"
                why += f", and {more} more)" if more > 0 else ")"
            messages.append(
                f"{dataset_version} overlaps benchmark {item['benchmark']}, which gates {', '.join(item['gates'])}: "
                f"the benchmark {why}. Remove those tasks, or launch with allow_contamination to run it flagged"
            )
        raise ValidationError({"dataset_version": messages})
    return found
