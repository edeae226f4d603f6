"""What each algorithm means: the settings its method fixes (docs/methods.md section 4, P1-P6, and Composer 2's C1/C2),
a run's overrides merged over them, and the effective settings the learner, the trainer and the run page use.

Torch-free (the control plane imports it to validate a launch and to show a run's settings).

A named method behaves as its source says unless the run overrides a setting; every override and every departure
from the source shows on the run page (`EffectiveSettings.rows` and `.notes`). The decisions, with their reasons,
are in ``workers/rl/CONVENTIONS.md`` ("What each algorithm means").

| algorithm | advantages | normaliser | KL | all-equal groups |
|---|---|---|---|---|
| grpo (P1) | ÷ group std | (1/G) Σ_i 1/|o_i|, mean over every group | 0.04 · k3, loss | kept (their KL counts) |
| dr_grpo (P2) | no std | token sum ÷ (B · L), B = every sequence | none | skipped, still in B |
| composer (C1, C2) | no std | as dr_grpo | 0.001 · k1, reward | skipped, still in B |
| dapo (P3) | ÷ group std | token sum ÷ tokens of the filled batch | none | filtered, batch refilled |
| cispo (P4) | ÷ group std | token sum ÷ tokens of the trained batch | none | filtered (Context-1) |
| gspo (P5) | ÷ group std | (1/G) Σ_i per sequence, mean over every group | none | skipped, still counted |
| kimi (K3) | no std | token sum ÷ tokens of the batch (N) | none; τ·(log ρ)² in the loss | kept (their τ term counts) |

DAPO also adds its soft overlong penalty (eq. 13) to the reward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from workers.envs.registry import make_env

if TYPE_CHECKING:
    from workers.rl.config import TrainConfig

Algorithm = Literal["grpo", "dr_grpo", "composer", "dapo", "cispo", "gspo", "kimi"]
KLEstimator = Literal["k1", "k2", "k3"]
KLPlacement = Literal["loss", "reward"]
AdvantageScale = Literal["none", "group"]

ALGORITHMS: tuple[Algorithm, ...] = ("grpo", "dr_grpo", "composer", "dapo", "cispo", "gspo", "kimi")
KL_ESTIMATORS: tuple[KLEstimator, ...] = ("k1", "k2", "k3")
KL_PLACEMENTS: tuple[KLPlacement, ...] = ("loss", "reward")

CONSTANT_NORMALISER: tuple[Algorithm, ...] = ("dr_grpo", "composer")
"""Algorithms whose token sum is divided by a constant (P2's generation limit) times the batch's sequences."""
PER_SEQUENCE_NORMALISER: tuple[Algorithm, ...] = ("grpo", "gspo")
"""Algorithms that average tokens within each sequence, then sequences (P1, P5)."""

KL_PLACEMENT_OF: dict[KLEstimator, KLPlacement] = {"k1": "reward", "k2": "loss", "k3": "loss"}
"""Where each KL estimator regularises (r = π_ref/π_θ, samples from the policy):

- k1 = log π_θ − log π_ref has E_π[∇k1] = E_π[∇log π_θ] = 0: in the loss its gradient vanishes in expectation.
  As a reward penalty (r_i − β Σ_t k1, no gradient through it) the policy gradient of that penalty is exactly
  ∇ KL(π_θ ‖ π_ref): the reward is k1's placement, and k1 in the loss is refused.
- k2 = ½ (log r)² in the loss has E_π[∇k2] = E_π[(log π_θ − log π_ref) ∇log π_θ] = ∇ KL(π_θ ‖ π_ref).
- k3 = r − 1 − log r in the loss has E_π[∇k3] = E_π[(1 − r) ∇log π_θ] = ∇ KL(π_ref ‖ π_θ): GRPO's (P1) choice.
- k2 or k3 as a reward penalty is allowed but biased (the policy gradient misses ∇ of the estimator itself): the
  run page says so.
"""

DEFAULT_MAX_COMPLETION_LENGTH = 1024
"""Dr. GRPO's constant when nothing better is known (DeepSeekMath's maximum length, P1); a run derives its own
from the environment (`episode_token_limit`)."""

DEFAULT_DYNAMIC_SAMPLING_MAX_ROUNDS = 4
"""Generation rounds per step (the first included) that DAPO's dynamic sampling may use to fill the batch."""

OVERLONG_CACHE_FRACTION = 0.2
"""DAPO's soft band: L_cache = 4,096 of L_max = 20,480 generated tokens (secondary, docs/methods.md P3): a fifth."""


class SettingsError(ValueError):
    """An algorithm setting that cannot work; `field` is its path under the run's config ("loss", ...)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


@dataclass(frozen=True)
class LossConfig:
    """Which policy loss to use and its hyperparameters (part of a run's spec, not a setting).

    Attributes:
        algorithm: one of `ALGORITHMS` (docs/methods.md P1-P5; ``composer`` is C1, normalised like ``dr_grpo``).
        epsilon_low: lower clip distance, the ratio's floor is ``1 - epsilon_low``; >= 0.
        epsilon_high: upper clip distance, the ratio's ceiling is ``1 + epsilon_high``; >= 0. For CISPO both bound
            the stop-gradient importance weight ``r̂ = clip(ρ, 1 - epsilon_low, 1 + epsilon_high)`` (P4's unified
            form), so ``epsilon_high = 4.0`` is TRL's absolute cap ``epsilon_high = 5.0``, and any
            ``epsilon_low >= 1`` means no lower bound (ρ >= 0), which is MiniMax-M1's setting.
        kl_coef: β, weight of the KL penalty against the reference policy; 0 disables it (no ``ref_logp`` needed).
        kl_estimator: ``"k1"``, ``"k2"`` or ``"k3"`` (P6); GRPO's is k3.
        kl_placement: ``"loss"`` adds β·k per token to the loss, normalised like the policy term (P1);
            ``"reward"`` subtracts β·Σ_t k from each sequence's reward before the advantages (no gradient through
            it). See `KL_PLACEMENT_OF`; k1 in the loss with β > 0 is refused (zero gradient in expectation).
        max_completion_length: Dr. GRPO's (and Composer's) constant normaliser: the most tokens the policy can
            sample in one episode; required for those, ignored by the other algorithms.
        cispo_mask: CISPO only: also drop tokens with (A > 0 and ρ > 1 + epsilon_high) or (A < 0 and
            ρ < 1 - epsilon_low), P4's unified mask M, which recovers PPO-style token dropping.
        tau: Kimi only (K3): weight of the quadratic term τ·(log ρ)² per token. For ``kimi`` the epsilons bound the
            log-ratio, not the ratio: a token with log ρ outside [−epsilon_low, epsilon_high] gets no policy
            gradient, whatever its advantage's sign (K3's "Clip" as a gradient mask).
        source: where the values come from, for help text in the UI; not compared.
    """

    algorithm: Algorithm
    epsilon_low: float
    epsilon_high: float
    kl_coef: float = 0.0
    kl_estimator: KLEstimator = "k3"
    kl_placement: KLPlacement = "loss"
    max_completion_length: int | None = None
    cispo_mask: bool = False
    tau: float = 0.0
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}; got {self.algorithm!r}.")
        for name in ("epsilon_low", "epsilon_high", "kl_coef", "tau"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0; got {value!r}.")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator must be one of {', '.join(KL_ESTIMATORS)}; got {self.kl_estimator!r}.")
        if self.kl_placement not in KL_PLACEMENTS:
            raise ValueError(f"kl_placement must be one of {', '.join(KL_PLACEMENTS)}; got {self.kl_placement!r}.")
        if self.kl_coef > 0 and self.kl_estimator == "k1" and self.kl_placement == "loss":
            raise ValueError(
                "kl_estimator='k1' in the loss has zero gradient in expectation (E[∇ log π] = 0), so it would not "
                "regularise: set kl_placement='reward' (k1's placement), or use kl_estimator 'k2' or 'k3' in the loss."
            )
        length = self.max_completion_length
        if length is not None and (isinstance(length, bool) or not isinstance(length, int) or length < 1):
            raise ValueError(f"max_completion_length must be an integer >= 1 (tokens); got {length!r}.")
        if self.algorithm in CONSTANT_NORMALISER and length is None:
            raise ValueError(
                f"max_completion_length is required for algorithm={self.algorithm!r}: it is the constant token "
                "normaliser; set it to the most tokens the policy can sample in one episode."
            )
        if not isinstance(self.cispo_mask, bool):
            raise ValueError(f"cispo_mask must be true or false; got {self.cispo_mask!r}.")
        if self.cispo_mask and self.algorithm != "cispo":
            raise ValueError(f"cispo_mask applies only to algorithm='cispo'; unset it for {self.algorithm!r}.")
        if self.tau > 0 and self.algorithm != "kimi":
            raise ValueError(
                f"tau (K3's quadratic term) applies only to algorithm='kimi'; unset it for {self.algorithm!r}."
            )

    @property
    def kl_in_loss(self) -> bool:
        return self.kl_coef > 0 and self.kl_placement == "loss"

    @property
    def kl_in_reward(self) -> bool:
        return self.kl_coef > 0 and self.kl_placement == "reward"

    @classmethod
    def defaults(cls, algorithm: Algorithm, *, max_completion_length: int | None = None) -> LossConfig:
        """The reported settings of ``algorithm`` (docs/methods.md section 4), ``source`` saying where each is from.

        ``max_completion_length`` is stored for every algorithm; Dr. GRPO and Composer use it and fall back to
        `DEFAULT_MAX_COMPLETION_LENGTH` when it is not given.
        """
        constant = DEFAULT_MAX_COMPLETION_LENGTH if max_completion_length is None else max_completion_length
        if algorithm == "grpo":
            return cls(
                algorithm="grpo",
                epsilon_low=0.2,
                epsilon_high=0.2,
                kl_coef=0.04,
                kl_estimator="k3",
                kl_placement="loss",
                max_completion_length=max_completion_length,
                source=(
                    "GRPO, DeepSeekMath (arXiv 2402.03300) eq. 3: KL coefficient 0.04 with the k3 estimator in the "
                    "loss. The paper does not state ε; 0.2 is the PPO default that TRL also uses."
                ),
            )
        if algorithm == "dr_grpo":
            return cls(
                algorithm="dr_grpo",
                epsilon_low=0.2,
                epsilon_high=0.2,
                kl_coef=0.0,
                max_completion_length=constant,
                source=(
                    "Dr. GRPO (arXiv 2503.20783): no length or std normalisation, no KL; the token sum is divided "
                    "by a constant generation limit (a run derives it from its environment). ε = 0.2 as in PPO."
                ),
            )
        if algorithm == "composer":
            return cls(
                algorithm="composer",
                epsilon_low=0.2,
                epsilon_high=0.2,
                kl_coef=0.001,
                kl_estimator="k1",
                kl_placement="reward",
                max_completion_length=constant,
                source=(
                    "Composer 2 (arXiv 2603.24477) C1: Dr. GRPO's loss without length standardisation or std "
                    "division; C2: KL estimated with k1, which regularises only as a reward penalty. The report "
                    "gives neither the KL coefficient (0.001 is our choice) nor the clipping (ε = 0.2 as in PPO)."
                ),
            )
        if algorithm == "dapo":
            return cls(
                algorithm="dapo",
                epsilon_low=0.2,
                epsilon_high=0.28,
                kl_coef=0.0,
                max_completion_length=max_completion_length,
                source="DAPO (arXiv 2503.14476): clip-higher with ε_low = 0.2, ε_high = 0.28, token-level loss, no KL.",
            )
        if algorithm == "cispo":
            return cls(
                algorithm="cispo",
                epsilon_low=1.0,
                epsilon_high=4.0,
                kl_coef=0.0,
                max_completion_length=max_completion_length,
                source=(
                    "CISPO, MiniMax-M1 (arXiv 2506.13585) eqs. 4-5: no lower bound on the importance weight "
                    "(ε_low = 1), no KL. MiniMax-M1 does not publish ε_high; 4.0 caps the weight at 5, the value "
                    "TRL recommends from ScaleRL (arXiv 2510.13786)."
                ),
            )
        if algorithm == "gspo":
            return cls(
                algorithm="gspo",
                epsilon_low=3e-4,
                epsilon_high=4e-4,
                kl_coef=0.0,
                max_completion_length=max_completion_length,
                source="GSPO (arXiv 2507.18071): sequence-level ratio clipped to [1 - 3e-4, 1 + 4e-4], no KL.",
            )
        if algorithm == "kimi":
            return cls(
                algorithm="kimi",
                epsilon_low=math.log(2.0),
                epsilon_high=math.log(2.0),
                kl_coef=0.0,
                tau=0.01,
                max_completion_length=max_completion_length,
                source=(
                    "Kimi K2.5 (arXiv 2602.02276) K3: advantage r − mean(r) without std, token sum ÷ the batch's "
                    "tokens N, a token whose log-ratio leaves [α, β] gets no gradient, minus τ·(log ρ)². The report "
                    "gives neither α, β nor τ: ours are the log-ratio band [−ln 2, ln 2] (ratio in [0.5, 2]) and "
                    "τ = 0.01. Kimi optimises with MuonClip; Crucible uses AdamW."
                ),
            )
        raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}; got {algorithm!r}.")


LOSS_OVERRIDES: tuple[str, ...] = (
    "epsilon_low",
    "epsilon_high",
    "kl_coef",
    "kl_estimator",
    "kl_placement",
    "cispo_mask",
    "tau",
)
"""The loss settings a run may override (`TrainConfig.loss`); the others follow from the algorithm and the run."""


def loss_config(
    algorithm: Algorithm, overrides: dict[str, Any], *, max_completion_length: int | None = None
) -> LossConfig:
    """`algorithm`'s `LossConfig` with a run's `overrides` merged in. Overriding `kl_estimator` alone moves the KL to
    that estimator's placement (`KL_PLACEMENT_OF`). Raises ValueError naming an unknown or invalid setting."""
    unknown = sorted(set(overrides) - set(LOSS_OVERRIDES))
    if unknown:
        raise ValueError(f"unknown setting(s) {', '.join(unknown)}; choose from {', '.join(sorted(LOSS_OVERRIDES))}")
    base = LossConfig.defaults(algorithm, max_completion_length=max_completion_length)
    values: dict[str, Any] = {name: getattr(base, name) for name in LOSS_OVERRIDES}
    values.update(overrides)
    if "kl_estimator" in overrides and "kl_placement" not in overrides:
        values["kl_placement"] = KL_PLACEMENT_OF.get(overrides["kl_estimator"], base.kl_placement)
    return LossConfig(
        algorithm=base.algorithm, max_completion_length=base.max_completion_length, source=base.source, **values
    )


@dataclass(frozen=True)
class MethodDefaults:
    """The training-level settings a method fixes (beside its `LossConfig`), with where they come from."""

    label: str
    """The method and its docs/methods.md section, e.g. "Dr. GRPO (P2)"."""
    scale_rewards: AdvantageScale
    dynamic_sampling: bool
    overlong_penalty: bool
    drops_equal_groups: bool
    """The method itself leaves all-equal groups out (DAPO's filter, Context-1's CISPO). The others keep them; we
    skip them anyway when that changes no gradient (see `effective_settings`)."""

    def scale_source(self) -> str:
        if self.scale_rewards == "group":
            return f"{self.label}: Â = (r − mean) / std over the group"
        return f"{self.label}: Â = r − mean, no division by the group std"

    def dynamic_source(self) -> str:
        if self.dynamic_sampling:
            return f"{self.label}: over-sample, leave out groups whose rewards are all equal, refill the batch"
        return f"{self.label} trains on the batch as sampled"

    def overlong_source(self) -> str:
        if self.overlong_penalty:
            return f"{self.label} eq. 13: 0 up to L_max − L_cache tokens, then falling linearly to −1 at L_max"
        return f"{self.label} has no length penalty"


METHOD_DEFAULTS: dict[Algorithm, MethodDefaults] = {
    "grpo": MethodDefaults("GRPO (P1)", "group", False, False, False),
    "dr_grpo": MethodDefaults("Dr. GRPO (P2)", "none", False, False, False),
    "composer": MethodDefaults("Composer 2 (C1)", "none", False, False, False),
    "dapo": MethodDefaults("DAPO (P3)", "group", True, True, True),
    "cispo": MethodDefaults("CISPO (P4) as Context-1 ran it", "group", False, False, True),
    "gspo": MethodDefaults("GSPO (P5)", "group", False, False, False),
    "kimi": MethodDefaults("Kimi K2.5 (K3)", "none", False, False, False),
}


@dataclass(frozen=True)
class SettingRow:
    """One line of the run page's effective settings: `overridden` when the run set it, else the method's."""

    name: str
    value: str
    overridden: bool
    source: str


@dataclass(frozen=True)
class EffectiveSettings:
    """Everything the learner and the trainer do differently per algorithm, after a run's overrides.

    Attributes:
        scale_rewards: ``"group"`` divides advantages by the group std, ``"none"`` does not.
        drop_equal_groups: skip groups whose (shaped) rewards are all equal: their advantages are exactly 0.
        dynamic_sampling: DAPO's over-sample, filter, refill (P3), on the task reward, before the learner.
        dynamic_sampling_max_rounds: generation rounds per step (the first included) to fill the batch.
        overlong_penalty: add DAPO's R_length (eq. 13) to the reward.
        overlong_max_tokens, overlong_cache_tokens: its L_max and L_cache, in sampled tokens per episode.
        episode_token_limit: the most tokens the policy can sample in one episode (max_new_tokens × max_turns).
        loss: the policy loss and its KL.
        loss_source: where the loss defaults come from (`LossConfig.source`), for the run page.
        rows: every setting with its value and origin, for the run page.
        notes: departures from the method's source, for the run page.
    """

    algorithm: Algorithm
    scale_rewards: AdvantageScale
    drop_equal_groups: bool
    dynamic_sampling: bool
    dynamic_sampling_max_rounds: int
    overlong_penalty: bool
    overlong_max_tokens: int
    overlong_cache_tokens: int
    episode_token_limit: int
    loss: LossConfig
    loss_source: str = ""
    rows: tuple[SettingRow, ...] = ()
    notes: tuple[str, ...] = ()


def environment_max_turns(environment: str, env_params: dict[str, Any]) -> int | None:
    """The environment's limit on policy replies per episode (None when it cannot be built: the environment check
    reports why)."""

    try:
        return int(make_env(environment, **env_params).max_turns)
    except (ValueError, TypeError):
        return None


def episode_token_limit(config: TrainConfig, max_turns: int | None = None) -> int:
    """The most tokens the policy can sample in one episode: every turn samples at most `max_new_tokens` and an
    episode has at most the environment's `max_turns` replies. Observation tokens between turns are not sampled
    (their loss mask is 0), so they do not count, however long a search result is."""
    turns = max_turns if max_turns is not None else environment_max_turns(config.environment, config.env_params)
    return config.sampling.max_new_tokens * max(turns or 1, 1)


def effective_settings(config: TrainConfig, *, max_turns: int | None = None) -> EffectiveSettings:
    """`config.algorithm`'s method defaults merged with the run's overrides (a field left unset, None, is the
    method's). Raises `SettingsError` naming the field for a combination that cannot work."""
    algorithm: Algorithm = config.algorithm
    method = METHOD_DEFAULTS[algorithm]
    limit = episode_token_limit(config, max_turns)
    try:
        loss = loss_config(algorithm, dict(config.loss), max_completion_length=limit)
    except ValueError as exc:
        raise SettingsError("loss", str(exc)) from None

    rows: list[SettingRow] = []
    notes: list[str] = []

    def pick(name: str, value: Any, default: Any, source: str) -> Any:
        chosen = default if value is None else value
        rows.append(SettingRow(name, _show(chosen), value is not None and value != default, source))
        return chosen

    scale = pick("scale_rewards", config.scale_rewards, method.scale_rewards, method.scale_source())
    if scale != method.scale_rewards:
        verb = "divides" if method.scale_rewards == "group" else "does not divide"
        notes.append(f"scale_rewards={scale!r}: {algorithm}'s source {verb} advantages by the group std.")
    dynamic = pick("dynamic_sampling", config.dynamic_sampling, method.dynamic_sampling, method.dynamic_source())
    if dynamic:
        pick(
            "dynamic_sampling_max_rounds",
            config.dynamic_sampling_max_rounds,
            DEFAULT_DYNAMIC_SAMPLING_MAX_ROUNDS,
            "Generation rounds per step, the first included (ours: DAPO refills until the batch is full); a step "
            "whose batch is still short trains on what it has and says so in its metrics",
        )
    if algorithm == "dapo" and not dynamic:
        notes.append(
            "dynamic_sampling is off: DAPO (P3) over-samples and refills the batch with groups that have signal."
        )
    # A group whose rewards are all equal still has a loss term when the KL or Kimi's τ term is in the loss.
    drop_default = True if (dynamic or method.drops_equal_groups) else not (loss.kl_in_loss or loss.tau > 0)
    drop_source = "Groups whose rewards are all equal have advantage 0: " + (
        "the method leaves them out"
        if method.drops_equal_groups
        else "skipping them changes no gradient (the normaliser still counts them) unless the KL is in the loss"
    )
    drop = pick("drop_equal_groups", config.drop_equal_groups, drop_default, drop_source)
    if dynamic and not drop:
        raise SettingsError(
            "drop_equal_groups",
            "dynamic_sampling filters out groups whose rewards are all equal and refills the batch, so "
            "drop_equal_groups cannot be false with it: unset drop_equal_groups, or set dynamic_sampling to false",
        )
    if drop and loss.kl_in_loss and not method.drops_equal_groups:
        notes.append(
            "drop_equal_groups with the KL in the loss: the skipped groups lose their KL term, which "
            f"{algorithm}'s source applies to every sequence."
        )
    overlong = pick("overlong_penalty", config.overlong_penalty, method.overlong_penalty, method.overlong_source())
    cache_default = max(1, round(limit * OVERLONG_CACHE_FRACTION))
    cache = cache_default
    if overlong:
        rows.append(
            SettingRow(
                "overlong_max_tokens",
                str(limit),
                False,
                "L_max: the most tokens the policy can sample in one episode (max_new_tokens × the environment's "
                "max_turns)",
            )
        )
        cache = pick(
            "overlong_cache_tokens",
            config.overlong_cache_tokens,
            cache_default,
            "L_cache: DAPO used 4,096 of 20,480 tokens, a fifth of L_max",
        )
        if cache > limit:
            raise SettingsError(
                "overlong_cache_tokens",
                f"overlong_cache_tokens={cache} is more than L_max={limit} (max_new_tokens × max_turns): "
                f"set it to at most {limit}",
            )
    if overlong and not method.overlong_penalty:
        notes.append(f"overlong_penalty is on: {algorithm}'s source has no length penalty.")
    if algorithm == "dapo" and not overlong:
        notes.append("overlong_penalty is off: DAPO (P3) adds the soft overlong penalty of eq. 13 to the reward.")

    base = LossConfig.defaults(algorithm, max_completion_length=limit)
    for name in LOSS_OVERRIDES:
        if name == "cispo_mask" and algorithm != "cispo":
            continue
        if name == "tau" and algorithm != "kimi":
            continue
        if name in ("kl_estimator", "kl_placement") and loss.kl_coef == 0:
            continue
        value = getattr(loss, name)
        source = _placement_source(loss.kl_estimator) if name == "kl_placement" else LOSS_SETTING_MEANING[name]
        rows.append(SettingRow(f"loss.{name}", _show(value), value != getattr(base, name), source))
    if algorithm in CONSTANT_NORMALISER:
        rows.append(
            SettingRow(
                "loss.max_completion_length",
                str(limit),
                False,
                "Dr. GRPO's constant normaliser: the most tokens the policy can sample in one episode "
                "(max_new_tokens × the environment's max_turns)",
            )
        )
    mismatch = config.mismatch
    rows.append(
        SettingRow(
            "mismatch.correction",
            mismatch.correction,
            mismatch.correction != "none",
            "Train-inference mismatch (docs/methods.md P7), measured every step under mismatch/: none, or an "
            "importance weight on each token's policy-gradient term (tis min(r, C), mis r or 0 above C; seq_* on the "
            "sequence's geometric mean), π_old then recomputed by the learner. Off by default: on CPU the engine "
            "and the learner both compute in fp32",
        )
    )
    if mismatch.correction != "none" or mismatch.cap != 2.0:
        rows.append(
            SettingRow("mismatch.cap", _show(mismatch.cap), mismatch.cap != 2.0, "C; 2 is the common choice (P7)")
        )
    if loss.kl_coef > 0 and loss.kl_placement == "reward" and loss.kl_estimator != "k1":
        notes.append(
            f"kl_estimator={loss.kl_estimator!r} as a reward penalty is biased: its policy gradient misses the "
            "estimator's own gradient (k1 is the unbiased one in the reward)."
        )
    return EffectiveSettings(
        algorithm=algorithm,
        scale_rewards=scale,
        drop_equal_groups=drop,
        dynamic_sampling=dynamic,
        dynamic_sampling_max_rounds=config.dynamic_sampling_max_rounds or DEFAULT_DYNAMIC_SAMPLING_MAX_ROUNDS,
        overlong_penalty=overlong,
        overlong_max_tokens=limit,
        overlong_cache_tokens=cache,
        episode_token_limit=limit,
        loss=loss,
        loss_source=base.source,
        rows=tuple(rows),
        notes=tuple(notes),
    )


LOSS_SETTING_MEANING: dict[str, str] = {
    "epsilon_low": "The ratio's clip floor is 1 − epsilon_low (CISPO: of the importance weight; >= 1: none; kimi: "
    "the log-ratio's floor is −epsilon_low)",
    "epsilon_high": "The ratio's clip ceiling is 1 + epsilon_high (kimi: the log-ratio's ceiling is epsilon_high)",
    "kl_coef": "β, the weight of the KL to the reference policy (0: no KL, no reference copy)",
    "kl_estimator": "docs/methods.md P6: k1 = log π_θ − log π_ref, k2 = ½ (log r)², k3 = r − 1 − log r",
    "cispo_mask": "P4's unified mask: also drop the tokens PPO's clip would have zeroed",
    "tau": "K3: weight of the quadratic term τ·(log π_θ/π_old)² (kimi only)",
}


def _placement_source(estimator: KLEstimator) -> str:
    return (
        f"{estimator}'s placement is the {KL_PLACEMENT_OF[estimator]}: k1 regularises only as a reward penalty, "
        "k2 and k3 in the loss (workers/rl/CONVENTIONS.md)"
    )


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
