"""Is a repository task sound? Its hidden tests must fail on the snapshot and pass with the reference patch.

    verification = verify_task(task, snapshot)
    if not verification.ok:
        refuse(task, verification.reason)   # one sentence a user can act on

The checks, in order (the first that fails is the reason):
0. the task has a reference patch: without one nothing can show that its hidden tests are passable, so it is
   refused, naming the field and the way out, unless the task says `"unverified": true` (then checks 2 only run,
   `Verification.after` is None and `Verification.verified` is False: the caller stores it marked unverified);
1. the reference patch applies to the snapshot (cheap, so first): "the reference patch does not apply: ...";
2. before: on the snapshot, no fail_to_pass test passes; one that does makes the task vacuous (nothing to fix),
   and the reason lists those ids;
3. after: with the reference patch, every fail_to_pass and every pass_to_pass test passes; the reason lists those
   that did not, with their outcomes (a node id that names no test shows as "missing" here).
pass_to_pass tests are not required to pass before: a task may record tests that only the fix makes collectable.
"""

from __future__ import annotations

from dataclasses import dataclass

from workers.coding.execute import CommandLimits
from workers.coding.hidden_tests import TestReport, run_hidden_tests
from workers.coding.patches import PatchError, apply_patch
from workers.coding.task import RepoTask
from workers.coding.workspace import Snapshot, Workspace

_SHOWN = 5


@dataclass
class Verification:
    ok: bool
    reason: str  # "" when ok, else one sentence
    before: TestReport | None = None  # the hidden tests on the snapshot
    after: TestReport | None = None  # ... with the reference patch applied

    @property
    def verified(self) -> bool:
        """Shown solvable: ok, and the hidden tests passed with the reference patch (False for a task kept as
        `unverified`)."""
        return self.ok and self.after is not None


NO_PATCH = (
    "no reference patch (field 'reference_patch' is missing or empty), so nothing shows that its hidden tests can "
    'pass; add the patch that makes them pass, or set "unverified": true to store the task marked unverified '
    "(a deployment gate refuses a benchmark holding it)"
)


def _listing(outcomes: dict[str, str]) -> str:
    items = [f"{node_id} ({outcome})" for node_id, outcome in list(outcomes.items())[:_SHOWN]]
    more = len(outcomes) - _SHOWN
    return ", ".join(items) + (f" and {more} more" if more > 0 else "")


def verify_task(task: RepoTask, snapshot: Snapshot, *, limits: CommandLimits | None = None) -> Verification:
    """Check `task` against its `snapshot` in the sandbox (two hidden-test runs at most)."""
    if snapshot.sha256 != task.snapshot.sha256:
        return Verification(
            False,
            f"the snapshot given holds content hash {snapshot.sha256}, not the task's {task.snapshot.sha256}",
        )
    if task.reference_patch is None and not task.unverified:
        return Verification(False, NO_PATCH)
    patched: Workspace | None = None
    if task.reference_patch is not None:
        patched = Workspace(snapshot)
        try:
            apply_patch(patched, task.reference_patch)
        except PatchError as exc:
            return Verification(False, f"the reference patch does not apply: {exc}")
    before = run_hidden_tests(Workspace(snapshot), task.hidden_tests, limits=limits)
    already = {
        node_id: outcome
        for node_id, outcome in before.outcomes.items()
        if node_id in task.hidden_tests.fail_to_pass and outcome == "passed"
    }
    if already:
        return Verification(
            False,
            f"vacuous task: fail_to_pass test(s) already pass on the snapshot: {_listing(already)}; list only tests "
            "that the change must fix",
            before=before,
        )
    if patched is None:
        return Verification(True, "", before=before)
    after = run_hidden_tests(patched, task.hidden_tests, limits=limits)
    failing = after.not_passed(task.hidden_tests.node_ids)
    if failing:
        why = f" ({after.detail})" if after.detail else ""
        return Verification(
            False,
            f"with the reference patch applied, hidden test(s) do not pass: {_listing(failing)}{why}",
            before=before,
            after=after,
        )
    return Verification(True, "", before=before, after=after)
