from django.apps import AppConfig


class CodingConfig(AppConfig):
    name = "apps.coding"
    label = "coding"
    verbose_name = "Coding agent (Composer): repository tasks, their generation and import"
