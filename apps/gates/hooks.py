"""Registered when the app registry is ready (apps.common autodiscovers every app's `hooks` module)."""

from apps.gates.services import gate_checks_after_eval
from apps.runs import kinds
from apps.runs.models import RunKind

# A finished eval decides the checks waiting on it at once; the 5-second beat task stays the backstop.
kinds.subscribe(RunKind.EVAL, "succeeded", "gates.advance_checks", gate_checks_after_eval)
