"""Real-time RL loop pages (namespace "loops"): every gate's loop, and one loop's cycles as a timeline of phases
with their durations, the sessions and tokens each collected, their reward and edit-kept rate, the eval deltas and
the gate's verdict, and the median cycle time (Cursor: about five hours)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path
from django.views.decorators.http import require_POST

from apps.accounts.decorators import needs
from apps.accounts.models import Capability
from apps.accounts.permissions import request_user
from apps.realtime.models import Cycle, Loop
from apps.realtime.selectors import cycle_signal_rates, median_cycle_seconds, phase_durations
from apps.realtime.services.loops import loop_set_paused

app_name = "loops"


@needs(Capability.READ)
def loop_list(request: HttpRequest) -> HttpResponse:
    loops = Loop.objects.select_related("gate", "serve_run").order_by("gate__name")
    rows = [{"loop": loop, "latest": loop.cycles.order_by("-number").first()} for loop in loops]
    return render(request, "realtime/loops.html", {"rows": rows})


def _timeline(cycle: Cycle) -> list[dict[str, Any]]:
    phases = phase_durations(cycle)
    total = sum(p["seconds"] or 0.0 for p in phases) or 1.0
    return [{**p, "width": max(2.0, 100.0 * (p["seconds"] or 0.0) / total)} for p in phases]


@needs(Capability.READ)
def loop_detail(request: HttpRequest, loop_id: int) -> HttpResponse:
    loop = get_object_or_404(Loop.objects.select_related("gate", "serve_run", "reward_version"), pk=loop_id)
    cycles = list(loop.cycles.select_related("gate_check__decision", "deployment").order_by("-number")[:100])
    rows: list[dict[str, Any]] = [
        {"cycle": c, "timeline": _timeline(c), "rates": cycle_signal_rates(c)} for c in cycles
    ]
    chart = [
        {"x": r["cycle"].number, "reward": r["cycle"].reward_mean, "kept": r["rates"]["edit_kept"]["rate"]}
        for r in reversed(rows)
    ]
    return render(
        request,
        "realtime/loop.html",
        {"loop": loop, "rows": rows, "median": median_cycle_seconds(loop), "chart": chart},
    )


@needs(Capability.ADMIN)
@require_POST
def loop_pause(request: HttpRequest, loop_id: int) -> HttpResponse:
    loop = get_object_or_404(Loop, pk=loop_id)
    loop_set_paused(loop=loop, user=request_user(request), paused=request.POST.get("paused") != "0")
    return redirect("loops:detail", loop_id=loop.pk)


urlpatterns = [
    path("loops/", loop_list, name="list"),
    path("loops/<int:loop_id>/", loop_detail, name="detail"),
    path("loops/<int:loop_id>/pause/", loop_pause, name="pause"),
]
