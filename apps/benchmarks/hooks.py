"""Registered when the app registry is ready (apps.common autodiscovers every app's `hooks` module): the run kind
benchmarks owns, evals (apps.runs.kinds)."""

from __future__ import annotations

from apps.benchmarks.services import eval_finalize
from apps.benchmarks.services.suites import codegen_heldout_benchmark
from apps.runs import kinds
from apps.runs.models import RunKind
from workers.jobs.specs import EvalSpec

kinds.register(kinds.RunKindHandler(kind=RunKind.EVAL, app="benchmarks", job_spec=EvalSpec, on_succeeded=eval_finalize))
# A generation run that asks for a held-out benchmark gets one once its tasks are registered (the owner's hook).
kinds.subscribe("codegen", "succeeded", "benchmarks.heldout", codegen_heldout_benchmark)
