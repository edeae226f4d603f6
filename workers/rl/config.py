"""The training run's spec: what a person chooses when launching a run, validated by the same typed schema in the
control plane (at launch, so a bad value is refused before any compute starts) and in the trainer job.

Every default names its source in `Field(description=...)`: the UI shows it as help text.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from workers.detectors.registry import DetectorConfig, default_detector_config
from workers.models.registry import ModelShape
from workers.rl.algorithms import (
    DEFAULT_DYNAMIC_SAMPLING_MAX_ROUNDS,
    DEFAULT_MAX_COMPLETION_LENGTH,
    METHOD_DEFAULTS,
    Algorithm,
    LossConfig,
    loss_config,
)
from workers.rl.capacity import rank_memory
from workers.rl.config_sections import (
    FALLBACK_GROUP_SIZE,
    FALLBACK_SUBSTEPS,
    GROUP_SIZE_RANGE,
    SUBSTEPS_RANGE,
    BetaSchedule,
    ComputeRequest,
    CurriculumConfig,
    LearnerConfig,
    LoraConfig,
    MismatchConfig,
    SamplingConfig,
    StallLimits,
    StrictModel,
    ToggleConfig,
    UpsampleHardConfig,
    environment_default_algorithm,
    environment_default_group_size,
    environment_default_substeps,
    sampling_cap_default,
)
from workers.rl.effective import EffectiveSettings, SettingRow, effective_settings, environment_max_turns
from workers.rl.placement import GB, plan_resources

__all__ = [
    "Algorithm",
    "LossConfig",
    "TrainConfig",
    "effective_settings",
    "loss_config_for",
    "settings_for",
]

FALLBACK_ALGORITHM: Algorithm = "grpo"
"""The algorithm of a run that names none, on an environment without a `default_algorithm`."""


class TrainConfig(StrictModel):
    base_model: str = Field(
        default="smollm2-135m-instruct",
        min_length=1,
        description=(
            "A built-in model name, a Hugging Face Hub id (org/name or org/name@revision, downloaded on the worker "
            "into the shared model cache) or a model directory with config.json on the workers"
        ),
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
    max_new_tokens_default_of: str | None = Field(
        default=None,
        description="Filled in when the run names no sampling.max_new_tokens and its environment has a default "
        "(search: 256, swarm: 512): that environment's name. Not a choice",
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
    trajectory_sample_rate: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="Share of each step's groups whose trajectories are stored in full (messages, tool calls, "
        "tokens with log-probs, reward by term, advantage); every flagged trajectory is stored whatever the rate. "
        "1.0: all; lower it for very large runs",
    )
    trajectory_samples_per_step: int | None = Field(
        default=None,
        ge=0,
        le=1024,
        description="Runs created before trajectory_sample_rate: store the first this many of each step (plus the "
        "flagged ones) instead of the rate. Empty: the rate decides",
    )
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
        return sampling_cap_default(data, environment)

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
        for field in ("algorithm", "substeps", "group_size", "max_new_tokens"):
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
    (`workers.rl.effective.effective_settings`, with the environment's real `max_turns`), and how it samples
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


def memory_problem(config: TrainConfig, shape: ModelShape) -> tuple[str, str] | None:
    """(field, message) when the run's estimated peak memory is over what it asks for; None when it fits or asks for
    no memory (per-role requests without memory_gb reserve none). Checked at launch when the model's shape is known
    there and again by the job's preflight once the model is on the worker."""
    memory = estimate_memory_gb(config, shape)
    per_role = config.compute.per_rank is not None or config.compute.per_engine is not None
    asked = plan_resources(config).total().get("memory", 0.0) / GB
    field = "config.compute.per_rank.memory_gb" if per_role else "config.compute.memory_gb"
    if not asked or memory["total"] <= asked:
        return None
    return field, (
        f"this run needs about {memory['total']:g} GB ({memory}) but asks for {asked:g}; lower "
        "max_tokens_per_pack or prompts_per_step x group_size, turn on gradient_checkpointing or LoRA, or "
        f"raise {field.removeprefix('config.')}"
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
