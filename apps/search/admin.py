from django.contrib import admin

from apps.search.models import CorpusIndex


@admin.register(CorpusIndex)
class CorpusIndexAdmin(admin.ModelAdmin):
    list_display = ["id", "corpus_version", "config_hash", "run", "ready_at", "created_by", "created_at"]
    list_select_related = ["corpus_version__dataset", "run", "created_by"]
    readonly_fields = ["config", "config_hash", "storage_path", "uri", "run", "stats", "ready_at", "created_at"]
