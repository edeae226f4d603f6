"""Registered when the app registry is ready (apps.common autodiscovers every app's `hooks` module): the run kind
benchmarks owns, evals (apps.runs.kinds)."""

from __future__ import annotations

from apps.benchmarks.services import eval_finalize
from apps.benchmarks.services.learning import learning_after_eval
from apps.benchmarks.services.suites import codegen_heldout_benchmark
from apps.runs import kinds
from apps.runs.models import RunKind
from workers.specs import EvalSpec

kinds.register(kinds.RunKindHandler(kind=RunKind.EVAL, app="benchmarks", job_spec=EvalSpec, on_succeeded=eval_finalize))
# A finished eval updates the held-out verdict of the training runs it is a side of (docs/did-it-learn.md).
kinds.subscribe(RunKind.EVAL, "succeeded", "benchmarks.learning", learning_after_eval)
# A generation run that asks for a held-out benchmark gets one once its tasks are registered (the owner's hook).
kinds.subscribe("codegen", "succeeded", "benchmarks.heldout", codegen_heldout_benchmark)
kinds.subscribe("repomine", "succeeded", "benchmarks.heldout", codegen_heldout_benchmark)
