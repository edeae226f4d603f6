"""Policy-gradient losses for agent LLMs: GRPO, Dr. GRPO, DAPO, CISPO and GSPO (methods.md section 4, P1-P6).

Every function is pure: it takes per-token log-probabilities of the sampled completion tokens and returns a loss
to *minimise* (the negative of the paper's objective J) together with a few detached metrics. Shapes:

- ``B`` sequences (completions), padded to ``T`` completion tokens;
- ``logp``, ``old_logp``, ``ref_logp``: ``[B, T]`` natural-log probabilities of the sampled tokens under the policy
  being trained (π_θ, with grad), the policy that sampled them (π_old) and the frozen reference (π_ref);
- ``mask``: ``[B, T]``, 1 (True) for completion tokens that count, 0 for padding and tool output. Padded positions
  must hold finite log-probabilities (0 is fine): they are multiplied by 0, not selected away;
- ``advantages``: ``[B]``, one per sequence (see `workers.rl.advantages`).

Conventions (all checked against TRL 1.16 in ``tests/workers/rl/test_losses_vs_trl.py``; see ``CONVENTIONS.md``):

- ρ = π_θ / π_old per token; the KL estimators use r = π_ref / π_θ (methods.md P1), so
  k1 = log π_θ − log π_ref, k2 = ½ (log r)², k3 = r − 1 − log r, all estimating KL(π_θ ‖ π_ref) with tokens
  sampled from the policy. No importance-sampling factor multiplies the KL term (TRL multiplies k3 by ρ by
  default, ``use_bias_correction_kl=True``).
- The KL term is added per token and normalised exactly like the policy term of the chosen algorithm.
- Normalisers count the tokens and sequences of the tensors passed in. Under gradient accumulation the caller
  decides how micro-batch losses combine: for DAPO and CISPO the per-token normaliser should be the token count of
  the whole batch (scale each micro-batch loss by its token count over the batch's).
- Tinker's ``cispo`` loss (which Chroma used) sums over tokens without normalising: it equals this module's CISPO
  loss times the number of valid tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

Algorithm = Literal["grpo", "dr_grpo", "dapo", "cispo", "gspo"]
KLEstimator = Literal["k1", "k2", "k3"]

ALGORITHMS: tuple[Algorithm, ...] = ("grpo", "dr_grpo", "dapo", "cispo", "gspo")
KL_ESTIMATORS: tuple[KLEstimator, ...] = ("k1", "k2", "k3")

# Dr. GRPO divides by a constant equal to the generation limit (methods.md P2). 1024 is DeepSeekMath's maximum
# length (P1); a run should set it to its own limit.
DEFAULT_MAX_COMPLETION_LENGTH = 1024


@dataclass(frozen=True)
class LossConfig:
    """Which policy loss to use and its hyperparameters (part of a run's spec, not a setting).

    Attributes:
        algorithm: ``"grpo"`` (P1), ``"dr_grpo"`` (P2), ``"dapo"`` (P3), ``"cispo"`` (P4) or ``"gspo"`` (P5).
        epsilon_low: lower clip distance, the ratio's floor is ``1 - epsilon_low``; >= 0.
        epsilon_high: upper clip distance, the ratio's ceiling is ``1 + epsilon_high``; >= 0. For CISPO both bound
            the stop-gradient importance weight ``r̂ = clip(ρ, 1 - epsilon_low, 1 + epsilon_high)`` (P4's unified
            form), so ``epsilon_high = 4.0`` is TRL's absolute cap ``epsilon_high = 5.0``, and any
            ``epsilon_low >= 1`` means no lower bound (ρ >= 0), which is MiniMax-M1's setting.
        kl_coef: β, weight of the per-token KL penalty against the reference policy; 0 disables it, and then
            ``ref_logp`` is not needed.
        kl_estimator: ``"k1"``, ``"k2"`` or ``"k3"`` (P6); GRPO's is k3.
        max_completion_length: Dr. GRPO's constant normaliser (the generation limit in tokens); required for
            ``dr_grpo``, ignored by the other algorithms.
        cispo_mask: CISPO only: also drop tokens with (A > 0 and ρ > 1 + epsilon_high) or (A < 0 and
            ρ < 1 - epsilon_low), P4's unified mask M, which recovers PPO-style token dropping.
        source: where the values come from, for help text in the UI; not compared.
    """

    algorithm: Algorithm
    epsilon_low: float
    epsilon_high: float
    kl_coef: float = 0.0
    kl_estimator: KLEstimator = "k3"
    max_completion_length: int | None = None
    cispo_mask: bool = False
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}; got {self.algorithm!r}.")
        for name in ("epsilon_low", "epsilon_high", "kl_coef"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0; got {value!r}.")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator must be one of {', '.join(KL_ESTIMATORS)}; got {self.kl_estimator!r}.")
        length = self.max_completion_length
        if length is not None and (isinstance(length, bool) or not isinstance(length, int) or length < 1):
            raise ValueError(f"max_completion_length must be an integer >= 1 (tokens); got {length!r}.")
        if self.algorithm == "dr_grpo" and length is None:
            raise ValueError(
                "max_completion_length is required for algorithm='dr_grpo': it is the constant token normaliser; "
                "set it to the run's generation limit."
            )
        if not isinstance(self.cispo_mask, bool):
            raise ValueError(f"cispo_mask must be true or false; got {self.cispo_mask!r}.")
        if self.cispo_mask and self.algorithm != "cispo":
            raise ValueError(f"cispo_mask applies only to algorithm='cispo'; unset it for {self.algorithm!r}.")

    @classmethod
    def defaults(cls, algorithm: Algorithm, *, max_completion_length: int | None = None) -> LossConfig:
        """The reported settings of ``algorithm`` (methods.md section 4), with ``source`` saying where each is from.

        ``max_completion_length`` is stored for every algorithm; Dr. GRPO uses it and falls back to
        `DEFAULT_MAX_COMPLETION_LENGTH` when it is not given.
        """
        if algorithm == "grpo":
            return cls(
                algorithm="grpo",
                epsilon_low=0.2,
                epsilon_high=0.2,
                kl_coef=0.04,
                kl_estimator="k3",
                max_completion_length=max_completion_length,
                source=(
                    "GRPO, DeepSeekMath (arXiv 2402.03300) eq. 3: KL coefficient 0.04 with the k3 estimator. "
                    "The paper does not state ε; 0.2 is the PPO default that TRL also uses."
                ),
            )
        if algorithm == "dr_grpo":
            return cls(
                algorithm="dr_grpo",
                epsilon_low=0.2,
                epsilon_high=0.2,
                kl_coef=0.0,
                max_completion_length=(
                    DEFAULT_MAX_COMPLETION_LENGTH if max_completion_length is None else max_completion_length
                ),
                source=(
                    "Dr. GRPO (arXiv 2503.20783): no length or std normalisation, no KL; the token sum is divided "
                    "by a constant generation limit (set max_completion_length to the run's). ε = 0.2 as in PPO."
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
        raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}; got {algorithm!r}.")


@dataclass(frozen=True)
class LossOutput:
    """Result of `policy_loss`.

    Attributes:
        loss: scalar tensor to minimise (−J), carrying the gradient: ``policy_loss + kl_coef * (KL term)``.
        policy_loss: value of the surrogate part of ``loss``, without the KL term.
        kl: mean per-token KL estimate over valid tokens (nats); 0.0 when ``kl_coef`` is 0.
        clip_fraction: share of valid tokens (sequences for GSPO) with (A > 0 and ρ > 1 + ε_high) or
            (A < 0 and ρ < 1 − ε_low): the clip zeroes their gradient, or, for CISPO, caps their weight (and the
            unified mask drops them when ``cispo_mask`` is set).
        ratio_mean: mean of ρ over valid tokens (of s_i over non-empty sequences for GSPO); 0.0 with none.
        ratio_max: largest such ratio; 0.0 with none.
    """

    loss: Tensor
    policy_loss: float
    kl: float
    clip_fraction: float
    ratio_mean: float
    ratio_max: float

    def metrics(self) -> dict[str, float]:
        """The float metrics, for logging."""
        return {
            "policy_loss": self.policy_loss,
            "kl": self.kl,
            "clip_fraction": self.clip_fraction,
            "ratio_mean": self.ratio_mean,
            "ratio_max": self.ratio_max,
        }


def kl_estimate(logp: Tensor, ref_logp: Tensor, estimator: KLEstimator) -> Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) from sampled tokens (methods.md P6 with r = π_ref / π_θ, as P1).

    Args:
        logp: ``[...]`` log π_θ of the sampled tokens.
        ref_logp: same shape, log π_ref of the same tokens.
        estimator: ``"k1"`` = −log r (unbiased, can be negative), ``"k2"`` = ½ (log r)², ``"k3"`` = r − 1 − log r
            (unbiased and >= 0; GRPO's D_KL).

    Returns:
        Elementwise estimates in nats, same shape; gradients flow to both inputs.
    """
    if logp.shape != ref_logp.shape:
        raise ValueError(f"ref_logp must have the shape of logp {tuple(logp.shape)}; got {tuple(ref_logp.shape)}.")
    log_r = ref_logp - logp
    if estimator == "k1":
        return -log_r  # methods.md P6 k1
    if estimator == "k2":
        return 0.5 * log_r.square()  # methods.md P6 k2
    if estimator == "k3":
        return torch.exp(log_r) - 1 - log_r  # methods.md P6 k3 = P1's D_KL
    raise ValueError(f"kl_estimator must be one of {', '.join(KL_ESTIMATORS)}; got {estimator!r}.")


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    config: LossConfig,
    ref_logp: Tensor | None = None,
    *,
    batch_sequences: int | None = None,
    batch_tokens: float | None = None,
) -> LossOutput:
    """The loss −J of ``config.algorithm`` for one batch of completions (methods.md P1-P5).

    Args:
        logp: ``[B, T]`` log π_θ of the sampled tokens, with grad.
        old_logp: ``[B, T]`` log π_old of the same tokens (detached here).
        advantages: ``[B]`` one advantage per sequence (detached here).
        mask: ``[B, T]`` bool or 0/1 float, 1 for tokens that count.
        config: the algorithm and its hyperparameters.
        ref_logp: ``[B, T]`` log π_ref, required when ``config.kl_coef > 0`` and ignored otherwise.
        batch_sequences, batch_tokens: when these B rows are one micro-batch of a larger optimizer batch, that
            batch's sequence count and valid-token count (N). The normalisers below then use them, so the micro-batch
            losses (and their gradients) add up to the whole batch's loss. Default: this micro-batch's own.

    Normalisation (|o_i| = valid tokens of sequence i, N = Σ_i |o_i|):
        grpo, gspo: mean over sequences of the per-sequence token mean (P1, P5); empty sequences count as 0.
        dr_grpo: token sum / (B · max_completion_length) (P2).
        dapo, cispo: token sum / N (P3, P4).

    The computation runs in at least float32. Returns a `LossOutput`.

    Raises:
        ValueError: for mismatched shapes, a missing ``ref_logp``, or (Dr. GRPO) ``T > max_completion_length``.
    """
    _check_inputs(logp, old_logp, advantages, mask, config, ref_logp)
    dtype = torch.promote_types(logp.dtype, torch.float32)
    logp_f = logp.to(dtype)
    weights = mask.detach().to(dtype)
    valid = weights > 0
    adv = advantages.detach().to(dtype)
    log_ratio = logp_f - old_logp.detach().to(dtype)

    if config.algorithm == "gspo":
        # methods.md P5: s_i = exp(mean_t log ρ_it). Gradient flows through every token's log-ratio, as in TRL's
        # importance_sampling_level="sequence".
        tokens_per_seq = weights.sum(dim=1)
        ratio = torch.exp((log_ratio * weights).sum(dim=1) / tokens_per_seq.clamp(min=1.0))  # [B]
        nonempty = tokens_per_seq > 0
        per_seq = _clipped_surrogate_loss(ratio, adv, config) * nonempty.to(dtype)
        surrogate_loss = per_seq.sum() / (batch_sequences or per_seq.shape[0])
        ratio_valid = nonempty
        clipped = _clip_region(ratio.detach(), adv, config)
    else:
        adv_tok = adv.unsqueeze(1)  # [B, 1]
        if config.algorithm == "cispo":
            # methods.md P4: sg(r̂) · A · log π_θ, r̂ = clip(ρ, 1 − ε_low, 1 + ε_high).
            ratio = torch.exp(log_ratio.detach())
            weight = ratio.clamp(min=1.0 - config.epsilon_low, max=1.0 + config.epsilon_high)
            per_token = -(weight * adv_tok * logp_f)
            clipped = _clip_region(ratio, adv_tok, config)
            if config.cispo_mask:
                # methods.md P4 unified form: M = 0 where the PPO clip would have zeroed the gradient.
                per_token = per_token * (~clipped).to(dtype)
        else:
            # methods.md P1/P2/P3: min(ρ·A, clip(ρ, 1 − ε_low, 1 + ε_high)·A) per token.
            ratio = torch.exp(log_ratio)
            per_token = _clipped_surrogate_loss(ratio, adv_tok, config)
            clipped = _clip_region(ratio.detach(), adv_tok, config)
        surrogate_loss = _normalise(per_token, weights, config, batch_sequences, batch_tokens)
        ratio_valid = valid

    loss = surrogate_loss
    kl_mean = torch.zeros((), dtype=dtype, device=logp.device)
    if config.kl_coef > 0:
        assert ref_logp is not None  # checked in _check_inputs
        per_token_kl = kl_estimate(logp_f, ref_logp.detach().to(dtype), config.kl_estimator)
        # methods.md P1: −β·D_KL sits inside the same normalisation as the surrogate.
        loss = loss + config.kl_coef * _normalise(per_token_kl, weights, config, batch_sequences, batch_tokens)
        kl_mean = (per_token_kl.detach() * weights).sum() / weights.sum().clamp(min=1.0)

    with torch.no_grad():
        ratios = ratio.detach()
        count = ratio_valid.sum().clamp(min=1)
        has_any = ratio_valid.any()
        ratio_max = torch.where(ratio_valid, ratios, torch.full_like(ratios, -math.inf)).max()
        stats = torch.stack(
            [
                surrogate_loss.detach(),
                kl_mean,
                (clipped & ratio_valid).sum().to(dtype) / count,
                torch.where(ratio_valid, ratios, torch.zeros_like(ratios)).sum() / count,
                torch.where(has_any, ratio_max, torch.zeros_like(ratio_max)),
            ]
        ).tolist()
    return LossOutput(
        loss=loss,
        policy_loss=stats[0],
        kl=stats[1],
        clip_fraction=stats[2],
        ratio_mean=stats[3],
        ratio_max=stats[4],
    )


def _clipped_surrogate_loss(ratio: Tensor, adv: Tensor, config: LossConfig) -> Tensor:
    """−min(ρ·A, clip(ρ, 1 − ε_low, 1 + ε_high)·A), elementwise (PPO's pessimistic surrogate, negated)."""
    clipped_ratio = ratio.clamp(min=1.0 - config.epsilon_low, max=1.0 + config.epsilon_high)
    return -torch.minimum(ratio * adv, clipped_ratio * adv)


def _clip_region(ratio: Tensor, adv: Tensor, config: LossConfig) -> Tensor:
    """True where the clip binds: (A > 0 and ρ > 1 + ε_high) or (A < 0 and ρ < 1 − ε_low); broadcasts."""
    high = (adv > 0) & (ratio > 1.0 + config.epsilon_high)
    low = (adv < 0) & (ratio < 1.0 - config.epsilon_low)
    return high | low


def _normalise(
    per_token: Tensor,
    weights: Tensor,
    config: LossConfig,
    batch_sequences: int | None = None,
    batch_tokens: float | None = None,
) -> Tensor:
    """Reduce ``[B, T]`` per-token terms to a scalar with the algorithm's normaliser (see `policy_loss`)."""
    masked = per_token * weights
    sequences = batch_sequences or per_token.shape[0]
    if config.algorithm in ("grpo", "gspo"):
        # methods.md P1: (1/G) Σ_i 1/|o_i|
        return (masked.sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)).sum() / sequences
    if config.algorithm == "dr_grpo":
        assert config.max_completion_length is not None  # checked by LossConfig
        return masked.sum() / (sequences * config.max_completion_length)  # methods.md P2
    tokens = batch_tokens if batch_tokens is not None else weights.sum().clamp(min=1.0)
    return masked.sum() / tokens  # methods.md P3/P4: 1 / Σ_i |o_i|


def _check_inputs(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    config: LossConfig,
    ref_logp: Tensor | None,
) -> None:
    if not isinstance(config, LossConfig):
        raise ValueError(f"config must be a LossConfig; got {type(config).__name__}.")
    if logp.dim() != 2 or logp.shape[0] == 0:
        raise ValueError(f"logp must be a [B, T] tensor with B >= 1; got shape {tuple(logp.shape)}.")
    if not logp.is_floating_point():
        raise ValueError(f"logp must be a floating-point tensor; got {logp.dtype}.")
    shape = tuple(logp.shape)
    if tuple(old_logp.shape) != shape:
        raise ValueError(f"old_logp must have the shape of logp {shape}; got {tuple(old_logp.shape)}.")
    if tuple(mask.shape) != shape:
        raise ValueError(f"mask must have the shape of logp {shape}; got {tuple(mask.shape)}.")
    if tuple(advantages.shape) != shape[:1]:
        raise ValueError(f"advantages must be [B] = {shape[:1]}, one per sequence; got {tuple(advantages.shape)}.")
    if config.kl_coef > 0:
        if ref_logp is None:
            raise ValueError("ref_logp is required when kl_coef > 0; pass the reference policy's log-probs or set 0.")
        if tuple(ref_logp.shape) != shape:
            raise ValueError(f"ref_logp must have the shape of logp {shape}; got {tuple(ref_logp.shape)}.")
    if config.algorithm == "dr_grpo":
        assert config.max_completion_length is not None  # checked by LossConfig
        if shape[1] > config.max_completion_length:
            raise ValueError(
                f"max_completion_length={config.max_completion_length} is shorter than the batch's {shape[1]} "
                "completion positions; Dr. GRPO's normaliser must be the generation limit."
            )
