"""Review pages (under /review/, URL namespace "review"): the queues with their progress and each detector's
precision, the review page of one item (its trajectory with the detector's evidence marked, a label form with
keyboard shortcuts, then the next item), and what a confirmed hack leads to."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import Exists, OuterRef, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import NoReverseMatch, path, reverse
from django.views.decorators.http import require_POST
from rest_framework.exceptions import ValidationError

from apps.accounts.decorators import needs
from apps.accounts.models import Capability
from apps.accounts.permissions import request_user
from apps.common.errors import validation_messages
from apps.review import selectors, services
from apps.review.models import (
    DraftStatus,
    Flag,
    Label,
    QueueItem,
    ReviewAction,
    ReviewQueue,
    RewardDraft,
    Severity,
)
from apps.runs.models import Run, TrajectorySummary
from workers.detectors.registry import detectors

app_name = "review"


def _int_or_none(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


@needs(Capability.READ)
def queue_list(request: HttpRequest) -> HttpResponse:
    errors: list[str] = []
    if request.method == "POST":
        if not request_user(request).can(Capability.REVIEW):
            raise PermissionDenied("creating a queue needs the reviewer role")
        try:
            queue = services.queue_create(
                name=request.POST.get("name", "").strip(),
                run_id=_int_or_none(request.POST.get("run")),
                detector=request.POST.get("detector", ""),
                min_severity=request.POST.get("min_severity", ""),
                required_reviews=_int_or_none(request.POST.get("required_reviews")) or 0,
                lock_timeout_s=_int_or_none(request.POST.get("lock_timeout_s")) or 0,
                created_by=request_user(request),
            )
        except ValidationError as exc:
            errors = validation_messages(exc)
        else:
            messages.success(request, f"Queue {queue.name} created with {queue.items.count()} item(s).")
            return redirect("review:queue", queue_id=queue.pk)
    return render(
        request,
        "review/index.html",
        {
            "rows": selectors.queue_list(),
            "precision": selectors.detector_precision(),
            "drafts": RewardDraft.objects.filter(status=DraftStatus.DRAFT).select_related(
                "base_version__config", "created_by", "flag"
            ),
            "actions": ReviewAction.objects.select_related("actor", "flag")[:20],
            "detectors": list(detectors()),
            "severities": Severity.values,
            "errors": errors,
            "form": request.POST,
            "can_review": request_user(request).can(Capability.REVIEW),
        },
    )


@needs(Capability.READ)
def queue_detail(request: HttpRequest, queue_id: int) -> HttpResponse:
    queue = get_object_or_404(ReviewQueue.objects.select_related("run"), pk=queue_id)
    return render(request, "review/queue.html", {"queue": queue, "items": selectors.queue_items(queue)[:500]})


@require_POST
@needs(Capability.REVIEW)
def queue_sync(request: HttpRequest, queue_id: int) -> HttpResponse:
    queue = get_object_or_404(ReviewQueue, pk=queue_id)
    added = services.queue_sync(queue=queue)
    messages.info(request, f"{added} new item(s) queued in {queue.name}.")
    return redirect("review:queue", queue_id=queue.pk)


@require_POST
@needs(Capability.REVIEW)
def queue_next(request: HttpRequest, queue_id: int) -> HttpResponse:
    """Claim the next item (passing on `skip`, an item the reviewer holds) and open it."""
    queue = get_object_or_404(ReviewQueue, pk=queue_id)
    skip_id = _int_or_none(request.POST.get("skip"))
    skip = QueueItem.objects.filter(pk=skip_id, queue=queue).first() if skip_id else None
    item = services.queue_next(queue=queue, reviewer=request_user(request), skip=skip)
    if item is None:
        messages.info(request, f"Nothing left for you in {queue.name}: every open item is labelled by you or held.")
        target = reverse("review:queue", args=[queue.pk])
    else:
        target = reverse("review:item", args=[item.pk])
    if request.headers.get("HX-Request"):
        return HttpResponse(status=204, headers={"HX-Redirect": target})
    return redirect(target)


@needs(Capability.READ)
def item_detail(request: HttpRequest, item_id: int) -> HttpResponse:
    try:
        item = selectors.item_for_review(item_id)
    except QueueItem.DoesNotExist:
        raise Http404(f"there is no review item {item_id}")
    flag = item.flag
    try:
        trajectory_url = reverse("runs:trajectory", args=[flag.run_id, flag.trajectory_ref])
    except NoReverseMatch:  # an id the trajectory page's URL cannot carry (a "/" in it)
        trajectory_url = ""
    return render(
        request,
        "review/item.html",
        {
            "item": item,
            "trajectory_url": trajectory_url,
            "flag": flag,
            "view": selectors.evidence_view(item),
            "others": Flag.objects.filter(run_id=flag.run_id, trajectory_ref=flag.trajectory_ref).exclude(pk=flag.pk),
            "reviews": flag.reviews.select_related("reviewer").order_by("created_at"),
            "labels": Label.choices,
            "holds_lock": item.locked_by_id == request.user.pk,
            "can_review": request_user(request).can(Capability.REVIEW),
            **_flow_context(flag),
        },
    )


def _flow_context(flag: Flag) -> dict[str, object]:
    return {
        "confirmed": flag.reviews.filter(label=Label.CONFIRMED).exists(),
        "flag_actions": ReviewAction.objects.filter(flag=flag).select_related(
            "actor", "draft", "reward_version__config", "benchmark_version__benchmark", "exclusion__dataset"
        ),
    }


@require_POST
@needs(Capability.REVIEW)
def item_label(request: HttpRequest, item_id: int) -> HttpResponse:
    """Label the item; a confirmed hack stays on the page to act on it, any other label goes to the next item."""
    item = get_object_or_404(QueueItem.objects.select_related("queue", "flag"), pk=item_id)
    try:
        services.item_label(
            item=item,
            reviewer=request_user(request),
            label=request.POST.get("label", ""),
            note=request.POST.get("note", ""),
        )
    except ValidationError as exc:
        return render(
            request, "review/_label_result.html", {"errors": validation_messages(exc), "item": item}, status=400
        )
    if request.POST.get("label") != Label.CONFIRMED:
        following = services.queue_next(queue=item.queue, reviewer=request_user(request))
        target = (
            reverse("review:item", args=[following.pk]) if following else reverse("review:queue", args=[item.queue_id])
        )
        if request.headers.get("HX-Request"):
            return HttpResponse(status=204, headers={"HX-Redirect": target})
        return redirect(target)
    context = {"item": item, "flag": item.flag, "labelled": True, **_flow_context(item.flag)}
    if request.headers.get("HX-Request"):
        return render(request, "review/_label_result.html", context)
    return redirect("review:item", item_id=item.pk)


@require_POST
@needs(Capability.REVIEW)
def flag_act(request: HttpRequest, flag_id: int, what: str) -> HttpResponse:
    """One flow-back action from a confirmed hack: `draft` a reward change, `promote` the task to a benchmark,
    `exclude` it from training. Returns the actions panel."""
    flag = get_object_or_404(Flag.objects.select_related("run__reward_version", "trajectory"), pk=flag_id)
    user = request_user(request)
    errors: list[str] = []
    try:
        if what == "draft":
            services.reward_draft_create(flag=flag, created_by=user)
        elif what == "promote":
            services.task_promote(
                flag=flag,
                benchmark_name=request.POST.get("benchmark", "").strip(),
                task_id=request.POST.get("task_id", "").strip(),
                user=user,
            )
        elif what == "exclude":
            services.task_exclude(flag=flag, user=user, task_id=request.POST.get("task_id", "").strip())
        else:
            raise Http404(f"unknown action {what!r}: draft, promote or exclude")
    except ValidationError as exc:
        errors = validation_messages(exc)
    item_id = _int_or_none(request.POST.get("item"))
    item = QueueItem.objects.filter(pk=item_id).first() if item_id is not None else None
    context = {"flag": flag, "item": item, "errors": errors, **_flow_context(flag)}
    return render(request, "review/_flow.html", context, status=400 if errors else 200)


@require_POST
@needs(Capability.LAUNCH)
def draft_decide(request: HttpRequest, draft_id: int, decision: str) -> HttpResponse:
    if decision not in ("accept", "discard"):
        raise Http404(f"a draft is accepted or discarded, not {decision!r}")
    draft = get_object_or_404(RewardDraft, pk=draft_id)
    try:
        if decision == "accept":
            draft = services.reward_draft_accept(draft=draft, user=request_user(request))
            messages.success(request, f"Draft {draft.pk} accepted: {draft.result_version} created.")
        else:
            services.reward_draft_discard(draft=draft, user=request_user(request))
            messages.info(request, f"Draft {draft.pk} discarded.")
    except ValidationError as exc:
        for error in validation_messages(exc):
            messages.error(request, error)
    return redirect("review:list")


PAGE = 100


ORDERS = {"reward": "-reward", "-reward": "reward", "step": "step", "-step": "-step", "recent": "-id"}


def _number(raw: str | None, name: str, errors: list[str], cast: type = float) -> Any:
    if raw in (None, ""):
        return None
    try:
        return cast(raw)
    except ValueError:
        errors.append(f"{name}: {raw!r} is not a number")
        return None


def trajectory_filter(run: Run, params: Any, errors: list[str]) -> QuerySet[TrajectorySummary]:
    """The run's trajectory summaries matching task (substring), reward range, step and flag filters."""
    qs = TrajectorySummary.objects.filter(run=run)
    if task := (params.get("task") or "").strip():
        qs = qs.filter(task_id__icontains=task)
    low = _number(params.get("min_reward"), "min_reward", errors)
    high = _number(params.get("max_reward"), "max_reward", errors)
    step = _number(params.get("step"), "step", errors, int)
    if low is not None:
        qs = qs.filter(reward__gte=low)
    if high is not None:
        qs = qs.filter(reward__lte=high)
    if step is not None:
        qs = qs.filter(step=step)
    flag = (params.get("flag") or "").strip()
    if flag:
        flags = Flag.objects.filter(run=run, trajectory_ref=OuterRef("trajectory_id"))
        if flag == "none":
            qs = qs.filter(~Exists(flags))
        else:
            qs = qs.filter(Exists(flags if flag == "any" else flags.filter(detector=flag)))
    return qs


@needs(Capability.READ)
def trajectory_browser(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(Run, pk=run_id)
    errors: list[str] = []
    qs = trajectory_filter(run, request.GET, errors)
    order = request.GET.get("order", "recent")
    qs = qs.order_by(ORDERS.get(order, "-id"), "-id")
    page = _number(request.GET.get("page"), "page", errors, int) or 1
    page = max(1, page)
    # No COUNT over a million rows: fetch one row more than a page to know whether there is a next one.
    rows = list(qs[(page - 1) * PAGE : page * PAGE + 1])
    more = len(rows) > PAGE
    rows = rows[:PAGE]
    flags_by_ref: dict[str, list[Flag]] = {}
    for flag in Flag.objects.filter(run=run, trajectory_ref__in=[r.trajectory_id for r in rows]).only(
        "trajectory_ref", "detector", "severity"
    ):
        flags_by_ref.setdefault(flag.trajectory_ref, []).append(flag)
    detectors = sorted(Flag.objects.filter(run=run).values_list("detector", flat=True).distinct())
    query = request.GET.copy()
    query.pop("page", None)
    return render(
        request,
        "runs/trajectories.html",
        {
            "run": run,
            "rows": [(row, flags_by_ref.get(row.trajectory_id, [])) for row in rows],
            "errors": errors,
            "page": page,
            "more": more,
            "detectors": detectors,
            "params": request.GET,
            "query": query.urlencode(),
            "order": order,
        },
    )


urlpatterns = [
    path("review/", queue_list, name="list"),
    path("review/queues/<int:queue_id>/", queue_detail, name="queue"),
    path("review/queues/<int:queue_id>/sync/", queue_sync, name="queue-sync"),
    path("review/queues/<int:queue_id>/next/", queue_next, name="queue-next"),
    path("review/items/<int:item_id>/", item_detail, name="item"),
    path("review/items/<int:item_id>/label/", item_label, name="item-label"),
    path("review/flags/<int:flag_id>/<str:what>/", flag_act, name="flag-act"),
    path("review/drafts/<int:draft_id>/<str:decision>/", draft_decide, name="draft-decide"),
    # The trajectory browser filters a run's trajectories by their flags, so review serves it, under the run's URL.
    path("runs/<int:run_id>/trajectories/", trajectory_browser, name="trajectories"),
]
