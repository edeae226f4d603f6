"""Writes for sessions: the `session_turn` ingest store and feedback.

`session_turns_store` is the ingest store of `session_turn` events (apps.runs.services.ingest, registered in
apps.realtime.hooks): it runs inside the batch's transaction under the serving run's row lock, so two batches of one
run never race. Each turn is stored once per (serve run, request id); a repeat (a replayed spool) adds nothing.
The sessions a batch touches are upserted, then their roll-ups (turns, tokens, first and last policy version, arm
and deployment of the first turn, first and last time) are recomputed from their stored turns, so turns arriving
out of order still leave the right first and last.

`feedback_create` stores one typed signal (workers.session_records.FeedbackIn) about a session, once per
(session, event id), within `CRUCIBLE_FEEDBACK_WINDOW_HOURS` of the session's last turn, about one of its turns
(or the whole session). An event id repeated with other content is a conflict, never silently dropped.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.accounts.models import ApiToken, User
from apps.gates.models import Deployment
from apps.realtime.models import Feedback, Session, SessionTurn
from apps.realtime.services.serving import SERVE
from apps.runs.models import Run
from apps.runs.services import IngestContext
from workers.session_records import FeedbackIn

log = logging.getLogger(__name__)


def _when(unix_seconds: float) -> datetime:
    return datetime.fromtimestamp(unix_seconds, tz=UTC)


def session_turns_store(context: IngestContext, events: list[Any]) -> None:
    """The `session_turn` store: new turns of a serving run, once per request id, and their sessions' roll-ups."""
    if not events:
        return
    run = context.run
    if run.kind != SERVE:
        # Kept in the run's event ledger like every event; only a serving run's turns make sessions.
        log.warning(
            "run %s (%s) sent %d session_turn event(s); only serve runs record sessions", run.pk, run.kind, len(events)
        )
        return
    by_request: dict[str, Any] = {}
    for event in events:
        by_request.setdefault(event.turn.request_id, event)
    stored = set(
        SessionTurn.objects.filter(serve_run=run, request_id__in=list(by_request)).values_list("request_id", flat=True)
    )
    fresh = [event for request_id, event in by_request.items() if request_id not in stored]
    if not fresh:
        return
    sessions = _sessions_for(run, fresh)
    deployments = _known_deployments({e.turn.deployment_id for e in fresh if e.turn.deployment_id is not None})
    SessionTurn.objects.bulk_create(
        [
            SessionTurn(
                session_id=sessions[event.session_id],
                serve_run=run,
                turn_index=event.turn.turn_index,
                request_id=event.turn.request_id,
                messages=event.turn.messages,
                tools=event.turn.tools,
                response=event.turn.response,
                prompt_token_ids=event.turn.prompt_token_ids,
                completion_token_ids=event.turn.completion_token_ids,
                logprobs=event.turn.logprobs,
                prompt_tokens=len(event.turn.prompt_token_ids),
                completion_tokens=len(event.turn.completion_token_ids),
                policy_version=event.turn.policy_version,
                deployment_id=event.turn.deployment_id if event.turn.deployment_id in deployments else None,
                arm=event.turn.arm,
                latency_ms=event.turn.latency_ms,
                finish_reason=event.turn.finish_reason,
                created_at=_when(event.turn.created_at),
            )
            for event in fresh
        ],
        ignore_conflicts=True,
        batch_size=500,
    )
    sessions_rollup(session_ids=sorted(set(sessions.values())))


def _known_deployments(ids: set[int]) -> set[int]:
    """The deployment ids that exist (a turn naming an unknown one keeps its policy version, loses the link)."""
    return set(Deployment.objects.filter(pk__in=ids).values_list("pk", flat=True)) if ids else set()


def _sessions_for(run: Run, events: list[Any]) -> dict[str, int]:
    """{client session id: Session pk} for every session of `events`, creating the missing ones."""
    ids = {event.session_id for event in events}
    rows = list(
        Session.objects.filter(serve_run=run, client_session_id__in=ids).values_list(
            "client_session_id", "pk", "task_type"
        )
    )
    found = {session_id: pk for session_id, pk, _ in rows}
    typed = {session_id for session_id, _, task_type in rows if task_type}
    missing = [event for event in events if event.session_id not in found]
    if missing:
        token_ids = {event.token_id for event in missing if event.token_id is not None}
        owners = dict(ApiToken.objects.filter(pk__in=token_ids).values_list("pk", "user_id")) if token_ids else {}
        first: dict[str, Any] = {}
        for event in sorted(missing, key=lambda e: (e.turn.created_at, e.turn.turn_index)):
            first.setdefault(event.session_id, event)
        Session.objects.bulk_create(
            [
                Session(
                    serve_run=run,
                    client_session_id=session_id,
                    token_id=event.token_id if event.token_id in owners else None,
                    user_id=owners.get(event.token_id),
                    task_type=event.task_type,
                    started_at=_when(event.turn.created_at),
                    last_turn_at=_when(event.turn.created_at),
                )
                for session_id, event in first.items()
            ],
            ignore_conflicts=True,
        )
        found.update(
            Session.objects.filter(serve_run=run, client_session_id__in=list(first)).values_list(
                "client_session_id", "pk"
            )
        )
    named: dict[str, str] = {}
    for event in events:
        if event.task_type:
            named.setdefault(event.session_id, event.task_type)
    for session_id, task_type in named.items():  # a session whose first turns named no task type takes a later one's
        if session_id not in typed:
            Session.objects.filter(pk=found[session_id], task_type="").update(task_type=task_type)
    return found


def sessions_rollup(*, session_ids: list[int]) -> None:
    """Recompute the roll-ups of these sessions from their stored turns (in turn order)."""
    turns: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    rows = (
        SessionTurn.objects.filter(session_id__in=session_ids)
        .order_by("session_id", "turn_index", "created_at", "id")
        .values_list(
            "session_id", "policy_version", "deployment_id", "arm", "prompt_tokens", "completion_tokens", "created_at"
        )
    )
    for row in rows:
        turns[row[0]].append(row)
    updated = []
    for session in Session.objects.filter(pk__in=list(turns)):
        mine = turns[session.pk]
        first, last = mine[0], mine[-1]
        session.num_turns = len(mine)
        session.first_policy_version, session.last_policy_version = first[1], last[1]
        session.deployment_id, session.arm = first[2], first[3]
        session.prompt_tokens = sum(row[4] for row in mine)
        session.completion_tokens = sum(row[5] for row in mine)
        session.started_at = min(row[6] for row in mine)
        session.last_turn_at = max(row[6] for row in mine)
        updated.append(session)
    Session.objects.bulk_update(
        updated,
        [
            "num_turns",
            "first_policy_version",
            "last_policy_version",
            "deployment",
            "arm",
            "prompt_tokens",
            "completion_tokens",
            "started_at",
            "last_turn_at",
        ],
        batch_size=500,
    )


# --- feedback ------------------------------------------------------------------------------------------------------


class FeedbackOutsideWindow(Exception):
    """Feedback for a session whose window has closed (the API answers 409)."""


class FeedbackConflict(Exception):
    """An event id posted before with a different signal or content (the API answers 409; nothing is changed)."""


class FeedbackTurnUnknown(Exception):
    """Feedback about a turn the session does not have (the API answers 400 on `turn_index`)."""


def _feedback_content(signal: str, value: float | None, turn_index: int | None, text: str) -> dict[str, Any]:
    return {"signal": signal, "value": value, "turn_index": turn_index, "text": text}


def _conflict_message(existing: Feedback, body: FeedbackIn) -> str:
    stored = _feedback_content(existing.signal, existing.value, existing.turn_index, existing.text)
    posted = _feedback_content(body.signal.value, body.value, body.turn_index, body.text)
    differs = [name for name in stored if name != "signal" and stored[name] != posted[name]]
    detail = "; ".join(f"{name} {stored[name]!r} stored, {posted[name]!r} posted" for name in differs)
    return (
        f"event_id {existing.event_id!r} was already posted on this session as signal {existing.signal!r}; this "
        f"post says signal {body.signal.value!r}"
        + (f" ({detail})" if detail else "")
        + ". Nothing was changed: an event id names one event (repeat it only to retry the same body); post a "
        "different signal under a new event_id."
    )


def _turn_problem(session: Session, turn_index: int) -> str | None:
    """None when the session has a turn `turn_index`; else why not, with the turns it has."""
    indices = sorted(set(SessionTurn.objects.filter(session=session).values_list("turn_index", flat=True)))
    if turn_index in indices:
        return None
    if not indices:
        have = "has no turns recorded"
    elif indices == list(range(len(indices))):
        have = f"has {len(indices)} turn{'s' if len(indices) != 1 else ''} (turn_index 0 to {indices[-1]})"
    else:
        listed = ", ".join(map(str, indices[:20])) + (", ..." if len(indices) > 20 else "")
        have = f"has {len(indices)} turns (turn_index {listed})"
    return (
        f"session {session.client_session_id!r} {have}; it has no turn {turn_index}. Leave turn_index out for "
        "feedback about the whole session (turns are recorded a few seconds after they are served)."
    )


@dataclass(frozen=True)
class FeedbackResult:
    feedback: Feedback
    created: bool


def feedback_window() -> timedelta:
    return timedelta(hours=settings.FEEDBACK_WINDOW_HOURS)


def feedback_create(
    *, session: Session, body: FeedbackIn, user: User | None = None, run: Run | None = None
) -> FeedbackResult:
    """Store `body` about `session` once per event id: an identical repeat returns the stored row (created=False)
    and adds nothing, whenever it comes; a repeat with another signal, value, turn_index or text raises
    FeedbackConflict and changes nothing. A `turn_index` the session has no turn for raises FeedbackTurnUnknown.
    New feedback is accepted until CRUCIBLE_FEEDBACK_WINDOW_HOURS after the session's last turn; later it raises
    FeedbackOutsideWindow. `user` is who posted it (empty for a simulate run's token, then `run` is that run). The
    session's `feedback_counts` are kept in the same transaction."""
    with transaction.atomic():
        locked = Session.objects.select_for_update().get(pk=session.pk)
        existing = Feedback.objects.filter(session=locked, event_id=body.event_id).first()
        if existing is not None:
            if _feedback_content(existing.signal, existing.value, existing.turn_index, existing.text) != (
                _feedback_content(body.signal.value, body.value, body.turn_index, body.text)
            ):
                raise FeedbackConflict(_conflict_message(existing, body))
            return FeedbackResult(feedback=existing, created=False)
        if body.turn_index is not None and (problem := _turn_problem(locked, body.turn_index)):
            raise FeedbackTurnUnknown(problem)
        closes = locked.last_turn_at + feedback_window()
        if timezone.now() > closes:
            raise FeedbackOutsideWindow(
                f"session {locked.client_session_id!r} took feedback until {closes.isoformat()} "
                f"({settings.FEEDBACK_WINDOW_HOURS} h after its last turn, CRUCIBLE_FEEDBACK_WINDOW_HOURS)"
            )
        feedback = Feedback.objects.create(
            session=locked,
            event_id=body.event_id,
            signal=body.signal.value,
            value=body.value,
            turn_index=body.turn_index,
            text=body.text,
            user=user,
            run=run,
        )
        counts = dict(locked.feedback_counts)
        counts[body.signal.value] = counts.get(body.signal.value, 0) + 1
        locked.feedback_counts = counts
        locked.save(update_fields=["feedback_counts"])
    return FeedbackResult(feedback=feedback, created=True)
