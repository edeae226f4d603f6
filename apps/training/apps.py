from django.apps import AppConfig


class TrainingConfig(AppConfig):
    """Training, SFT warm-up and offline re-scoring runs: their launches, checks, resume and auto-eval."""

    name = "apps.training"
    label = "training"

    def ready(self) -> None:
        # Imported here, not at the top: models can be imported only once the app registry is ready.
        from apps.training.kinds import register_kinds

        register_kinds()
