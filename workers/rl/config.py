"""The training run's spec: what a person chooses when launching a run, validated by the same typed schema in the
control plane (at launch, so a bad value is refused before any compute starts) and in the trainer job.

Every default names its source in `Field(description=...)`: the UI shows it as help text.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from workers.detectors.registry import DetectorConfig, default_detector_config
from workers.envs.registry import get_environment
from workers.models.registry import ModelShape
from workers.rl.algorithms import (
    ALGORITHMS,
    DEFAULT_DYNAMIC_SAMPLING_MAX_ROUNDS,
    DEFAULT_MAX_COMPLETION_LENGTH,
    METHOD_DEFAULTS,
    Algorithm,
    EffectiveSettings,
    LossConfig,
    SettingRow,
    effective_settings,
    environment_max_turns,
    loss_config,
)
from workers.rl.capacity import rank_memory
from workers.rl.placement import plan_resources

__all__ = [
    "Algorithm",
    "LossConfig",
    "TrainConfig",
    "UpsampleHardConfig",
    "effective_settings",
    "environment_default_algorithm",
    "environment_default_group_size",
    "environment_default_substeps",
    "loss_config_for",
    "settings_for",
]

FALLBACK_ALGORITHM: Algorithm = "grpo"
"""The algorithm of a run that names none, on an environment without a `default_algorithm`."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SamplingConfig(_Strict):
    temperature: float = Field(default=1.0, ge=0.0, le=2.0, description="1.0: sample from the policy as is (on-policy)")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="1.0 keeps the whole distribution (on-policy)")
    max_new_tokens: int = Field(default=64, ge=1, le=4096, description="Completion length cap per turn")


class LoraConfig(_Strict):
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


class RoleResources(_Strict):
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


class ComputeRequest(_Strict):
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


class LearnerConfig(_Strict):
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


class BetaSchedule(_Strict):
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


class CurriculumConfig(_Strict):
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


class UpsampleHardConfig(_Strict):
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


SUBSTEPS_RANGE = (1, 64)
FALLBACK_SUBSTEPS = 1
"""The gradient substeps of a run that names none, on an environment without a `default_substeps`."""
GROUP_SIZE_RANGE = (2, 1024)
FALLBACK_GROUP_SIZE = 4
"""The completions per prompt of a run that names none, on an environment without a `default_group_size`."""


Correction = Literal["none", "tis", "mis", "seq_tis", "seq_mis"]
CORRECTIONS: tuple[Correction, ...] = ("none", "tis", "mis", "seq_tis", "seq_mis")
DEFAULT_MISMATCH_CAP = 2.0


class MismatchConfig(_Strict):
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


class StallLimits(_Strict):
    """Per-phase limits of the stall watchdog (seconds without an event while the job says it is in that phase);
    an empty one is `stall_after_seconds`. The trainer reports each phase as it enters it."""

    generation: int | None = Field(default=None, ge=1, le=7 * 24 * 3600, description="Waiting for rollouts")
    training: int | None = Field(default=None, ge=1, le=7 * 24 * 3600, description="The learner's update")
    weight_sync: int | None = Field(
        default=600, ge=1, le=7 * 24 * 3600, description="Learner to engines: encode, transfer, load"
    )
    evaluation: int | None = Field(default=None, ge=1, le=7 * 24 * 3600, description="An eval job's episodes")


class TrainConfig(_Strict):
    base_model: str = Field(
        default="smollm2-135m-instruct",
        min_length=1,
        description="A built-in model name or a local directory with config.json (nothing downloads)",
    )
    checkpoint_uri: str | None = Field(
        default=None,
        description=(
            "A trainer checkpoint of base_model whose policy (LoRA merged) the run starts from instead of "
            "base_model's own weights: a new run from another run's checkpoint (SFT → RL → RL). Not a resume: the "
            "step counter, optimizer and data order start fresh (resume a run for those)"
        ),
    )
    backend: Literal["transformers", "vllm"] = Field(
        "transformers", description="Rollout inference: transformers (CPU or GPU) or vLLM (GPU clusters)"
    )
    environment: str = Field(default="exact_answer", min_length=1, description="Episode environment (workers/envs)")
    env_params: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the environment")
    algorithm: Algorithm = Field(
        default=FALLBACK_ALGORITHM,
        description="Policy loss and its method's defaults (docs/methods.md section 4; composer: Composer 2 C1/C2). "
        "Empty: the environment's default algorithm (coding_agent: composer), else grpo",
    )
    algorithm_default_of: str | None = Field(
        default=None,
        description="Filled in when the run names no algorithm and its environment has a default: that "
        "environment's name (the run page says where the algorithm came from). Not a choice",
    )
    substeps_default_of: str | None = Field(
        default=None,
        description="Filled in when the run names no substeps and its environment has a default (search: "
        "Context-1's 4): that environment's name. Not a choice",
    )
    group_size_default_of: str | None = Field(
        default=None,
        description="Filled in when the run names no group_size and its environment has a default (search: "
        "Context-1's 8): that environment's name. Not a choice",
    )
    loss: dict[str, Any] = Field(
        default_factory=dict,
        description="Overrides of the algorithm's loss defaults (epsilon_low, epsilon_high, kl_coef, kl_estimator, "
        "kl_placement, cispo_mask)",
    )
    scale_rewards: Literal["none", "group"] | None = Field(
        default=None,
        description="Empty: the algorithm's. 'group' divides advantages by the group std (GRPO P1, DAPO, CISPO, "
        "GSPO); 'none' does not (Dr. GRPO P2, Composer 2 C1)",
    )
    drop_equal_groups: bool | None = Field(
        default=None,
        description="Empty: the algorithm's. Skip groups whose rewards are all equal (advantage 0); the normaliser "
        "still counts them for GRPO, Dr. GRPO and GSPO. Off for GRPO, whose KL term covers every sequence",
    )
    learning_rate: float = Field(default=1e-6, ge=0, le=1.0, description="DeepSeekMath GRPO used 1e-6 (P1)")
    weight_decay: float = Field(default=0.0, ge=0, le=1.0)
    max_grad_norm: float = Field(default=1.0, gt=0, description="Gradient clipping by global norm")
    steps: int = Field(default=20, ge=1, le=1_000_000, description="Optimizer steps")
    prompts_per_step: int = Field(default=8, ge=1, le=65_536, description="Distinct prompts per step (batch size)")
    group_size: int = Field(
        default=FALLBACK_GROUP_SIZE,
        ge=GROUP_SIZE_RANGE[0],
        le=GROUP_SIZE_RANGE[1],
        description="Completions per prompt, G (Context-1: 8; GRPO: 64). Empty: the environment's recipe default "
        "(search: 8), else 4",
    )
    lora: LoraConfig | None = Field(
        default=None, description="None trains every parameter (Composer 2: full parameters)"
    )
    gradient_checkpointing: bool = Field(
        default=False, description="Recompute activations: less memory, about 30% slower"
    )
    mode: Literal["sync", "async"] = Field(
        "sync", description="'async' generates step t+1's rollouts while step t trains (PipelineRL-style)"
    )
    max_staleness: int = Field(
        default=1, ge=0, le=64, description="Async: oldest policy version a sample may come from"
    )
    partial_rollout: bool = Field(
        default=False,
        description="Async: engines take new weights between the turns of running episodes (AReaL's interruptible "
        "generation, verl's partial rollout); each token keeps the version that sampled it, the loss its recorded "
        "log-probs, and tokens over max_staleness leave the loss. Off: new weights wait for the running rollout",
    )
    weight_sync: Literal["full", "delta"] = Field(
        "delta", description="Delta: XOR of bit patterns + zstd, rebuilt bit-for-bit (Composer 2 C5)"
    )
    checkpoint_every: int = Field(default=10, ge=1, description="Steps between checkpoints to object storage")
    substeps: int = Field(
        default=FALLBACK_SUBSTEPS,
        ge=SUBSTEPS_RANGE[0],
        le=SUBSTEPS_RANGE[1],
        description="Optimizer steps per rollout batch: the batch's groups split into this many minibatches, one "
        "optimizer step each, ratios against the rollout's log-probs (Context-1: 4; 1: one step on the whole "
        "batch). Empty: the environment's recipe default (search: 4), else 1",
    )
    max_tokens_per_pack: int = Field(
        1024, ge=64, le=1_048_576, description="Learner micro-batch in packed tokens: bounds activation memory"
    )
    trajectory_samples_per_step: int = Field(default=2, ge=0, le=1024, description="Full trajectories kept in storage")
    seed: int = Field(default=0, ge=0)
    beta_schedule: BetaSchedule | None = Field(
        default=None, description="Anneal the reward's F-beta between epochs (Context-1 X3); None keeps its beta"
    )
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    dynamic_sampling: bool | None = Field(
        default=None,
        validate_default=True,  # the algorithm's default is checked against drop_equal_groups too
        description="Empty: the algorithm's (on for DAPO). Over-sample, leave out groups whose task rewards are all "
        "equal and refill the batch (DAPO P3)",
    )
    dynamic_sampling_max_rounds: int = Field(
        default=DEFAULT_DYNAMIC_SAMPLING_MAX_ROUNDS,
        ge=1,
        le=64,
        description="Dynamic sampling: generation rounds per step, the first included; a batch still short after "
        "them trains as it is",
    )
    overlong_penalty: bool | None = Field(
        default=None,
        description="Empty: the algorithm's (on for DAPO). Add DAPO's soft overlong penalty (P3 eq. 13) to the "
        "reward, with L_max = max_new_tokens x the environment's max_turns",
    )
    overlong_cache_tokens: int | None = Field(
        default=None, ge=1, description="L_cache of the overlong penalty; empty: a fifth of L_max (DAPO: 4096/20480)"
    )
    curriculum: CurriculumConfig = Field(
        default_factory=CurriculumConfig,
        description="Easy-skewed then hard-skewed prompt draws by hop count (Context-1); off: uniform",
    )
    upsample_hard: UpsampleHardConfig = Field(
        default_factory=UpsampleHardConfig,
        description="Draw each step's prompts with weights that grow with the turns or tokens their past rollouts "
        "needed (Composer 2's hard-data upsampling); off: uniform",
    )
    toggle: ToggleConfig | None = Field(
        default=None,
        description="Kimi K2.5's Toggle (K4/K5): in alternate phases of m steps, zero the reward of correct samples "
        "longer than their task's budget (a percentile of correct lengths fixed at the start) unless the group is "
        "still mostly failing; None: off",
    )
    mismatch: MismatchConfig = Field(
        default_factory=MismatchConfig,
        description="Train-inference mismatch (docs/methods.md P7): the engine's and the learner's log-probs are "
        "compared every step (charted under mismatch/); an optional importance-sampling correction with its cap",
    )
    stall_after_seconds: int = Field(
        default=1800,
        ge=1,
        le=7 * 24 * 3600,
        description="The stall watchdog marks the run stalled (with stack dumps of its processes) when its job sends "
        "no event for this long: longer than the slowest step, checkpoint or eval it can take",
    )
    stall_limits: StallLimits = Field(
        default_factory=StallLimits,
        description="Per-phase stall limits (generation, training, weight_sync, evaluation); empty: "
        "stall_after_seconds. A weight sync rarely takes minutes: its limit is 600 s",
    )
    weight_sync_budget_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="A step whose weight sync (learner to every engine) takes longer is a finding on the health panel",
    )
    compute: ComputeRequest = Field(default_factory=ComputeRequest)
    learner: LearnerConfig = Field(
        default_factory=LearnerConfig,
        description="The learner's strategy across devices: single, ddp or fsdp2 over `ranks` processes",
    )
    detectors: DetectorConfig = Field(
        default_factory=default_detector_config,
        description="Reward-hacking detectors run on every episode, {name: {enabled, thresholds}} "
        "(workers/detectors); a detector left out runs with its defaults",
    )

    @model_validator(mode="before")
    @classmethod
    def _environment_defaults(cls, data: Any) -> Any:
        """A run that names no algorithm (absent or null) gets its environment's `default_algorithm` (recorded in
        `algorithm_default_of`), or grpo when the environment has none; likewise a run that names no `substeps`
        gets the environment's `default_substeps` (recorded in `substeps_default_of`), or 1, and one that names no
        `group_size` its `default_group_size` (`group_size_default_of`), or 4. A named value is kept, so a stored
        config (which holds the resolved values) round-trips unchanged."""
        if not isinstance(data, dict):
            return data
        environment = data.get("environment", cls.model_fields["environment"].default)
        for field, lookup in (
            ("algorithm", environment_default_algorithm),
            ("substeps", environment_default_substeps),
            ("group_size", environment_default_group_size),
        ):
            if data.get(field) is not None:
                continue
            resolved = lookup(environment) if isinstance(environment, str) else None
            data = {key: value for key, value in data.items() if key not in (field, f"{field}_default_of")}
            if resolved is not None:
                data.update({field: resolved, f"{field}_default_of": environment})
        return data

    @field_validator("loss")
    @classmethod
    def _loss_overrides(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        algorithm = info.data.get("algorithm")
        if algorithm is not None:
            loss_config(algorithm, value, max_completion_length=DEFAULT_MAX_COMPLETION_LENGTH)  # raises naming it
        return value

    @field_validator("learner")
    @classmethod
    def _learner_fits(cls, value: LearnerConfig, info: ValidationInfo) -> LearnerConfig:
        if value.strategy == "fsdp2" and info.data.get("lora") is not None:
            raise ValueError(
                "learner.strategy fsdp2 does not train LoRA adapters here (they are small enough to replicate): use "
                "learner.strategy ddp with lora, or full-parameter training with fsdp2"
            )
        return value

    @field_validator("dynamic_sampling")
    @classmethod
    def _dynamic_sampling_drops(cls, value: bool | None, info: ValidationInfo) -> bool | None:
        algorithm = info.data.get("algorithm")
        dynamic = value if value is not None or algorithm is None else METHOD_DEFAULTS[algorithm].dynamic_sampling
        if dynamic and info.data.get("drop_equal_groups") is False:
            raise ValueError(
                "dynamic sampling leaves out groups whose rewards are all equal and refills the batch, so it cannot "
                "run with drop_equal_groups false: unset drop_equal_groups, or set dynamic_sampling to false"
            )
        return value

    @field_validator("overlong_cache_tokens")
    @classmethod
    def _cache_within_the_limit(cls, value: int | None, info: ValidationInfo) -> int | None:
        sampling, environment = info.data.get("sampling"), info.data.get("environment")
        if value is None or sampling is None or environment is None:
            return value
        turns = environment_max_turns(environment, info.data.get("env_params") or {})
        limit = sampling.max_new_tokens * (turns or 1)
        if turns is not None and value > limit:
            raise ValueError(
                f"L_cache={value} is more than L_max={limit} (sampling.max_new_tokens x the environment's "
                f"max_turns): set it to at most {limit}, or leave it empty for a fifth of L_max"
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        plan = plan_resources(self)
        if self.backend == "vllm" and plan.engine_gpus <= 0:
            raise ValueError(
                "backend 'vllm' needs a GPU for each engine (compute.gpus or compute.per_engine.gpus); use "
                "'transformers' on CPU"
            )
        if plan.placement == "colocated" and self.mode == "async":
            raise ValueError(
                "compute.placement colocated time-shares the devices between generation and training, and mode "
                "'async' overlaps them: use placement split (or auto) with async"
            )
        if self.mode == "async" and self.max_staleness < 1:
            raise ValueError(
                "mode 'async' trains on samples one policy version old: set max_staleness >= 1, or use 'sync'"
            )
        if self.partial_rollout and self.mode != "async":
            raise ValueError(
                "partial_rollout lets weights change between the turns of a rollout that runs while the learner "
                "trains: it needs mode 'async' (or set partial_rollout false)"
            )
        if self.curriculum.by != "off" and self.upsample_hard.enabled:
            raise ValueError(
                "curriculum and upsample_hard both choose each step's prompts: turn one of them off "
                "(curriculum.by 'off' or upsample_hard.by 'off')"
            )
        if self.algorithm == "gspo" and self.mismatch.correction in ("tis", "mis"):
            raise ValueError(
                f"mismatch.correction {self.mismatch.correction!r} weights tokens, and gspo's ratio and clip are per "
                "sequence: use seq_tis or seq_mis with gspo"
            )
        for field in ("algorithm", "substeps", "group_size"):
            default_of = getattr(self, f"{field}_default_of")
            if default_of is not None and default_of != self.environment:
                raise ValueError(
                    f"{field}_default_of={default_of!r} names another environment than {self.environment!r}: it "
                    f"is filled in when no {field} is named; leave it out"
                )
        return self


UPSAMPLE_HARD_SOURCE = (
    "Composer 2 upsamples hard data by #turns and thinking tokens in later stages: a task's weight is "
    "min(max_weight, 1 + strength * max(0, m / M - 1)), m its rollouts' mean need, M the mean over tasks seen; "
    "off draws uniformly"
)


def settings_for(config: TrainConfig) -> EffectiveSettings:
    """The run's effective algorithm settings: its method's defaults merged with its overrides
    (`workers.rl.algorithms.effective_settings`, with the environment's real `max_turns`), and how it samples
    its prompts (`upsample_hard`: a row always, a note when on and the method samples uniformly)."""
    settings = effective_settings(config)
    upsample = config.upsample_hard
    row = SettingRow("upsample_hard", upsample.describe(), upsample.enabled, UPSAMPLE_HARD_SOURCE)
    notes = settings.notes
    if upsample.enabled and config.algorithm != "composer":
        notes += (
            f"upsample_hard is on ({upsample.describe()}): prompts are drawn with weights that favour tasks whose "
            f"rollouts needed more {upsample.by}, not uniformly as {config.algorithm}'s source does.",
        )
    toggle = config.toggle
    toggle_row = SettingRow("toggle", toggle.describe() if toggle else "off", toggle is not None, TOGGLE_SOURCE)
    if toggle is not None and toggle.budget_from == "first_rollout":
        notes += (
            "toggle.budget_from is first_rollout: each task's budget comes from its first rolled-out group, not from "
            "a pass over every task at the start of training (Kimi K2.5 K5).",
        )
    return dataclasses.replace(settings, rows=(*settings.rows, row, toggle_row), notes=notes)


TOGGLE_SOURCE = (
    "Kimi K2.5 K4/K5: in phase 0 (⌊t/m⌋ even) a correct sample longer than its task's budget (the ρ-th percentile "
    "of correct lengths, fixed at the start) gets reward 0 unless its group's mean reward is below λ; λ, m, ρ are "
    "ours (the source gives none). Off by default"
)


def loss_config_for(config: TrainConfig) -> LossConfig:
    """The algorithm's loss defaults (with their sources), overridden by the run's `loss` settings; Dr. GRPO's
    constant normaliser is the most tokens the policy can sample in one episode. Raises ValueError naming an
    unknown or invalid setting."""
    return settings_for(config).loss


def shape_from_hf_config(config: Mapping[str, Any]) -> ModelShape:
    hidden, layers, vocab = int(config["hidden_size"]), int(config["num_hidden_layers"]), int(config["vocab_size"])
    intermediate = int(config.get("intermediate_size", 4 * hidden))
    return ModelShape(
        parameters=layers * (4 * hidden * hidden + 3 * hidden * intermediate) + 2 * vocab * hidden,
        layers=layers,
        hidden=hidden,
        vocab=vocab,
    )


def estimate_memory_gb(config: TrainConfig, shape: ModelShape) -> dict[str, float]:
    """A conservative estimate of the run's peak memory (fp32), calibrated on SmolLM2-135M on CPU
    (machine-notes.md: batch 8 x 256 tokens peaked at 8 GB, 4.4 GB with gradient checkpointing).

    Learner: weights, gradients and AdamW's two moments (16 bytes/parameter; LoRA trains few, so 4 + a little),
    a reference copy when the KL term is on, activations of one packed micro-batch (about 160 bytes per layer
    and hidden unit per token, 40% of that with checkpointing) and its completion logits. A learner of several
    ranks (ddp, fsdp2) counts every rank as `workers.rl.capacity.rank_memory` estimates it (state replicated or
    sharded, each rank its own micro-batch). Each rollout worker:
    the weights and a KV cache."""
    gb = 1024**3
    p = shape.parameters
    full = config.lora is None
    learner = (16 * p if full else 4.2 * p) / gb
    kl = loss_config_for(config).kl_coef
    reference = 4 * p / gb if (kl and full) else 0.0
    per_token = 160 * shape.layers * shape.hidden * (0.4 if config.gradient_checkpointing else 1.0)
    tokens = config.max_tokens_per_pack
    activations = (tokens * per_token + tokens * shape.vocab * 8) / gb
    if config.learner.strategy != "single":  # every rank: its state (whole or sharded) and its own micro-batch
        rank = rank_memory(
            shape,
            config.learner.strategy,
            config.learner.ranks,
            tokens=tokens,
            mixed_precision=config.learner.mixed_precision == "bf16",
            cpu_offload=config.learner.cpu_offload,
            gradient_checkpointing=config.gradient_checkpointing,
            reference=bool(kl and full),
        )
        ranks = config.learner.ranks
        learner = sum(v for k, v in rank.parts.items() if k != "activations") * ranks
        activations, reference = rank.parts["activations"] * ranks, 0.0  # the reference is in the rank's parts
    context = config.sampling.max_new_tokens + 256  # a typical prompt plus one turn's completion
    # K and V per layer per token; grouped-query attention (SmolLM2, Llama 3, Qwen) keeps well under half the width.
    kv = 2 * shape.layers * (shape.hidden // 2) * 4 * context * config.prompts_per_step * config.group_size
    rollout = config.compute.rollout_workers * (4 * p + kv) / gb
    total = learner + reference + activations + rollout
    return {
        "learner_state": round(learner, 2),
        "reference": round(reference, 2),
        "activations": round(activations, 2),
        "rollout_workers": round(rollout, 2),
        "total": round(total, 2),
    }
