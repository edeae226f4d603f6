from django.apps import AppConfig


class ReviewConfig(AppConfig):
    name = "apps.review"
    label = "review"
    default_auto_field = "django.db.models.BigAutoField"
