from django.apps import AppConfig


class CommonConfig(AppConfig):
    """What every app may use: error flattening, the page capability guard, shared validators. No models."""

    name = "apps.common"
    label = "common"
