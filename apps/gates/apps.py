from django.apps import AppConfig


class GatesConfig(AppConfig):
    name = "apps.gates"
    label = "gates"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at the top: models can be imported only once the app registry is ready.
        from apps.gates.services import gate_checks_after_eval
        from apps.runs import kinds
        from apps.runs.models import RunKind

        # A finished eval decides the checks waiting on it at once; the 5-second beat task stays the backstop.
        kinds.subscribe(RunKind.EVAL, "succeeded", "gates.advance_checks", gate_checks_after_eval)
