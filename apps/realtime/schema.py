"""OpenAPI extensions (autodiscovered by apps.common): the simulate run token the feedback endpoint also takes."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema


class SimulateRunTokenScheme(OpenApiAuthenticationExtension):
    target_class = "apps.realtime.auth.SimulateRunAuthentication"
    name = "simulateRunToken"

    def get_security_definition(self, auto_schema: AutoSchema) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A simulate run's own run token (cri_...): feedback on the sessions of its serving run",
        }
