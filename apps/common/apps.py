from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class CommonConfig(AppConfig):
    """What every app may use: error flattening, shared validators, the API routers, and the autodiscovery of every
    app's registrations. No models, and it imports no app."""

    name = "apps.common"
    label = "common"

    def ready(self) -> None:
        # Every app's registrations, imported once the app registry is ready (as django.contrib.admin finds each
        # app's `admin` module): `checks` (system checks), `schema` (OpenAPI extensions), `hooks` (run kinds,
        # lifecycle subscribers and ingest event stores, apps.runs.kinds). An app plugs in by having the module;
        # no app's AppConfig imports another app, and no import sits inside a function.
        autodiscover_modules("checks", "schema", "hooks")
