from django.contrib import admin

from apps.realtime.models import Feedback, Session, SessionTurn


class TurnInline(admin.TabularInline):
    model = SessionTurn
    fields = ("turn_index", "request_id", "policy_version", "arm", "latency_ms", "finish_reason", "created_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True


class FeedbackInline(admin.TabularInline):
    model = Feedback
    fields = ("event_id", "signal", "value", "turn_index", "text", "user", "run", "created_at")
    readonly_fields = fields
    extra = 0
    can_delete = False


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    list_display = (
        "client_session_id",
        "serve_run",
        "user",
        "arm",
        "deployment",
        "last_policy_version",
        "num_turns",
        "reward",
        "last_turn_at",
    )
    list_filter = ("arm",)
    search_fields = ("client_session_id", "task_type")
    raw_id_fields = ("serve_run", "user", "token", "deployment", "cycle", "reward_version")
    readonly_fields = (
        "num_turns",
        "prompt_tokens",
        "completion_tokens",
        "feedback_counts",
        "started_at",
        "last_turn_at",
    )
    inlines = [TurnInline, FeedbackInline]


@admin.register(SessionTurn)
class SessionTurnAdmin(admin.ModelAdmin):
    list_display = ("session", "turn_index", "request_id", "policy_version", "arm", "latency_ms", "created_at")
    search_fields = ("request_id",)
    raw_id_fields = ("session", "serve_run", "deployment")


@admin.register(Feedback)
class FeedbackAdmin(admin.ModelAdmin):
    list_display = ("session", "event_id", "signal", "value", "turn_index", "user", "run", "created_at")
    list_filter = ("signal",)
    search_fields = ("event_id", "session__client_session_id")
    raw_id_fields = ("session", "user", "run")
