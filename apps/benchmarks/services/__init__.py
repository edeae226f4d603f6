"""Writes for benchmarks (`benchmarks`), evals (`evals`) and the contamination guard (`contamination`)."""

from apps.benchmarks.services.benchmarks import (
    MAX_TASKS_PER_VERSION,
    benchmark_create,
    benchmark_import_humaneval,
    benchmark_rows_from_dataset,
    benchmark_version_create,
    benchmark_version_hash,
)
from apps.benchmarks.services.contamination import contamination_guard
from apps.benchmarks.services.evals import eval_auto, eval_config_hash, eval_finalize, eval_launch

__all__ = [
    "MAX_TASKS_PER_VERSION",
    "benchmark_create",
    "benchmark_import_humaneval",
    "benchmark_rows_from_dataset",
    "benchmark_version_create",
    "benchmark_version_hash",
    "contamination_guard",
    "eval_auto",
    "eval_config_hash",
    "eval_finalize",
    "eval_launch",
]
