from django.contrib import admin
from django.http import HttpRequest

from apps.datasets.models import Dataset, DatasetVersion


class DatasetVersionInline(admin.TabularInline):
    model = DatasetVersion
    extra = 0
    readonly_fields = ("number", "file", "row_count", "size_bytes", "content_hash", "created_by", "created_at")
    can_delete = False


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = ("name", "kind", "owner", "created_at")
    list_filter = ("kind",)
    search_fields = ("name", "description")
    inlines = [DatasetVersionInline]


@admin.register(DatasetVersion)
class DatasetVersionAdmin(admin.ModelAdmin):
    list_display = ("__str__", "row_count", "size_bytes", "content_hash", "created_by", "created_at")
    list_filter = ("dataset__kind",)
    # A version is immutable: its file, hash and counts are set by dataset_version_create, never edited here.
    readonly_fields = (
        "dataset",
        "number",
        "file",
        "content_hash",
        "row_count",
        "size_bytes",
        "validation_report",
        "created_by",
        "created_at",
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # uploads go through the API or the dataset page, which validate the file
