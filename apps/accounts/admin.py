from django.contrib import admin
from django.contrib.auth.admin import UserAdmin

from apps.accounts.models import ApiToken, User


@admin.register(User)
class CrucibleUserAdmin(UserAdmin):
    list_display = ("username", "email", "role", "is_active", "is_superuser")
    list_filter = ("role", "is_active", "is_superuser")
    # django-stubs types ModelAdmin.fieldsets as optional; UserAdmin sets it.
    fieldsets = (*UserAdmin.fieldsets, ("Crucible", {"fields": ("role",)}))  # type: ignore[misc]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "prefix", "scopes", "created_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at",)
    readonly_fields = ("prefix", "key_hash", "created_at", "last_used_at")
