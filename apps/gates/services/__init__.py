"""Deployment gates: gate a checkpoint on pinned benchmark versions, decide, approve, deploy, roll back.

The flow (Composer 2's "deploy only after CursorBench", as an auditable object):
1. `gate_evaluate` starts (or reuses) one eval per pinned benchmark version for the candidate checkpoint, and for
   the current deployment's checkpoint when there is one (the baseline of the no-regression rules), and records
   a GateCheck: the handle CI polls.
2. When every eval of a check has finished (`gate_check_advance`: gates subscribe to an eval run succeeding, and
   beat is the backstop), `workers.evals.gates.evaluate_rules` decides, and an immutable GateDecision stores every
   rule's inputs, statistic and verdict. A failed eval makes the check an `error` (an infrastructure problem, not
   a verdict).
3. A decision that passes outright becomes the deployment at once; one that waits for approval does when a user
   with the approve permission approves it (`gate_decision_approve`); a rejection is recorded the same way.
4. `deployment_rollback` makes the previous deployment current again, as a new, linked Deployment row.
Every decision, approval and deployment is announced by a signed webhook (`apps.webhooks`).

One module per seam: `gates` (rules, create, start a check), `checks` (decide a check), `deployments` (approve,
deploy, roll back); reads are in `apps.gates.selectors`.
"""

from apps.gates.services.checks import (
    gate_check_advance,
    gate_checks_advance_all,
    gate_checks_after_eval,
    gate_checks_for_eval,
)
from apps.gates.services.deployments import deploy, deployment_rollback, gate_decision_approve
from apps.gates.services.gates import gate_create, gate_evaluate, gate_rules_check

__all__ = [
    "deploy",
    "deployment_rollback",
    "gate_check_advance",
    "gate_checks_advance_all",
    "gate_checks_after_eval",
    "gate_checks_for_eval",
    "gate_create",
    "gate_decision_approve",
    "gate_evaluate",
    "gate_rules_check",
]
