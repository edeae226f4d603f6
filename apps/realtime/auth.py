"""Who may post session feedback, besides a user (API token with the serve scope, or a signed-in session): a
simulate run, with its own run token (`Authorization: Bearer cri_<run id>_<hex>`), for the sessions of the serving
run it plays against. Only the feedback endpoint installs this authentication."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rest_framework.authentication import BaseAuthentication
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import BasePermission

from apps.accounts.authentication import bearer_secret
from apps.accounts.models import Capability
from apps.accounts.permissions import request_capabilities
from apps.realtime.services.serving import RunTokenError, simulate_run_for_token
from apps.runs.models import Run


@dataclass(frozen=True)
class SimulateRunCredential:
    """request.auth of a simulate run's token: the run, and the serving run whose sessions it may give feedback on."""

    run: Run

    @property
    def serve_run_id(self) -> int | None:
        serve_run = self.run.spec.get("serve_run")
        return int(serve_run) if isinstance(serve_run, int) else None


class SimulateRunAuthentication(BaseAuthentication):
    """`Authorization: Bearer cri_...` of an active simulate run: request.user is the run's owner, request.auth a
    SimulateRunCredential (so permissions can tell it from the owner's own credentials)."""

    def authenticate(self, request: Any) -> tuple[Any, SimulateRunCredential] | None:
        secret = bearer_secret(request)
        if secret is None or not secret.startswith("cri_"):
            return None
        try:
            run = simulate_run_for_token(secret)
        except RunTokenError as exc:
            raise AuthenticationFailed(str(exc)) from None
        return run.created_by, SimulateRunCredential(run=run)

    def authenticate_header(self, request: Any) -> str:
        return "Bearer"


class CanPostFeedback(BasePermission):
    """A simulate run's token, or a user whose role (and token scopes) hold `serve`."""

    message = "posting feedback needs the serve capability (an API token with the 'serve' scope)"

    def has_permission(self, request: Any, view: Any) -> bool:
        if isinstance(request.auth, SimulateRunCredential):
            return True
        return Capability.SERVE in request_capabilities(request)
