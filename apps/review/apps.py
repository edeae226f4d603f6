from django.apps import AppConfig


class ReviewConfig(AppConfig):
    name = "apps.review"
    label = "review"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at the top: models can be imported only once the app registry is ready.
        from apps.review.ingest import store_flag_events
        from apps.runs.services import register_event_store

        register_event_store("flag", store_flag_events)
