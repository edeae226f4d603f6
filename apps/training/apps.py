from django.apps import AppConfig


class TrainingConfig(AppConfig):
    """Training, SFT warm-up and offline re-scoring runs: their launches, checks, resume and auto-eval."""

    name = "apps.training"
    label = "training"
