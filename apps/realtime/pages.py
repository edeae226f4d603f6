"""Real-time RL pages (namespace "realtime"): the session browser and a session (its turns as a chat with tool
calls, token counts, latency and the policy version of each turn, and its feedback), and the serving runs with a
serving run's panel (its endpoint, what it serves, the A/B table, recent sessions and simulate runs).

The loops and cycles pages are the lead's (apps.realtime.pages_loops)."""

from __future__ import annotations

import json
import re
from datetime import date, timedelta
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path
from django.views.decorators.http import require_POST
from rest_framework.exceptions import ValidationError

from apps.accounts.decorators import needs
from apps.accounts.models import Capability
from apps.common.errors import validation_messages
from apps.gates.models import Deployment
from apps.realtime import selectors
from apps.realtime.api import SessionFilters
from apps.realtime.models import SessionTurn
from apps.realtime.services.serving import serve_endpoint_url, serve_split_update

SESSIONS_PER_PAGE = 50
RECENT_SESSIONS = 15
DAY = re.compile(r"\d{4}-\d{2}-\d{2}")
FILTERS = ("serve_run", "deployment", "policy_version", "has_feedback", "since", "until", "arm", "user", "session_id")


def _filters(query: Any) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """(checked filters for the selector, the raw values to refill the form, errors naming a bad filter)."""
    raw = {name: str(query.get(name, "")).strip() for name in FILTERS if str(query.get(name, "")).strip()}
    data = dict(raw)
    for name in ("since", "until"):  # the form's date inputs: a whole day, `until` included
        if DAY.fullmatch(data.get(name, "")):
            try:
                day = date.fromisoformat(data[name]) + timedelta(days=int(name == "until"))
            except ValueError:
                continue  # the check below names it
            data[name] = f"{day.isoformat()}T00:00:00Z"
    checked = SessionFilters(data=data)
    if checked.is_valid():
        return dict(checked.validated_data), raw, []
    return {}, raw, validation_messages(ValidationError(checked.errors))


@needs(Capability.READ)
def session_list(request: HttpRequest) -> HttpResponse:
    filters, raw, errors = _filters(request.GET)
    paginator = Paginator(selectors.session_list(**filters), SESSIONS_PER_PAGE)
    page = paginator.get_page(request.GET.get("page"))
    context = {
        "page": page,
        "filters": raw,
        "errors": errors,
        "query": urlencode(raw),
        "serve_runs": selectors.serve_runs().select_related(None).only("pk", "name")[:50],
    }
    template = "realtime/sessions_table.html" if request.headers.get("HX-Request") else "realtime/sessions.html"
    return render(request, template, context)


def _chat(turns: list[SessionTurn]) -> list[dict[str, Any]]:
    """Each turn with the messages it added to the conversation (the request repeats the history: only what is new
    since the previous turn's request and reply is shown) and its reply's tool calls as (name, arguments)."""
    shown: list[dict[str, Any]] = []
    previous: list[Any] = []
    for turn in turns:
        messages_in = turn.messages if isinstance(turn.messages, list) else []
        seen = len(previous) + 1 if previous and messages_in[: len(previous)] == previous else 0
        response = turn.response if isinstance(turn.response, dict) else {}
        calls = []
        for call in response.get("tool_calls") or []:
            function = (call or {}).get("function") or {}
            arguments = function.get("arguments", "")
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments)
            calls.append({"name": function.get("name", "?"), "arguments": arguments})
        shown.append(
            {
                "turn": turn,
                "new_messages": [_message(m) for m in messages_in[seen:]],
                "reply": str(response.get("content") or ""),
                "tool_calls": calls,
            }
        )
        previous = messages_in
    return shown


def _message(message: Any) -> dict[str, str]:
    if not isinstance(message, dict):
        return {"role": "?", "content": str(message)}
    content = message.get("content")
    if isinstance(content, list):  # content parts: keep the text ones
        content = "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    calls = message.get("tool_calls") or []
    if calls and not content:
        content = "; ".join(f"{(c.get('function') or {}).get('name')}(…)" for c in calls if isinstance(c, dict))
    return {"role": str(message.get("role", "?")), "content": str(content or "")}


@needs(Capability.READ)
def session_detail(request: HttpRequest, pk: int) -> HttpResponse:
    session = selectors.session_detail(pk)
    if session is None:
        raise Http404(f"session {pk} does not exist")
    turns = list(session.turns.all())
    return render(
        request,
        "realtime/session.html",
        {
            "session": session,
            "chat": _chat(turns),
            "feedback": list(session.feedback.all()),
            "latency_total": sum(turn.latency_ms for turn in turns),
        },
    )


@needs(Capability.READ)
def serving_list(request: HttpRequest) -> HttpResponse:
    runs = list(selectors.serve_runs()[:100])
    for run in runs:
        run.endpoint = serve_endpoint_url(run)  # type: ignore[attr-defined]
    return render(request, "realtime/serve_list.html", {"runs": runs})


def _serving_context(run_id: int) -> dict[str, Any]:
    run = get_object_or_404(selectors.serve_runs(), pk=run_id)
    return {
        "run": run,
        "endpoint": serve_endpoint_url(run),
        "target": selectors.serve_target(run),
        "ab": selectors.ab_stats(run),
        "recent": selectors.session_list(serve_run=run.pk)[:RECENT_SESSIONS],
        "simulations": selectors.simulate_runs_of(run)[:20],
        "deployments": Deployment.objects.select_related("gate", "checkpoint").order_by("-created_at")[:50],
    }


@needs(Capability.READ)
def serving_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    context = _serving_context(run_id)
    if request.headers.get("HX-Request"):  # the panel's own refresh
        return render(request, "realtime/serve_panel.html", context)
    return render(request, "realtime/serve.html", context)


@needs(Capability.LAUNCH)
@require_POST
def serving_split(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(selectors.serve_runs(), pk=run_id)
    deployment = request.POST.get("deployment", "").strip()
    try:
        ab = None
        if deployment:
            ab = {
                "deployment": int(deployment) if deployment.isdigit() else deployment,
                "share": float(request.POST.get("share") or 0.5),
            }
        serve_split_update(run=run, ab=ab)
    except (ValueError, ValidationError) as exc:
        problems = validation_messages(exc) if isinstance(exc, ValidationError) else [f"share: {exc}"]
        for problem in problems:
            messages.error(request, problem)
    else:
        messages.success(request, "A/B split ended" if ab is None else f"arm b now serves deployment {deployment}")
    return redirect("realtime:serving", run_id=run.pk)


urlpatterns = [
    path("sessions/", session_list, name="sessions"),
    path("sessions/<int:pk>/", session_detail, name="session"),
    path("serving/", serving_list, name="serving-list"),
    path("serving/<int:run_id>/", serving_detail, name="serving"),
    path("serving/<int:run_id>/split/", serving_split, name="serving-split"),
]

app_name = "realtime"
