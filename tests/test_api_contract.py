"""The API does what its OpenAPI schema says: schemathesis generates requests from /api/v1/schema/ (valid and
invalid ones, for every operation, then a few stateful sequences that follow the links between operations) and
checks every response, as an admin and as a viewer. A small budget; bench/api_fuzz.py is the long run.

The requests run in this thread against the WSGI app, so the data stays in the test's transaction. What must hold
and what is only counted: tests/contract.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from hypothesis.stateful import run_state_machine_as_test
from schemathesis import GenerationMode
from schemathesis.core.failures import Failure, FailureGroup

from apps.benchmarks.services import benchmark_import_humaneval
from tests.contract import Outcome, auth_headers, fuzz_token, in_test_transaction, load_schema, no_self_revoke, wsgi_app
from tests.factories import context1_version, trajectories_version

pytestmark = pytest.mark.django_db

EXAMPLES = 1  # generated cases per operation and mode (each sent as every role)
ROLES = ("admin", "viewer")
STATEFUL_SEQUENCES = 3
STATEFUL_STEPS = 5
FAST = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: a failure is recorded, not raised
    suppress_health_check=list(HealthCheck),
)


def _record(outcome: Outcome, case: Any, exc: BaseException) -> None:
    failures = exc.exceptions if isinstance(exc, FailureGroup) else [exc]
    for failure in failures:
        if isinstance(failure, Failure):
            check = _check_name(failure)
            outcome.record(check, f"{case.method} {case.formatted_path}: {failure.title}: {failure.message[:300]}")


def _check_name(failure: Failure) -> str:
    names = getattr(failure, "checks", ()) or ()
    return names[0] if names else type(failure).__name__


def _recording(machine: Any, outcome: Outcome) -> Any:
    """The schema's state machine (it follows the links between operations), recording failures instead of
    stopping at the first."""

    class Workflow(machine):  # type: ignore[misc,valid-type]
        def validate_response(self, response: Any, case: Any, *args: Any, **kwargs: Any) -> None:
            try:
                super().validate_response(response, case, *args, **kwargs)
            except (Failure, FailureGroup) as exc:
                _record(outcome, case, exc)

    return Workflow


@pytest.fixture
def data(users, trajectories_jsonl, run):  # type: ignore[no-untyped-def]
    """Some of everything the API lists, so generated ids and stateful links find rows."""
    admin = users["admin"]
    trajectories_version(owner=admin, data=trajectories_jsonl, name="contract-trajs")
    context1_version(owner=admin, name="contract-ctx1")
    benchmark_import_humaneval(owner=admin, name="contract-humaneval", limit=3)
    return run


@pytest.fixture
def app():  # type: ignore[no-untyped-def]
    with in_test_transaction():
        yield wsgi_app()


def test_the_api_does_what_its_schema_says(users, data, app) -> None:  # type: ignore[no-untyped-def]
    """Each generated case is sent as an admin and as a viewer; then stateful sequences as each."""
    roles = {role: fuzz_token(users[role]) for role in ROLES}
    schemas = {role: load_schema(app, secret) for role, (_, secret) in roles.items()}
    for role, (token_id, _) in roles.items():
        no_self_revoke(schemas[role], token_id)
    outcomes = {role: Outcome(role=role) for role in ROLES}

    for result in schemas["admin"].get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @FAST
            @given(case=operation.as_strategy(generation_mode=mode))
            def send(case: Any) -> None:
                for role, (_, secret) in roles.items():
                    try:
                        case.call_and_validate(headers=auth_headers(secret))
                    except (Failure, FailureGroup) as exc:
                        _record(outcomes[role], case, exc)

            try:
                send()
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE  # nothing in the operation can be made invalid

    for role, schema in schemas.items():
        run_state_machine_as_test(
            _recording(schema.as_state_machine(), outcomes[role]),
            settings=settings(FAST, max_examples=STATEFUL_SEQUENCES, stateful_step_count=STATEFUL_STEPS),
        )

    report = "\n\n".join(outcome.report() for outcome in outcomes.values())
    print(f"{sum(app.statuses.values())} requests: {app.statuses}\n{report}")
    assert sum(app.statuses.values()) > 300, report
    assert not any(outcome.contract_failures for outcome in outcomes.values()), report
