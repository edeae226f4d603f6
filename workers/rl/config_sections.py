"""The sections of a training run's spec (`workers.rl.config.TrainConfig` holds them): sampling, LoRA, compute
and learner placement, the beta schedule, curriculum, hard-prompt upsampling, Toggle, the rollout-training mismatch
correction, stall limits, and the defaults an environment sets for its runs. Every default names its source in
`Field(description=...)`: the UI shows it as help text."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from workers.envs.registry import get_environment
from workers.rl.algorithms import (
    ALGORITHMS,
    Algorithm,
)
from workers.search.rejection import FilterConfig


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SamplingConfig(StrictModel):
    temperature: float = Field(default=1.0, ge=0.0, le=2.0, description="1.0: sample from the policy as is (on-policy)")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="1.0 keeps the whole distribution (on-policy)")
    max_new_tokens: int = Field(default=64, ge=1, le=4096, description="Completion length cap per turn")


class LoraConfig(StrictModel):
    rank: int = Field(
        default=16, ge=1, le=256, description="Context-1 trained gpt-oss-20b with LoRA (rank not published)"
    )
    alpha: int = Field(default=32, ge=1, le=1024, description="Scale = alpha / rank; 2x rank is the common default")
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    target_modules: tuple[str, ...] = Field(
        default=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        description="Linear layers that get adapters",
    )


RESERVED_RESOURCES = frozenset({"CPU", "GPU", "memory", "object_store_memory"})
"""Ray's own resource names: a role asks for these through cpus, gpus and memory_gb, not through `custom`."""


class RoleResources(StrictModel):
    """What one learner rank or one rollout engine needs from the cluster (Ray resources)."""

    cpus: float = Field(default=1, gt=0, le=512, description="CPUs (torch threads) for this actor")
    gpus: float = Field(default=0, ge=0, le=64, description="GPUs for this actor; 0 runs it on CPU")
    memory_gb: float = Field(default=0, ge=0, le=4096, description="Memory reserved for this actor; 0: none")
    custom: dict[str, float] = Field(
        default_factory=dict,
        description="Ray custom resources, e.g. {'engine_node': 1} to land on a node started with "
        "--resources='{\"engine_node\": 8}'",
    )

    @field_validator("custom")
    @classmethod
    def _custom_names(cls, value: dict[str, float]) -> dict[str, float]:
        for name, amount in value.items():
            if name in RESERVED_RESOURCES or not name or len(name) > 64:
                raise ValueError(
                    f"custom resource {name!r}: use a name of 1-64 characters other than "
                    f"{', '.join(sorted(RESERVED_RESOURCES))} (those are cpus, gpus and memory_gb)"
                )
            if not 0 < amount <= 1_000_000:
                raise ValueError(f"custom resource {name!r}: amount {amount} must be in (0, 1000000]")
        return value


class ComputeRequest(StrictModel):
    """Maps to Ray resources (`workers.rl.placement`). Either totals (`cpus`, `gpus`, `memory_gb`, split evenly
    over the learner ranks and engines) or what each learner rank and each engine needs (`per_rank`, `per_engine`;
    the totals then stay at their defaults and are not used). `placement` says whether the engines get their own
    devices (split: OpenRLHF, AReaL) or time-share the learner's (colocated: verl's hybrid engine; the engines
    sleep while the learner trains)."""

    cpus: float = Field(default=2, gt=0, le=512, description="CPUs for the run's actors (learner + rollout workers)")
    gpus: float = Field(default=0, ge=0, le=64, description="GPUs for the run's actors; 0 runs on CPU")
    memory_gb: float = Field(default=8, gt=0, le=4096, description="Memory reserved for the run's actors")
    rollout_workers: int = Field(default=1, ge=1, le=256, description="Rollout engines generating in parallel")
    placement: Literal["auto", "colocated", "split"] = Field(
        default="auto",
        description="colocated: engines time-share the learner's devices and sleep while it trains; split: "
        "engines on their own devices; auto: colocated in sync mode, split in async mode",
    )
    per_rank: RoleResources | None = Field(
        default=None, description="What one learner rank needs (instead of the totals)"
    )
    per_engine: RoleResources | None = Field(
        default=None, description="split only: what one rollout engine needs (instead of the totals)"
    )

    @model_validator(mode="after")
    def _totals_or_roles(self) -> ComputeRequest:
        roles = self.per_rank is not None or self.per_engine is not None
        # A total left at its default is not a request (a stored spec round-trips every field with its value).
        totals = [
            name
            for name in ("cpus", "gpus", "memory_gb")
            if getattr(self, name) != type(self).model_fields[name].default
        ]
        if roles and totals:
            raise ValueError(
                f"compute.{totals[0]} is a total, compute.per_rank / per_engine say what each actor needs: give "
                "one or the other"
            )
        if self.placement == "colocated" and self.per_engine is not None:
            raise ValueError(
                "compute.per_engine: colocated engines share the learner ranks' devices (compute.per_rank); use "
                "placement split to give engines their own"
            )
        return self


class LearnerConfig(StrictModel):
    """How the learner spreads over devices (`workers.rl.distributed`). `single`: one process, as before. `ddp`:
    `ranks` replicas (torch DistributedDataParallel) for a model that fits one device. `fsdp2`: parameters,
    gradients and optimizer state sharded over `ranks` (torch FSDP2, `fully_shard` per transformer block) for one
    that does not. Either way the update is the one a single learner would make on the same batch: the batch is
    split across ranks and every loss normaliser counts the whole batch."""

    strategy: Literal["single", "ddp", "fsdp2"] = Field(
        default="single", description="single: one process; ddp: replicated ranks; fsdp2: sharded ranks"
    )
    ranks: int = Field(default=1, ge=1, le=1024, description="Learner processes (one per GPU on GPU nodes)")
    mixed_precision: Literal["fp32", "bf16"] = Field(
        default="fp32",
        description="fsdp2 only: bf16 computes forward and backward in bfloat16 and reduces gradients in fp32",
    )
    cpu_offload: bool = Field(
        default=False, description="fsdp2 only: keep sharded parameters, gradients and optimizer state in CPU memory"
    )

    @model_validator(mode="after")
    def _coherent(self) -> LearnerConfig:
        if self.strategy == "single" and self.ranks != 1:
            raise ValueError(f"learner.ranks={self.ranks} needs learner.strategy ddp or fsdp2 (single is one process)")
        if self.strategy != "fsdp2" and (self.mixed_precision != "fp32" or self.cpu_offload):
            raise ValueError(
                "learner.mixed_precision and learner.cpu_offload are FSDP2 options: set learner.strategy to fsdp2 "
                "or leave them at fp32 / false"
            )
        return self


class BetaSchedule(StrictModel):
    """Context-1's F-beta anneal (docs/methods.md X3): beta = `start` in the first epoch, moving linearly to `end` by
    epoch `epochs` - 1 and staying there. It overrides the beta of every f_beta term of the reward config."""

    start: float = Field(default=4.0, ge=0, le=100, description="Context-1: 4 at initialisation (recall 16x)")
    end: float = Field(
        default=2.0, ge=0, le=100, description="Context-1: annealed to weight recall 4x (beta 2); 0 is precision"
    )
    epochs: int = Field(default=5, ge=1, le=10_000, description="Epochs over which beta moves (Context-1 ran 5)")

    def beta(self, epoch: int) -> float:
        if self.epochs <= 1:
            return self.end
        t = min(max(epoch, 0), self.epochs - 1) / (self.epochs - 1)
        return self.start + (self.end - self.start) * t


class CurriculumConfig(StrictModel):
    """Context-1's curriculum (docs/methods.md section 3, RL: "easy-skewed -> hard-skewed phase (by hops)"), off by
    default. A task is easy when its `hops` (the task row's field, as the multi-hop generator writes it) is at most
    `easy_at_most`. Steps before `switch_at` x steps draw easy tasks with weight `skew` and hard ones with 1; later
    steps the reverse. Each step draws its prompts without replacement with probabilities proportional to those
    weights (`workers.rl.sampling.weighted_order`); the share of hard tasks drawn is charted per step."""

    by: Literal["off", "hops"] = Field(
        default="off", description="off: no curriculum. hops: easy (few hops) first, then hard (Context-1)"
    )
    easy_at_most: int = Field(default=1, ge=0, le=100, description="A task with at most this many hops is easy")
    switch_at: float = Field(
        default=0.5, ge=0.0, le=1.0, description="Share of the steps in the easy-skewed phase (then hard-skewed)"
    )
    skew: float = Field(default=3.0, gt=1.0, le=100.0, description="Weight of the favoured kind (the other: 1)")


class UpsampleHardConfig(StrictModel):
    """Composer 2's hard-data upsampling ("later stages upsample hard data by #turns and thinking tokens",
    docs/methods.md section 2), off by default: a departure from uniform sampling is the run's choice.

    A task's *need* is what one rollout of it took: its turns (`Sample.num_turns`) or its sampled tokens
    (`Sample.sampled_tokens`: every token the policy generated, summaries and tool calls included). The trainer
    keeps the running mean need m_t of each task over its past rollouts, and M, the mean of m_t over the tasks
    rolled out so far. A task's weight is

        w_t = min(max_weight, 1 + strength * max(0, m_t / M - 1))

    and 1 for a task never rolled out (or when M is 0). Each step draws its prompts without replacement with
    probabilities proportional to w (`workers.rl.sampling.weighted_order`)."""

    by: Literal["off", "turns", "tokens"] = Field(
        default="off",
        description="off: uniform (a seeded shuffle per epoch). turns or tokens: weigh tasks by the turns or sampled "
        "tokens their past rollouts needed (Composer 2 upsamples hard data in later stages)",
    )
    strength: float = Field(
        default=1.0, ge=0.0, le=100.0, description="How fast the weight grows above the mean need (0: uniform draws)"
    )
    max_weight: float = Field(default=4.0, ge=1.0, le=1000.0, description="Cap on a task's weight (1: uniform draws)")

    @property
    def enabled(self) -> bool:
        return self.by != "off"

    def describe(self) -> str:
        if not self.enabled:
            return "off"
        return f"by {self.by}, strength {self.strength:g}, max_weight {self.max_weight:g}"


class ToggleConfig(BaseModel):
    """K4/K5's settings (the run spec's `toggle`; JSON writes `lambda`)."""

    lambda_: float = Field(
        default=0.5,
        alias="lambda",
        ge=0.0,
        le=1.0,
        description="K4's λ: a group whose mean reward is below it keeps every reward (ours: 0.5)",
    )
    m: int = Field(default=10, ge=1, le=1_000_000, description="K4's m: steps per phase (ours: 10)")
    rho: float = Field(
        default=75.0, gt=0.0, le=100.0, description="K5's ρ: the percentile of correct lengths that is the budget"
    )
    correct_at: float = Field(
        default=1.0, description="A sample is correct (counts towards the budget) when its task reward reaches this"
    )
    budget_from: Literal["prepass", "first_rollout"] = Field(
        default="prepass",
        description="prepass: roll every task out once before step 1 (the source); first_rollout: each task's "
        "first group (no extra pass)",
    )

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    def describe(self) -> str:
        return (
            f"λ {self.lambda_:g}, m {self.m}, ρ {self.rho:g}, correct at {self.correct_at:g}, budget from "
            f"{self.budget_from}"
        )


def environment_default_algorithm(environment: str) -> Algorithm | None:
    """The algorithm environment `environment` trains with when a run names none (`Environment.default_algorithm`);
    None for an unknown environment (the environment check names it) or one without a default. Raises ValueError
    when an environment declares an algorithm that does not exist."""

    try:
        declared = get_environment(environment).default_algorithm
    except ValueError:
        return None
    if declared is None:
        return None
    for algorithm in ALGORITHMS:
        if algorithm == declared:
            return algorithm
    raise ValueError(
        f"environment {environment!r} declares default_algorithm={declared!r}, which is not one of "
        f"{', '.join(ALGORITHMS)}: fix the environment class"
    )


def _environment_default_int(environment: str, attribute: str, bounds: tuple[int, int]) -> int | None:
    """An environment's declared integer recipe default `attribute`; None for an unknown environment or one without
    it. Raises ValueError when an environment declares a value out of `bounds`."""

    try:
        declared = getattr(get_environment(environment), attribute)
    except ValueError:
        return None
    if declared is None:
        return None
    low, high = bounds
    if isinstance(declared, bool) or not isinstance(declared, int) or not low <= declared <= high:
        raise ValueError(
            f"environment {environment!r} declares {attribute}={declared!r}, which is not an integer in "
            f"[{low}, {high}]: fix the environment class"
        )
    return declared


def environment_default_substeps(environment: str) -> int | None:
    """The gradient substeps per step of a run on environment `environment` that names none
    (`Environment.default_substeps`, e.g. Context-1's 4 for search); None for an unknown environment or one without
    a default (the trainer's own, 1). Raises ValueError when an environment declares a value out of range."""
    return _environment_default_int(environment, "default_substeps", SUBSTEPS_RANGE)


def environment_default_group_size(environment: str) -> int | None:
    """The completions per prompt of a run on environment `environment` that names none
    (`Environment.default_group_size`, e.g. Context-1's 8 for search); None for an unknown environment or one
    without a default (the trainer's own, 4). Raises ValueError when an environment declares a value out of range."""
    return _environment_default_int(environment, "default_group_size", GROUP_SIZE_RANGE)


def environment_default_max_new_tokens(environment: str) -> int | None:
    """The per-turn sampling cap of a run on environment `environment` that names none
    (`Environment.default_max_new_tokens`, e.g. 256 for search); None for an unknown environment or one without a
    default (`SamplingConfig`'s 64). Raises ValueError when an environment declares a value out of range."""
    return _environment_default_int(environment, "default_max_new_tokens", MAX_NEW_TOKENS_RANGE)


def sampling_cap_default(data: dict[str, Any], environment: Any) -> dict[str, Any]:
    """`sampling.max_new_tokens` from the environment's `default_max_new_tokens` when a training run's or an SFT
    job's config (`data`, before validation) names none, recorded in `max_new_tokens_default_of`; a named cap is
    kept, so a stored config round-trips unchanged."""
    sampling = data.get("sampling")
    if isinstance(sampling, SamplingConfig):
        named = "max_new_tokens" in sampling.model_fields_set
        sampling = sampling.model_dump()
    elif isinstance(sampling, Mapping):
        named = sampling.get("max_new_tokens") is not None
        sampling = {k: v for k, v in sampling.items() if not (k == "max_new_tokens" and v is None)}
    elif sampling is None:
        named, sampling = False, {}
    else:
        return data  # not a mapping: the field's own validation names the problem
    if named:
        return data
    data = {key: value for key, value in data.items() if key != "max_new_tokens_default_of"}
    resolved = environment_default_max_new_tokens(environment) if isinstance(environment, str) else None
    if resolved is not None:
        data.update({"sampling": {**sampling, "max_new_tokens": resolved}, "max_new_tokens_default_of": environment})
    return data


MAX_NEW_TOKENS_RANGE = (1, 4096)
SUBSTEPS_RANGE = (1, 64)
FALLBACK_SUBSTEPS = 1
"""The gradient substeps of a run that names none, on an environment without a `default_substeps`."""
GROUP_SIZE_RANGE = (2, 1024)
FALLBACK_GROUP_SIZE = 4
"""The completions per prompt of a run that names none, on an environment without a `default_group_size`."""


Correction = Literal["none", "tis", "mis", "seq_tis", "seq_mis"]
CORRECTIONS: tuple[Correction, ...] = ("none", "tis", "mis", "seq_tis", "seq_mis")
DEFAULT_MISMATCH_CAP = 2.0


class MismatchConfig(StrictModel):
    """A run's train-inference mismatch correction (part of its spec). Measuring is always on."""

    correction: Correction = Field(
        default="none",
        description="Importance-sampling correction of the engine/learner gap (docs/methods.md P7): none; tis "
        "(token-level truncated IS, min(r, C)); mis (token-level masked IS, r or 0 above C); seq_tis or seq_mis "
        "(on the sequence's geometric-mean ratio). Off by default: on CPU both sides compute in fp32. Any other "
        "than none recomputes π_old with the learner before each step (one more forward pass)",
    )
    cap: float = Field(
        default=DEFAULT_MISMATCH_CAP,
        description="C: the truncation cap of tis/seq_tis, the mask threshold of mis/seq_mis, and the band "
        "[1/C, C] outside which a token counts as mismatched; > 1",
    )

    @field_validator("cap")
    @classmethod
    def _cap_above_one(cls, value: float) -> float:
        if not math.isfinite(value) or value <= 1.0 or value > 1e6:
            raise ValueError(f"cap must be a finite number > 1 and <= 1e6 (the common choice is 2); got {value!r}")
        return value


class StallLimits(StrictModel):
    """Per-phase limits of the stall watchdog (seconds without an event while the job says it is in that phase);
    an empty one is `stall_after_seconds`. The trainer reports each phase as it enters it."""

    generation: int | None = Field(default=None, ge=1, le=7 * 24 * 3600, description="Waiting for rollouts")
    training: int | None = Field(default=None, ge=1, le=7 * 24 * 3600, description="The learner's update")
    weight_sync: int | None = Field(
        default=600, ge=1, le=7 * 24 * 3600, description="Learner to engines: encode, transfer, load"
    )
    evaluation: int | None = Field(default=None, ge=1, le=7 * 24 * 3600, description="An eval job's episodes")


class SFTConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    teacher_model: str = Field(
        default="smollm2-135m-instruct",
        min_length=1,
        description=(
            "Generates the trajectories: a model, or a scripted agent: 'scripted-search' (workers.search.teacher) "
            "for search, 'scripted-coding' (workers.coding.scripted) for coding_agent ('scripted-coding-search': the "
            "same agent finding the function the instruction names by search, as a student can), 'scripted-swarm' "
            "(workers.swarm.scripted, the orchestrator that fans items out to sub-agents) for swarm"
        ),
    )
    base_model: str = Field(default="smollm2-135m-instruct", min_length=1, description="The model fine-tuned on them")
    checkpoint_uri: str | None = Field(
        default=None,
        description="A trainer checkpoint of base_model whose weights the fine-tuning starts from (RFT after RL)",
    )
    environment: str = Field(default="search", min_length=1)
    env_params: dict[str, Any] = Field(default_factory=dict)
    rollouts_per_task: int = Field(default=4, ge=1, le=64, description="Episodes per task before filtering")
    max_tasks: int = Field(default=64, ge=1, le=100_000)
    filter: FilterConfig = Field(default_factory=lambda: FilterConfig())
    epochs: int = Field(default=2, ge=1, le=100)
    learning_rate: float = Field(default=1e-5, gt=0, le=1.0)
    max_tokens_per_pack: int = Field(default=4096, ge=64, le=1_048_576)
    max_grad_norm: float = Field(default=1.0, gt=0)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    max_new_tokens_default_of: str | None = Field(
        default=None,
        description="Filled in when the job names no sampling.max_new_tokens and its environment has a default "
        "(a model teacher's replies on search: 256): that environment's name. Not a choice",
    )
    threads: int = Field(default=2, ge=1, le=512)
    seed: int = Field(default=0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _environment_cap(cls, data: Any) -> Any:
        """A model teacher samples as a training run on the same environment would (`sampling_cap_default`)."""
        if not isinstance(data, dict):
            return data
        return sampling_cap_default(data, data.get("environment", cls.model_fields["environment"].default))

    @model_validator(mode="after")
    def _cap_default_names_this_environment(self) -> SFTConfig:
        if self.max_new_tokens_default_of not in (None, self.environment):
            raise ValueError(
                f"max_new_tokens_default_of={self.max_new_tokens_default_of!r} names another environment than "
                f"{self.environment!r}: it is filled in when no max_new_tokens is named; leave it out"
            )
        return self
