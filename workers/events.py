"""The ingest wire format, shared by the worker's reporter and the control plane's ingest endpoint.

A batch is `{"events": [Event, ...]}`. Every event carries `seq`, a per-run sequence number that the worker
assigns once (1, 2, 3, ...); the control plane stores each (run, seq) at most once, so a retried or reordered
batch neither duplicates nor loses anything.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, field_validator

from workers.findings import Severity
from workers.session_records import SESSION_ID_MAX, TurnRecord


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    seq: int = Field(ge=1, description="Per-run sequence number, assigned once by the worker")
    time: float | None = Field(default=None, description="Unix seconds when the worker produced it")


# No NUL character: PostgreSQL text cannot hold one (the ingest view answers NULs in other fields with a 400 too).
MetricName = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern="^[^\x00]+$")]


class MetricEvent(_Event):
    kind: Literal["metric"]
    step: int = Field(ge=0)
    # Checked inside pydantic-core (no Python call per event): names of 1-100 characters, finite values only
    # (the model's allow_inf_nan=False covers the dict's values: NaN, Infinity and 1e999 are refused).
    values: dict[MetricName, float] = Field(min_length=1)


class LogEvent(_Event):
    kind: Literal["log"]
    lines: list[str] = Field(min_length=1)


PHASES = ("generation", "training", "weight_sync", "evaluation")
"""The phases a job may say it is in (`ProgressEvent.phase`); each has its own stall limit (TrainConfig
`stall_limits`)."""


class ProgressEvent(_Event):
    kind: Literal["progress"]
    done: int = Field(ge=0)
    total: int = Field(ge=0)
    phase: Literal["", "generation", "training", "weight_sync", "evaluation"] = ""


class TrajectoryEvent(_Event):
    kind: Literal["trajectory"]
    trajectory_id: str = Field(min_length=1, max_length=200)
    task_id: str = ""
    step: int = 0
    reward: float | None = None
    terms: dict[str, float] = {}
    num_turns: int = 0
    completion_tokens: int = Field(default=0, ge=0, description="tokens the policy sampled in the episode")
    error: str | None = None
    storage_uri: str = ""


class HistogramEvent(_Event):
    kind: Literal["histogram"]
    name: str
    edges: list[float]
    counts: list[int]


class ArtifactEvent(_Event):
    kind: Literal["artifact"]
    name: str = Field(min_length=1, max_length=200)
    uri: str = Field(min_length=1, max_length=500)
    size_bytes: int = 0
    meta: dict[str, Any] = {}


class CheckpointEvent(_Event):
    kind: Literal["checkpoint"]
    step: int = Field(ge=0)
    uri: str = Field(min_length=1, max_length=500)
    metrics: dict[str, float] = {}


class TaskResultEvent(_Event):
    """One task's result in an eval: `passed` of `samples` attempts succeeded; `score` is the task's mean score in
    [0, 1] (the pass fraction for pass/fail metrics); `outcomes` counts how attempts ended (ok, failed, timeout,
    memory, killed, error)."""

    kind: Literal["task_result"]
    task_id: str = Field(min_length=1, max_length=200)
    samples: int = Field(ge=1)
    passed: int = Field(ge=0)
    score: float = Field(ge=0.0, le=1.0)
    outcomes: dict[str, int] = {}
    trajectory_ids: list[str] = []

    @field_validator("passed")
    @classmethod
    def _at_most_samples(cls, passed: int, info: Any) -> int:
        samples = info.data.get("samples")
        if samples is not None and passed > samples:
            raise ValueError(f"passed ({passed}) cannot exceed samples ({samples})")
        return passed


class FlagEvent(_Event):
    """A detector's flag on one trajectory of the run (workers.detectors): the detector and its version, how
    severe, and its evidence (the offending turn index, span and excerpt, and the measured value against the
    threshold). The control plane keeps one flag per (run, trajectory, detector)."""

    kind: Literal["flag"]
    trajectory_id: str = Field(min_length=1, max_length=200)
    detector: str = Field(min_length=1, max_length=64)
    detector_version: str = Field(min_length=1, max_length=16)
    severity: Severity
    evidence: dict[str, Any] = {}
    step: int = Field(default=0, ge=0)


class SessionTurnEvent(_Event):
    """One completion a serving run produced (workers.serving), recorded as a turn of the client's session.
    The control plane stores one turn per (serve run, `turn.request_id`)."""

    kind: Literal["session_turn"]
    session_id: str = Field(min_length=1, max_length=SESSION_ID_MAX)
    task_type: str = Field(default="", max_length=100)
    token_id: int | None = Field(default=None, description="The ApiToken that called (its owner is the user)")
    turn: TurnRecord


class SummaryEvent(_Event):
    kind: Literal["summary"]
    data: dict[str, Any]


class EndEvent(_Event):
    """The worker's own word on how its job ended, sent as its last event. The control plane trusts Ray's job
    status while Ray knows the job; once Ray has lost it (a restarted cluster), this decides between succeeded and
    failed instead of guessing."""

    kind: Literal["end"]
    outcome: Literal["succeeded", "failed"]
    error: str = Field(default="", max_length=2000)


Event = Annotated[
    MetricEvent
    | LogEvent
    | ProgressEvent
    | TrajectoryEvent
    | HistogramEvent
    | ArtifactEvent
    | CheckpointEvent
    | TaskResultEvent
    | FlagEvent
    | SessionTurnEvent
    | SummaryEvent
    | EndEvent,
    Field(discriminator="kind"),
]


class EventBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    events: list[Event] = Field(min_length=1)


EVENT_BATCH = TypeAdapter(EventBatch)
EVENTS_LIST: TypeAdapter[list[Event]] = TypeAdapter(list[Event])
EVENT: TypeAdapter[Event] = TypeAdapter(Event)
