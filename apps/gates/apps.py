from django.apps import AppConfig


class GatesConfig(AppConfig):
    name = "apps.gates"
    label = "gates"
    default_auto_field = "django.db.models.BigAutoField"
