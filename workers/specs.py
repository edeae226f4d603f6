"""Every Ray job's input schema, in one light module (pydantic only: no ray, no torch).

The control plane validates a run's worker input against its kind's spec at launch (`apps.runs.services.run_create`),
so a mis-built job is refused with a 400 naming the field instead of failing on the cluster; each job module
(`python -m workers.jobs.<name>`, the spec's `entrypoint`) parses the same class from CRUCIBLE_JOB_SPEC.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from workers.coding.candidates import CodegenParams
from workers.coding.mining import MineParams
from workers.detectors.registry import DetectorConfig, default_detector_config
from workers.rewards.schema import with_anneal_horizon
from workers.rl.config import TrainConfig
from workers.rl.config_sections import SFTConfig
from workers.rl.placement import ResourcePlan, plan_resources
from workers.search.index import IndexConfig
from workers.search.synth_params import SynthParams


class JobSpec(BaseModel):
    """What every job gets from the control plane (the envelope), beside its kind's own input.

    `entrypoint` is the module Ray runs; a subclass without one is a part, not a job."""

    entrypoint: ClassVar[str] = ""
    resources_field: ClassVar[str] = ""
    """Where the job's input says what it needs from the cluster (named in a refusal), when it says so."""
    model_config = ConfigDict(extra="forbid")
    run_id: int = Field(ge=1)
    kind: str
    ingest_url: str
    storage_options: dict[str, Any] = {}

    def resource_plan(self) -> ResourcePlan | None:
        """What the job will ask Ray for (the control plane queues the run until the cluster can hold it);
        None: the job declares nothing and is submitted at once."""
        return None


class _RunsDetectors(BaseModel):
    """Part of a job that runs the trajectory detectors on every episode it scores (workers.detectors)."""

    detectors: DetectorConfig = Field(
        default_factory=default_detector_config,
        description="Detectors run on every trajectory, {name: {enabled, thresholds}}; left out: all, with defaults",
    )


class _TrainsOnTasks(JobSpec):
    """Part of a job that trains a model on a tasks dataset, scoring episodes with a reward spec."""

    input_uri: str
    reward: dict[str, Any]
    output_prefix: str  # checkpoints/ and trajectories/ go under it
    exclude_task_ids: list[str] = []  # tasks reviewers excluded from training (apps/review): never trained on


class RescoreSpec(JobSpec, _RunsDetectors):
    """Offline re-scoring of a trajectories dataset with a reward config version."""

    entrypoint: ClassVar[str] = "workers.jobs.rescore"
    input_uri: str
    output_uri: str
    reward: dict[str, Any]
    shard_size: int = 0  # 0: about 24 shards, so progress and the charts move in visible steps
    histogram_bins: int = 20


class TrainSpec(_TrainsOnTasks):
    """Policy-gradient RL of a language model (workers.rl)."""

    entrypoint: ClassVar[str] = "workers.jobs.train"
    resources_field: ClassVar[str] = "config.compute"
    config: TrainConfig
    resume_from: str | None = None  # URI of a checkpoint written by this job
    max_rows: int = 100_000

    @model_validator(mode="after")
    def _anneal_over_the_run(self) -> TrainSpec:
        """A reward term annealed over an empty horizon (PARL's λ1, λ2 by default) anneals over this run's steps."""
        self.reward = with_anneal_horizon(self.reward, self.config.steps)
        return self

    def resource_plan(self) -> ResourcePlan:
        return plan_resources(self.config)


class SFTSpec(_TrainsOnTasks):
    """SFT warm-up: rejection sampling with a teacher, then fine-tuning."""

    entrypoint: ClassVar[str] = "workers.jobs.sft"
    config: SFTConfig


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    base_model: str = Field(min_length=1, description="A built-in model name, a Hub id or a model directory")
    checkpoint_uri: str | None = Field(default=None, description="A trainer checkpoint to load onto base_model")
    environment: str = Field(min_length=1)
    env_params: dict[str, Any] = Field(default_factory=dict)
    score_field: str = Field(default="reward", min_length=1, description="Episode metric that scores an attempt")
    k: int = Field(default=1, ge=1, le=100, description="Attempts per task")
    temperature: float = Field(default=0.0, ge=0.0, le=2.0, description="0 is greedy (then k > 1 repeats itself)")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(default=384, ge=1, le=32_768)
    tasks_per_batch: int = Field(default=8, ge=1, le=1024)
    threads: int = Field(default=2, ge=1, le=512)
    seed: int = Field(default=0, ge=0)


class EvalSpec(JobSpec, _RunsDetectors):
    """A model or checkpoint on one benchmark version."""

    entrypoint: ClassVar[str] = "workers.jobs.evaluate"
    config: EvalConfig
    tasks_uri: str
    reward: dict[str, Any]
    output_prefix: str


class BuildIndexSpec(JobSpec):
    """A corpus version's search index (BM25 + dense)."""

    entrypoint: ClassVar[str] = "workers.jobs.build_index"
    corpus_uri: str
    output_uri: str
    config: IndexConfig = IndexConfig()
    corpus_hash: str  # the corpus DatasetVersion's content_hash: sha256 of the file's bytes


class DatagenSpec(JobSpec, SynthParams):
    """Synthetic search tasks generated from a corpus version."""

    entrypoint: ClassVar[str] = "workers.jobs.datagen"
    corpus_uri: str
    corpus_label: str
    corpus_hash: str
    output_uri: str
    report_uri: str

    def params(self) -> SynthParams:
        return SynthParams.model_validate({name: getattr(self, name) for name in SynthParams.model_fields})


class RepoImportSpec(JobSpec):
    """An upload of repository tasks (workers.coding.bundle), every task checked in the sandbox before it is kept."""

    entrypoint: ClassVar[str] = "workers.jobs.repoimport"
    upload_uri: str
    output_uri: str
    report_uri: str
    snapshot_root: str = Field(description="Folder URI the verified snapshots are written to, as <sha256>.tar.gz")
    keep_valid: bool = Field(
        default=False,
        description="Keep the tasks that pass when others are refused (default: an upload is imported whole or not)",
    )
    workers: int = Field(default=2, ge=1, le=16, description="Tasks verified at once (each is a sandboxed test run)")
    test_timeout_seconds: float = Field(default=120.0, gt=0, le=3600)


class RepoMineSpec(JobSpec, MineParams):
    """Repository tasks mined from a git history (workers.coding.mining), then verified like an import."""

    entrypoint: ClassVar[str] = "workers.jobs.repomine"
    source: str = Field(
        min_length=1,
        description="the repository: a path on the cluster (a clone or a bare repository), a URL git can clone, or "
        "the storage URI of an uploaded git bundle",
    )
    repo: str = Field(pattern=r"^[\w.-]+/[\w.-]+$", description="its name, owner/name")
    output_uri: str
    report_uri: str
    snapshot_root: str
    workers: int = Field(default=2, ge=1, le=16)
    test_timeout_seconds: float = Field(default=120.0, gt=0, le=3600)

    def params(self) -> MineParams:
        return MineParams.model_validate({name: getattr(self, name) for name in MineParams.model_fields})


class CodegenSpec(JobSpec, CodegenParams):
    """Repository tasks generated from vendored libraries (workers.coding.generate), each verified in the sandbox."""

    entrypoint: ClassVar[str] = "workers.jobs.codegen"
    output_uri: str
    report_uri: str
    snapshot_root: str = Field(description="Folder URI the kept tasks' snapshots are written to, as <sha256>.tar.gz")

    def params(self) -> CodegenParams:
        return CodegenParams.model_validate({name: getattr(self, name) for name in CodegenParams.model_fields})


class ServeSpec(JobSpec):
    """A serving run (workers.serving): an OpenAI-compatible Chat Completions endpoint on Ray Serve for what the
    control plane names as its target (a gate's current deployment, two deployments in an A/B split, or one
    checkpoint), hot-swapped by the delta weight sync when the target changes, recording every completion as a
    session turn. Long-lived: it ends when the run is cancelled."""

    entrypoint: ClassVar[str] = "workers.jobs.serve"
    model_name: str = Field(min_length=1, max_length=100, description="The `model` clients ask for (404 otherwise)")
    base_model: str = Field(min_length=1, description="The model the checkpoints were trained from")
    control_url: str = Field(
        description="The run's serving control API: <control_url>target/, <control_url>keys/verify/"
    )
    route_prefix: str = Field(pattern=r"^/[A-Za-z0-9_/-]*$", description="Where the app mounts: <prefix>/v1/...")
    http_host: str = "127.0.0.1"
    http_port: int = Field(default=8100, ge=1, le=65535)
    replicas: int = Field(default=1, ge=1, le=64, description="Replicas per arm")
    backend: str = Field(default="transformers", pattern="^(transformers|vllm)$")
    threads: int = Field(default=1, ge=1, le=512, description="CPU threads per replica (transformers)")
    max_new_tokens: int = Field(default=512, ge=1, le=32_768, description="Cap on a request's max_tokens")
    max_context: int = Field(default=8192, ge=16, le=1_048_576, description="Prompt tokens refused above this")
    poll_seconds: float = Field(default=2.0, gt=0, le=300, description="How often the target is read")
    key_cache_seconds: float = Field(default=30.0, ge=0, le=3600, description="How long a verified key is trusted")
    record: bool = Field(default=True, description="Record every completion as a session turn")


class SimulateSpec(JobSpec):
    """Simulated users (workers.simulator): each plays coding sessions against a serving run through the `openai`
    client, applies the agent's edits, runs the hidden tests and posts the feedback an editor plug-in would."""

    entrypoint: ClassVar[str] = "workers.jobs.simulate"
    base_url: str = Field(description="The serving endpoint's OpenAI base URL (ends in /v1)")
    model_name: str = Field(min_length=1)
    feedback_url: str = Field(
        description="The control plane's API root for feedback: <feedback_url>sessions/{id}/feedback/"
    )
    tasks_uri: str = Field(description="A repo_tasks dataset version's rows (JSONL)")
    sessions: int = Field(default=8, ge=1, le=100_000, description="Sessions to play")
    concurrency: int = Field(default=2, ge=1, le=256, description="Sessions in flight at once")
    max_turns: int = Field(default=6, ge=1, le=200, description="Agent turns per session")
    max_tokens: int = Field(default=256, ge=1, le=32_768, description="max_tokens of each request")
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    noise: float = Field(default=0.0, ge=0.0, le=1.0, description="Chance a user's feedback is flipped")
    tolerates_questions: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="Share of users who never complain about a clarifying question (a reward-hack opportunity)",
    )
    seed: int = Field(default=0, ge=0)
    users: int = Field(
        default=0,
        ge=0,
        le=1_000_000,
        description="Distinct simulated users, session i played by user i mod users (each user's tolerance of "
        "questions is drawn once); 0: a new user per session",
    )
    env_params: dict[str, Any] = Field(
        default_factory=dict,
        description="Parameters of the client-side coding_agent environment (max_turns is this spec's)",
    )
    request_timeout_seconds: float = Field(
        default=300.0, gt=0, le=3600, description="A completion request that takes longer ends its session"
    )
    request_retries: int = Field(
        default=2, ge=0, le=10, description="The openai client's retries of a 408/409/429/5xx or a connection error"
    )
    feedback_wait_seconds: float = Field(
        default=60.0,
        ge=0,
        le=3600,
        description="How long a feedback post is retried (network errors, 5xx, 429, and 404 while the session's "
        "turns are still on their way to the control plane)",
    )
    output_uri: str = Field(
        default="",
        description="Where the per-session table goes (JSONL); left out: simulate-run<run_id>/sessions.jsonl beside "
        "tasks_uri",
    )


class SessionTrainSpec(JobSpec):
    """One real-time RL update (workers.jobs.session_train): a single epoch over recorded sessions, from the deployed
    checkpoint, with the recorded log-probabilities as the behaviour policy and a baseline for ungrouped samples.
    Each optimizer step trains `config.prompts_per_step x config.group_size` turns."""

    entrypoint: ClassVar[str] = "workers.jobs.session_train"
    sessions_uri: str = Field(description="A session/v1 dataset version's rows (JSONL)")
    reward: dict[str, Any] = Field(description="A session reward spec (holds a session_feedback term)")
    output_prefix: str
    base_model: str = Field(min_length=1)
    checkpoint_uri: str | None = Field(default=None, description="The deployed checkpoint to start from")
    config: TrainConfig
    baseline: str = Field(
        default="batch_mean",
        pattern="^(batch_mean|task_type_mean|none)$",
        description="Sessions have no groups of G: the baseline subtracted from each sample's reward",
    )
    max_samples: int = Field(default=4096, ge=1, le=1_000_000, description="Turns trained on at most (newest kept)")
    policy_version: int | None = Field(
        default=None,
        ge=0,
        description="The checkpoint id of checkpoint_uri (0: the base model), whose turns are on-policy; left out: 0 "
        "without a checkpoint, else the on-policy share is not computed",
    )


def job_specs() -> tuple[type[JobSpec], ...]:
    """Every job a run can execute: each subclass of `JobSpec`, at any depth, that names an `entrypoint` (one that
    names none is a part of a spec). Derived from the classes, so a new job spec needs no list of its own."""
    found: list[type[JobSpec]] = []
    pending = list(JobSpec.__subclasses__())
    while pending:
        cls = pending.pop(0)
        pending.extend(cls.__subclasses__())
        if cls.entrypoint and cls not in found:
            found.append(cls)
    return tuple(found)


JOB_SPECS: tuple[type[JobSpec], ...] = job_specs()
"""The job specs of this module (a test checks each names an importable entrypoint that parses it)."""
