"""The real-time RL cycle of a gate: collect → train → evaluate and gate → deploy, advanced by Celery beat.

Cursor's loop (docs/methods.md section 2, "Real-time RL"): serve a checkpoint, collect the sessions it served, distil
the users' responses into rewards, train, evaluate on the internal benchmark and deploy only without significant
regressions, about every five hours. Here every phase is a step of a state machine that beat ticks
(`loops_tick`, every CRUCIBLE_RECONCILE_SECONDS): a tick reads where the loop's running cycle stands and moves it
on when its phase's work is done; nothing blocks a Celery worker.

- **collect**: the serving run's sessions not yet collected whose last turn is `settle_seconds` old (time for the
  user's feedback) are counted; with `target_sessions` of them, or at least `min_sessions` once the cycle has
  waited `max_wait_seconds`, they are frozen into the next version of the dataset `<gate>-sessions`
  (`session/v1` rows) and marked as this cycle's. Fewer than `min_sessions`: the cycle waits (it never trains on
  nothing) and says so in `reason`. The on-policy share is the share of collected turns sampled by the checkpoint
  deployed when the cycle began.
- **train**: a `sessiontrain` run from the deployed checkpoint over that version (one epoch; the recorded
  log-probabilities are the behaviour policy; the baseline for ungrouped samples is the loop's `training.baseline`).
- **evaluate**: the gate's own check of the new checkpoint against the current deployment (its benchmarks, rules
  and, when the gate asks for one, a human's approval).
- **deploy**: a passing decision becomes the gate's deployment; the serving run reads its new target and
  hot-swaps the weights; the phase ends once serving reports the new version (or after `SWAP_CONFIRM_SECONDS`,
  noted in `reason`).

A failure in any phase marks the cycle failed with the reason and leaves the deployment as it was; a gate that
refuses the checkpoint marks it blocked. The next tick opens the next cycle. A paused loop is not ticked.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import OperationalError, transaction
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from apps.benchmarks.models import Eval
from apps.datasets.models import Dataset, DatasetKind
from apps.datasets.services import dataset_create, dataset_version_create
from apps.gates.models import CheckStatus, GateCheck, Verdict
from apps.gates.selectors import current_deployment
from apps.gates.services.checks import gate_check_advance
from apps.gates.services.deployments import deploy
from apps.gates.services.gates import gate_evaluate
from apps.realtime.models import Cycle, CyclePhase, CycleStatus, Loop
from apps.realtime.models.sessions import Session
from apps.realtime.selectors import served_version
from apps.realtime.services.serving import session_train_launch
from apps.runs.models import Checkpoint, Run, RunStatus
from workers.session_records import SessionRecord

log = logging.getLogger("crucible.realtime")

SWAP_CONFIRM_SECONDS = 600
"""How long the deploy phase waits for the serving run to report the new policy version before it ends anyway."""


# --- the state machine --------------------------------------------------------------------------------------------
def loops_tick() -> int:
    """Advance every active loop once; returns how many cycles moved to another phase or ended."""
    moved = 0
    for loop_id in Loop.objects.filter(paused=False).values_list("pk", flat=True):
        try:
            moved += cycle_advance(loop_id=loop_id)
        except Exception:  # one broken loop must not stop the others; its cycle records why
            log.exception("real-time loop %s could not advance", loop_id)
    return moved


def _now_iso() -> str:
    return timezone.now().isoformat()


def _enter(cycle: Cycle, phase: str) -> None:
    """Close the timeline's open phase and open `phase` (DONE closes without opening)."""
    now = _now_iso()
    timeline = list(cycle.timeline)
    if timeline and timeline[-1].get("ended_at") is None:
        timeline[-1] = {**timeline[-1], "ended_at": now}
    if phase != CyclePhase.DONE:
        timeline.append({"phase": phase, "started_at": now, "ended_at": None})
    cycle.timeline = timeline
    cycle.phase = phase


def _end(cycle: Cycle, status: str, reason: str = "") -> None:
    _enter(cycle, CyclePhase.DONE)
    cycle.status = status
    cycle.reason = reason
    cycle.ended_at = timezone.now()


def cycle_advance(*, loop_id: int) -> int:
    """One tick of the loop: open a cycle when none runs, then try to finish the running cycle's phase (and the
    ones after it that are already done). Returns the number of phase changes.

    A transient database error (a deadlock, a lost connection) rolls the tick back and the next tick retries; any
    other error fails the cycle with its reason, leaving the deployment as it was."""
    _decide_gate_check(loop_id)
    with transaction.atomic():
        loop = Loop.objects.select_for_update().select_related("gate", "serve_run", "reward_version").get(pk=loop_id)
        if loop.paused:
            return 0
        cycle = Cycle.objects.filter(loop=loop, status=CycleStatus.RUNNING).first()
        if cycle is None:
            number = Cycle.objects.filter(loop=loop).order_by("-number").values_list("number", flat=True).first() or 0
            cycle = Cycle(loop=loop, number=number + 1, base_deployment=current_deployment(loop.gate))
            _enter(cycle, CyclePhase.COLLECT)
            cycle.save()
        moved = 0
        for _ in range(len(CyclePhase.values)):
            before = (cycle.phase, cycle.status)
            reason = cycle.reason
            try:
                _step(loop, cycle)
            except ValidationError as exc:
                _end(cycle, CycleStatus.FAILED, f"{cycle.phase}: {_detail(exc.detail)}")
            except OperationalError:
                raise  # transient: this tick rolls back, the next one tries again
            except Exception as exc:  # recorded on the cycle; the deployment is untouched
                log.exception("cycle %s of loop %s failed in %s", cycle.number, loop.pk, cycle.phase)
                _end(cycle, CycleStatus.FAILED, f"{cycle.phase}: {type(exc).__name__}: {exc}")
            if (cycle.phase, cycle.status) == before:
                # A waiting phase changes at most what it waits for: no row write on a tick that moved nothing.
                if cycle.reason != reason:
                    cycle.save(update_fields=["reason"])
                break
            cycle.save()
            moved += 1
            if cycle.status != CycleStatus.RUNNING:
                break
        return moved


def _decide_gate_check(loop_id: int) -> None:
    """Decide the running cycle's gate check now if its evals ended (beat's gate task would, a tick later), in its
    own transaction and before the loop's lock is taken: the gate app locks its check first, so taking the two
    locks in the other order would deadlock with that task."""
    check_id = (
        Cycle.objects.filter(loop_id=loop_id, status=CycleStatus.RUNNING, phase=CyclePhase.EVALUATE)
        .values_list("gate_check_id", flat=True)
        .first()
    )
    if check_id is not None and GateCheck.objects.filter(pk=check_id, status=CheckStatus.WAITING).exists():
        gate_check_advance(check_id=check_id)


def _detail(detail: Any) -> str:
    if isinstance(detail, dict):
        return "; ".join(f"{k}: {_detail(v)}" for k, v in detail.items())
    if isinstance(detail, list):
        return "; ".join(_detail(v) for v in detail)
    return str(detail)


def _step(loop: Loop, cycle: Cycle) -> None:
    if cycle.phase == CyclePhase.COLLECT:
        _collect(loop, cycle)
    elif cycle.phase == CyclePhase.TRAIN:
        _train(loop, cycle)
    elif cycle.phase == CyclePhase.EVALUATE:
        _evaluate(loop, cycle)
    elif cycle.phase == CyclePhase.DEPLOY:
        _confirm_swap(loop, cycle)


def _policy_version(cycle: Cycle) -> int:
    return cycle.base_deployment.checkpoint_id if cycle.base_deployment is not None else 0


def _ready_sessions(loop: Loop) -> Any:
    cutoff = timezone.now() - timedelta(seconds=loop.settle_seconds)
    return Session.objects.filter(serve_run=loop.serve_run, cycle__isnull=True, last_turn_at__lte=cutoff)


def _collect(loop: Loop, cycle: Cycle) -> None:
    ready = _ready_sessions(loop)
    count = ready.count()
    waited = (timezone.now() - cycle.started_at).total_seconds()
    if count < loop.min_sessions or (count < loop.target_sessions and waited < loop.max_wait_seconds):
        need = loop.min_sessions if count < loop.min_sessions else loop.target_sessions
        cycle.reason = f"waiting for sessions: {count} ready of {need}"
        return
    chosen = list(ready.order_by("last_turn_at", "pk").prefetch_related("turns", "feedback")[: loop.target_sessions])
    records = [session_record(s) for s in chosen]
    data = "".join(json.dumps(r.model_dump(mode="json"), separators=(",", ":")) + "\n" for r in records).encode()
    dataset = _sessions_dataset(loop)
    version = dataset_version_create(
        dataset=dataset,
        data=data,
        filename="sessions.jsonl",
        created_by=loop.owner,
        notes=f"cycle {cycle.number} of the real-time loop of gate {loop.gate.name}",
        report={"cycle": cycle.number, "serve_run": loop.serve_run_id},
    )
    Session.objects.filter(pk__in=[s.pk for s in chosen]).update(cycle=cycle)
    turns = [t for r in records for t in r.turns]
    served = _policy_version(cycle)
    cycle.dataset_version = version
    cycle.sessions = len(records)
    cycle.turns = len(turns)
    cycle.tokens = sum(len(t.prompt_token_ids) + len(t.completion_token_ids) for t in turns)
    cycle.on_policy_share = sum(t.policy_version == served for t in turns) / len(turns) if turns else None
    cycle.feedback_share = sum(bool(r.feedback) for r in records) / len(records)
    cycle.reason = ""
    _launch_training(loop, cycle)
    _enter(cycle, CyclePhase.TRAIN)


def _sessions_dataset(loop: Loop) -> Dataset:
    name = f"{loop.gate.name}-sessions"[:100]
    dataset = Dataset.objects.filter(name=name).first()
    if dataset is None:
        dataset = dataset_create(
            name=name,
            kind=DatasetKind.SESSIONS,
            owner=loop.owner,
            description=f"Sessions served behind gate {loop.gate.name}, one version per real-time RL cycle",
        )
    elif dataset.kind != DatasetKind.SESSIONS:
        raise ValidationError({"dataset": [f"dataset {name!r} exists and holds {dataset.kind}; rename it"]})
    return dataset


def session_record(session: Session) -> SessionRecord:
    """A stored session as the `session/v1` row the trainer reads."""
    turns = sorted(session.turns.all(), key=lambda t: (t.turn_index, t.created_at))
    return SessionRecord.model_validate(
        {
            "session_id": session.client_session_id,
            "serve_run_id": session.serve_run_id,
            "task_type": session.task_type,
            "turns": [
                {
                    "turn_index": t.turn_index,
                    "request_id": t.request_id,
                    "messages": t.messages,
                    "tools": t.tools,
                    "response": t.response,
                    "prompt_token_ids": t.prompt_token_ids,
                    "completion_token_ids": t.completion_token_ids,
                    "logprobs": t.logprobs,
                    "policy_version": t.policy_version,
                    "deployment_id": t.deployment_id,
                    "arm": t.arm,
                    "latency_ms": t.latency_ms,
                    "finish_reason": t.finish_reason,
                    "created_at": t.created_at.timestamp(),
                }
                for t in turns
            ],
            "feedback": [
                {
                    "event_id": f.event_id,
                    "signal": f.signal,
                    "value": f.value,
                    "turn_index": f.turn_index,
                    "text": f.text,
                    "created_at": f.created_at.timestamp(),
                }
                for f in sorted(session.feedback.all(), key=lambda f: f.created_at)
            ],
            "started_at": session.started_at.timestamp(),
            "ended_at": session.last_turn_at.timestamp(),
        }
    )


def _launch_training(loop: Loop, cycle: Cycle) -> None:
    base = cycle.base_deployment
    settings = loop.training
    assert cycle.dataset_version is not None  # collected just before
    config = dict(settings["config"])
    # Composer's and Dr. GRPO's constant normaliser is the generation limit: the serving run's cap on a completion
    # (a recorded turn never exceeds it), unless the loop sets one.
    served_cap = loop.serve_run.spec.get("job", {}).get("max_new_tokens", 512)
    config["sampling"] = {"max_new_tokens": served_cap, **(config.get("sampling") or {})}
    run = session_train_launch(
        user=loop.owner,
        dataset_version=cycle.dataset_version,
        reward_version=loop.reward_version,
        checkpoint=base.checkpoint if base is not None else None,
        base_model=_base_model(loop),
        config=config,
        baseline=settings["baseline"],
        max_samples=settings["max_samples"],
        name=f"{loop.gate.name} cycle {cycle.number}",
        spec={"cycle": cycle.pk, "loop": loop.pk},
    )
    cycle.train_run = run


def _base_model(loop: Loop) -> str:
    return str(loop.serve_run.spec["base_model"])  # serve_launch records it (a checkpoint's own, or the one named)


def _train(loop: Loop, cycle: Cycle) -> None:
    assert cycle.train_run_id is not None  # set when the cycle entered this phase
    run = Run.objects.get(pk=cycle.train_run_id)
    if not run.is_terminal:
        cycle.reason = f"training run {run.pk} is {run.status}"
        return
    if run.status != RunStatus.SUCCEEDED:
        why = run.failure_reason or run.reported_error or run.status
        _end(cycle, CycleStatus.FAILED, f"training run {run.pk} {run.status}: {why}")
        return
    checkpoint = Checkpoint.objects.filter(run=run).order_by("-step").first()
    if checkpoint is None:
        _end(cycle, CycleStatus.FAILED, f"training run {run.pk} succeeded without a checkpoint")
        return
    cycle.checkpoint = checkpoint
    reward = run.summary.get("reward_mean")
    cycle.reward_mean = float(reward) if isinstance(reward, int | float) else None
    cycle.gate_check = gate_evaluate(gate=loop.gate, checkpoint=checkpoint, user=loop.owner)
    cycle.reason = ""
    _enter(cycle, CyclePhase.EVALUATE)


def _evaluate(loop: Loop, cycle: Cycle) -> None:
    assert cycle.gate_check_id is not None  # set when the cycle entered this phase
    check = GateCheck.objects.select_related("decision").get(pk=cycle.gate_check_id)
    if check.status == CheckStatus.WAITING:
        cycle.reason = f"gate check {check.pk}: waiting for its evals"
        return
    if check.status == CheckStatus.ERROR:
        _end(cycle, CycleStatus.FAILED, f"gate check {check.pk} errored: {check.error}")
        return
    decision = check.decision
    cycle.eval_deltas = eval_deltas(decision.evidence)
    verdict = decision.final_verdict
    if verdict == Verdict.PENDING:
        cycle.reason = f"gate decision {decision.pk} waits for a human's approval"
        return
    if verdict == Verdict.FAIL:
        failed = [o.get("message", "") for o in decision.evidence.get("outcomes", []) if o.get("verdict") == "fail"]
        _end(cycle, CycleStatus.BLOCKED, "; ".join(m for m in failed if m) or f"gate decision {decision.pk} failed")
        return
    cycle.deployment = deploy(decision, user=loop.owner, note=f"real-time RL cycle {cycle.number}")
    cycle.reason = ""
    _enter(cycle, CyclePhase.DEPLOY)


def eval_deltas(evidence: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """{benchmark: {candidate, baseline, delta}} of the main score (mean_score) of the decision's evals."""
    ids = evidence.get("candidate_evals", {})
    base_ids = evidence.get("baseline_evals", {})
    scores = {
        e.pk: e.metrics.get("mean_score")
        for e in Eval.objects.filter(pk__in=[*ids.values(), *base_ids.values()]).only("pk", "metrics")
    }
    out: dict[str, dict[str, float | None]] = {}
    for name, pk in ids.items():
        candidate = scores.get(pk)
        baseline = scores.get(base_ids.get(name)) if name in base_ids else None
        delta = (
            candidate - baseline if isinstance(candidate, int | float) and isinstance(baseline, int | float) else None
        )
        out[name] = {"candidate": candidate, "baseline": baseline, "delta": delta}
    return out


def _confirm_swap(loop: Loop, cycle: Cycle) -> None:
    target = cycle.checkpoint_id
    if served_version(loop.serve_run_id) == target:
        _end(cycle, CycleStatus.DEPLOYED)
        return
    entered = cycle.timeline[-1]["started_at"] if cycle.timeline else _now_iso()
    waited = (timezone.now() - datetime.fromisoformat(entered)).total_seconds()
    if waited >= SWAP_CONFIRM_SECONDS:
        _end(
            cycle,
            CycleStatus.DEPLOYED,
            f"deployed; serving run {loop.serve_run_id} did not report version {target} within "
            f"{SWAP_CONFIRM_SECONDS} s",
        )
        return
    cycle.reason = f"waiting for serving run {loop.serve_run_id} to serve checkpoint {target}"
