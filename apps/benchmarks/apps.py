from django.apps import AppConfig


class BenchmarksConfig(AppConfig):
    name = "apps.benchmarks"
    label = "benchmarks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at the top: models can be imported only once the app registry is ready.
        from apps.benchmarks.kinds import register_kinds

        register_kinds()
