from django.apps import AppConfig


class SearchConfig(AppConfig):
    name = "apps.search"
    label = "search"
    verbose_name = "Search (Context-1): indexes and synthetic tasks"

    def ready(self) -> None:
        # Imported here, not at the top: models can be imported only once the app registry is ready.
        from apps.search.kinds import register_kinds

        register_kinds()
