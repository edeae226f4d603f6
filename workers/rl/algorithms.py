"""What each algorithm means: the settings its method fixes (docs/methods.md section 4, P1-P6, and Composer 2's C1/C2),
a run's overrides merged over them, and the effective settings the learner, the trainer and the run page use.

Torch-free (the control plane imports it to validate a launch and to show a run's settings).

A named method behaves as its source says unless the run overrides a setting; every override and every departure
from the source shows on the run page (`EffectiveSettings.rows` and `.notes`, in `workers.rl.effective`). The
decisions, with their reasons, are in ``workers/rl/CONVENTIONS.md`` ("What each algorithm means").

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

if TYPE_CHECKING:
    pass

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
        # One function on purpose: a table: one branch per algorithm, each with the settings its source reports.
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
