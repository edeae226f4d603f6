"""The simulation: `sessions` sessions, `concurrency` at a time, reported as they end, tabulated at the end.

Sessions run in a thread pool inside the job (each is network waits and sandboxed test runs, separate processes,
so threads keep the cores busy); at most `concurrency` are in flight and a new one starts as one ends. After each
session the job reports progress, a log line and the running metrics (`sim/edit_kept_rate`, `sim/dissatisfied_rate`,
`sim/accepted_rate`, `sim/tests_passed`, `sim/latency_ms_p50` over every request so far, `sim/turns` of the session,
`sim/errors` so far), with the number of sessions ended as the step. At the end it writes the per-session table
(`SessionResult.row()`, one JSON object per line, in session order) to `output_uri` and the environment's record of
every session that ended (`workers.trajectories` records whose id is the session id) beside it as
`trajectories.jsonl`, registers both as artifacts and returns the summary.

A serving or control-plane 401/403 stops the simulation: no session starts after it, those in flight end at their
next request, the table of what was played is still written, then `SimulationStopped` is raised with the reason.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import threading
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import openai

from workers.coding.environment import CodingAgentEnv
from workers.envs.base import Task, TaskFieldError
from workers.envs.registry import configure_storage
from workers.evals import stats as evals_stats
from workers.reporting import Reporter
from workers.session_records import Signal
from workers.simulator.feedback import FeedbackPoster, FeedbackRefused
from workers.simulator.session import (
    ServingRefused,
    SessionPlan,
    SessionResult,
    Settings,
    make_env,
    play_session,
    task_type_of,
)
from workers.simulator.users import flips, task_index, tolerates_questions, user_of
from workers.specs import SimulateSpec
from workers.storage import read_bytes, write_bytes

log = logging.getLogger("crucible.simulate")

MAX_TASK_ERRORS = 5


class SimulationStopped(RuntimeError):
    """A 401/403 from the serving endpoint or the control plane stopped the simulation; `summary` is what was
    played before it."""

    def __init__(self, reason: str, summary: dict[str, Any]) -> None:
        super().__init__(reason)
        self.summary = summary


def load_tasks(spec: SimulateSpec) -> list[Task]:
    """The repository tasks of `spec.tasks_uri` (JSONL, repo_task/v1 or inline-repository rows), each checked as the
    coding_agent environment checks it; ValueError naming `tasks_uri`, the row and the field otherwise."""
    data = read_bytes(spec.tasks_uri, spec.storage_options)
    tasks: list[Task] = []
    problems: list[str] = []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            problems.append(f"line {number} is not JSON ({exc})")
        else:
            try:
                tasks.append(CodingAgentEnv.validate_task_row(row, index=number))
            except TaskFieldError as exc:
                problems.append(str(exc))
        if len(problems) >= MAX_TASK_ERRORS:
            break
    if problems:
        raise ValueError(f"tasks_uri {spec.tasks_uri}: " + "; ".join(problems))
    if not tasks:
        raise ValueError(f"tasks_uri {spec.tasks_uri} holds no tasks: give a repo_tasks dataset version's rows")
    return tasks


def output_uris(spec: SimulateSpec) -> tuple[str, str]:
    """Where the per-session table and the session trajectories go."""
    table = spec.output_uri or f"{spec.tasks_uri.rsplit('/', 1)[0]}/simulate-run{spec.run_id}/sessions.jsonl"
    return table, f"{table.rsplit('/', 1)[0]}/trajectories.jsonl"


def plan_session(spec: SimulateSpec, tasks: Sequence[Task], index: int) -> SessionPlan:
    task = tasks[task_index(spec.seed, index, len(tasks))]
    user = user_of(index, spec.users)
    return SessionPlan(
        index=index,
        task=task,
        task_type=task_type_of(task),
        user=user,
        tolerates_questions=tolerates_questions(spec.seed, user, spec.tolerates_questions),
        flipped=flips(spec.seed, index, spec.noise),
    )


def wilson_interval(successes: int, trials: int) -> tuple[float, float]:
    """The Wilson 95% interval of a rate (workers.evals.stats); (0, 1) with no trials."""
    return evals_stats.wilson_interval(successes, trials) if trials > 0 else (0.0, 1.0)


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class _Tally:
    ended: int = 0
    judged: int = 0
    errors: int = 0
    stopped: int = 0
    signals: dict[str, int] = field(default_factory=dict)
    tests: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    asked: int = 0
    flipped: int = 0
    versions: set[int] = field(default_factory=set)

    def add(self, result: SessionResult) -> None:
        self.ended += 1
        self.latencies.extend(result.latency_ms)
        self.versions.update(result.policy_versions)
        if result.stopped:
            self.stopped += 1
            return
        self.turns.append(result.turns)
        if result.error is not None:
            self.errors += 1
        if result.signal is not None:
            self.judged += 1
            self.signals[result.signal] = self.signals.get(result.signal, 0) + 1
            self.flipped += result.flipped
        if result.tests_passed is not None:
            self.tests.append(result.tests_passed)
        self.asked += result.asked_question

    def rate(self, signal: Signal) -> float:
        return self.signals.get(signal.value, 0) / self.judged if self.judged else 0.0

    def metrics(self, result: SessionResult) -> dict[str, float]:
        values = {"sim/turns": float(result.turns), "sim/errors": float(self.errors)}
        if self.judged:
            values["sim/edit_kept_rate"] = self.rate(Signal.EDIT_KEPT)
            values["sim/dissatisfied_rate"] = self.rate(Signal.DISSATISFIED_FOLLOWUP)
            values["sim/accepted_rate"] = self.rate(Signal.ACCEPTED)
        if self.tests:
            values["sim/tests_passed"] = statistics.fmean(self.tests)
        if self.latencies:
            values["sim/latency_ms_p50"] = float(statistics.median(self.latencies))
        return values

    def summary(self) -> dict[str, Any]:
        kept = self.signals.get(Signal.EDIT_KEPT.value, 0)
        low, high = wilson_interval(kept, self.judged)
        return {
            "sessions_ended": self.ended,
            "sessions_judged": self.judged,
            "errors": self.errors,
            "stopped": self.stopped,
            "signals": dict(sorted(self.signals.items())),
            "edit_kept_rate": self.rate(Signal.EDIT_KEPT),
            "edit_kept_ci95": [round(low, 4), round(high, 4)],
            "dissatisfied_rate": self.rate(Signal.DISSATISFIED_FOLLOWUP),
            "accepted_rate": self.rate(Signal.ACCEPTED),
            "questions_asked": self.asked,
            "flipped": self.flipped,
            "tests_passed_mean": statistics.fmean(self.tests) if self.tests else None,
            "latency_ms_p50": round(_percentile(self.latencies, 0.5), 2) if self.latencies else None,
            "latency_ms_p95": round(_percentile(self.latencies, 0.95), 2) if self.latencies else None,
            "turns_mean": statistics.fmean(self.turns) if self.turns else None,
            "policy_versions": sorted(self.versions),
        }


def _check_urls(spec: SimulateSpec) -> None:
    for name in ("base_url", "feedback_url"):
        value = getattr(spec, name)
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"{name} must be an http(s) URL, got {value!r}")


def _check_env(settings: Settings) -> None:
    if "max_turns" in settings.env_params:
        raise ValueError("env_params: max_turns is the spec's own max_turns field; remove it from env_params")
    try:
        make_env(settings)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"env_params: {exc}") from None


def _line(result: SessionResult) -> str:
    what = result.signal or ("stopped" if result.stopped else "no feedback")
    tests = "-" if result.tests_passed is None else f"{result.tests_passed:.2f}"
    p50 = "-" if result.latency_ms_p50 is None else f"{result.latency_ms_p50:.0f} ms"
    line = (
        f"session {result.index} ({result.session_id}) task {result.task_id} user {result.user}: {what}; "
        f"tests {tests}; {result.turns} turn(s); p50 {p50}"
    )
    return line + (f"; error: {result.error}" if result.error and not result.stopped else "")


def simulate(spec: SimulateSpec, *, token: str, reporter: Reporter | None = None) -> dict[str, Any]:
    """Play the simulation `spec` describes with `token` as the serving key and feedback credential; returns the
    summary. Raises ValueError for a spec whose inputs are unusable (naming the field) and `SimulationStopped` when a
    401/403 stopped it (after writing the table of what was played)."""
    # One function on purpose: the simulation's wiring, read top to bottom: check the spec, play the sessions, send
    # feedback, write the summary.
    started = time.monotonic()
    _check_urls(spec)
    settings = Settings(
        model_name=spec.model_name,
        max_turns=spec.max_turns,
        max_tokens=spec.max_tokens,
        temperature=spec.temperature,
        env_params=dict(spec.env_params),
    )
    _check_env(settings)
    configure_storage(spec.storage_options)
    tasks = load_tasks(spec)
    table_uri, trajectories_uri = output_uris(spec)

    def say(line: str) -> None:
        log.info(line)
        if reporter is not None:
            reporter.log(line)

    client = openai.OpenAI(
        base_url=spec.base_url,
        api_key=token,
        timeout=spec.request_timeout_seconds,
        max_retries=spec.request_retries,
    )
    poster = FeedbackPoster(spec.feedback_url, token, wait_seconds=spec.feedback_wait_seconds)
    stop = threading.Event()
    stopped_reason = ""
    tally = _Tally()
    results: list[SessionResult] = []
    say(
        f"simulating {spec.sessions} session(s) on {len(tasks)} task(s), {spec.concurrency} at a time, against "
        f"{spec.base_url} (model {spec.model_name})"
    )
    if reporter is not None:
        reporter.progress(0, spec.sessions)

    def play(plan: SessionPlan) -> SessionResult:
        try:
            return play_session(plan, client=client, settings=settings, feedback=poster, stop=stop)
        except (ServingRefused, FeedbackRefused):
            stop.set()  # the other sessions stop at their next request
            raise

    try:
        with ThreadPoolExecutor(max_workers=spec.concurrency, thread_name_prefix="simulate") as pool:
            pending: dict[Future[SessionResult], SessionPlan] = {}
            next_index = 0
            while pending or (next_index < spec.sessions and not stop.is_set()):
                while not stop.is_set() and next_index < spec.sessions and len(pending) < spec.concurrency:
                    plan = plan_session(spec, tasks, next_index)
                    pending[pool.submit(play, plan)] = plan
                    next_index += 1
                done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
                for future in done:
                    plan = pending.pop(future)
                    try:
                        result = future.result()
                    except (ServingRefused, FeedbackRefused) as exc:
                        stopped_reason = stopped_reason or str(exc)
                        continue
                    except Exception as exc:  # a session must never take the simulation down with it
                        log.exception("session %d failed", plan.index)
                        result = SessionResult(
                            index=plan.index,
                            session_id=plan.session_id,
                            task_id=plan.task.id,
                            task_type=plan.task_type,
                            user=plan.user,
                            tolerates_questions=plan.tolerates_questions,
                            flipped=plan.flipped,
                            error=f"{type(exc).__name__}: {exc}",
                        )
                    results.append(result)
                    tally.add(result)
                    say(_line(result))
                    if reporter is not None:
                        reporter.metric(tally.ended, tally.metrics(result))
                        reporter.progress(tally.ended, spec.sessions)
    finally:
        client.close()
        poster.close()

    results.sort(key=lambda r: r.index)
    table = "".join(json.dumps(r.row(), ensure_ascii=False, sort_keys=True) + "\n" for r in results).encode()
    trajectories = "".join(
        json.dumps(r.trajectory, ensure_ascii=False) + "\n" for r in results if r.trajectory is not None
    ).encode()
    write_bytes(table_uri, table, spec.storage_options)
    write_bytes(trajectories_uri, trajectories, spec.storage_options)
    summary = {
        "sessions": spec.sessions,
        **tally.summary(),
        "output_uri": table_uri,
        "trajectories_uri": trajectories_uri,
        "stopped_reason": stopped_reason,
        "seconds": round(time.monotonic() - started, 2),
    }
    if reporter is not None:
        reporter.artifact("sessions.jsonl", table_uri, size_bytes=len(table), meta={"rows": len(results)})
        reporter.artifact(
            "trajectories.jsonl",
            trajectories_uri,
            size_bytes=len(trajectories),
            meta={"rows": sum(r.trajectory is not None for r in results)},
        )
    say(
        f"{tally.ended} session(s) ended: edit kept {summary['edit_kept_rate']:.3f} "
        f"(95% CI {summary['edit_kept_ci95'][0]:.3f}-{summary['edit_kept_ci95'][1]:.3f}), dissatisfied "
        f"{summary['dissatisfied_rate']:.3f}, accepted {summary['accepted_rate']:.3f}, {tally.errors} error(s), "
        f"in {summary['seconds']} s"
    )
    if stopped_reason:
        raise SimulationStopped(stopped_reason, summary)
    return summary
