"""Policy-gradient losses for agent LLMs: GRPO, Dr. GRPO (and Composer 2's recipe), DAPO, CISPO and GSPO
(docs/methods.md section 4, P1-P6).

Every function is pure: it takes per-token log-probabilities of the sampled completion tokens and returns a loss
to *minimise* (the negative of the paper's objective J) together with a few detached metrics. Shapes:

- ``B`` sequences (completions), padded to ``T`` completion tokens;
- ``logp``, ``old_logp``, ``ref_logp``: ``[B, T]`` natural-log probabilities of the sampled tokens under the policy
  being trained (π_θ, with grad), the policy that sampled them (π_old) and the frozen reference (π_ref);
- ``mask``: ``[B, T]``, 1 (True) for completion tokens that count, 0 for padding and tool output. Padded positions
  must hold finite log-probabilities (0 is fine): they are multiplied by 0, not selected away;
- ``advantages``: ``[B]``, one per sequence (see `workers.rl.advantages`).

Conventions (all checked against TRL 1.16 in ``tests/workers/rl/test_losses_vs_trl.py``; see ``CONVENTIONS.md``):

- ρ = π_θ / π_old per token; the KL estimators use r = π_ref / π_θ (docs/methods.md P1), so
  k1 = log π_θ − log π_ref, k2 = ½ (log r)², k3 = r − 1 − log r, all estimating KL(π_θ ‖ π_ref) with tokens
  sampled from the policy. No importance-sampling factor multiplies the KL term (TRL multiplies k3 by ρ by
  default, ``use_bias_correction_kl=True``).
- With ``kl_placement="loss"`` the KL term is added per token and normalised exactly like the policy term of the
  chosen algorithm. With ``kl_placement="reward"`` this module adds nothing: the learner subtracts
  β · `sequence_kl` from each reward before the advantages. k1 in the loss is refused by `LossConfig` (its
  gradient is zero in expectation); see `workers.rl.algorithms.KL_PLACEMENT_OF`.
- Normalisers count the tokens and sequences of the tensors passed in, unless the caller passes the whole batch's
  (``batch_sequences``, ``batch_tokens``): the learner does, so micro-batch losses add up to the batch's.
- Tinker's ``cispo`` loss (which Chroma used) sums over tokens without normalising: it equals this module's CISPO
  loss times the number of valid tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from workers.rl.algorithms import (
    ALGORITHMS,
    CONSTANT_NORMALISER,
    DEFAULT_MAX_COMPLETION_LENGTH,
    KL_ESTIMATORS,
    KL_PLACEMENT_OF,
    PER_SEQUENCE_NORMALISER,
    Algorithm,
    KLEstimator,
    KLPlacement,
    LossConfig,
)

__all__ = [
    "ALGORITHMS",
    "DEFAULT_MAX_COMPLETION_LENGTH",
    "KL_ESTIMATORS",
    "KL_PLACEMENT_OF",
    "Algorithm",
    "KLEstimator",
    "KLPlacement",
    "LossConfig",
    "LossOutput",
    "kl_estimate",
    "policy_loss",
    "sequence_kl",
]


@dataclass(frozen=True)
class LossOutput:
    """Result of `policy_loss`.

    Attributes:
        loss: scalar tensor to minimise (−J), carrying the gradient: ``policy_loss + kl_coef * (KL term)``.
        policy_loss: value of the surrogate part of ``loss``, without the KL term.
        kl: mean per-token KL estimate over valid tokens (nats); 0.0 when ``kl_coef`` is 0.
        clip_fraction: share of valid tokens (sequences for GSPO) with (A > 0 and ρ > 1 + ε_high) or
            (A < 0 and ρ < 1 − ε_low): the clip zeroes their gradient, or, for CISPO, caps their weight (and the
            unified mask drops them when ``cispo_mask`` is set); for Kimi (K3), with log ρ outside
            [−ε_low, ε_high], whose policy gradient the mask zeroes whatever the sign of A.
        ratio_mean: mean of ρ over valid tokens (of s_i over non-empty sequences for GSPO); 0.0 with none.
        ratio_max: largest such ratio; 0.0 with none.
        ratio_count: how many units ``clip_fraction`` and ``ratio_mean`` average over: valid tokens, or non-empty
            sequences for GSPO (whose ratio and clip are per sequence). Micro-batch metrics combine weighted by it.
        kl_tokens: valid tokens ``kl`` averages over (0 when the KL is not in the loss).
    """

    loss: Tensor
    policy_loss: float
    kl: float
    clip_fraction: float
    ratio_mean: float
    ratio_max: float
    ratio_count: float = 0.0
    kl_tokens: float = 0.0

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
    """Per-token estimate of KL(π_θ ‖ π_ref) from sampled tokens (docs/methods.md P6 with r = π_ref / π_θ, as P1).

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
        return -log_r  # docs/methods.md P6 k1
    if estimator == "k2":
        return 0.5 * log_r.square()  # docs/methods.md P6 k2
    if estimator == "k3":
        return torch.exp(log_r) - 1 - log_r  # docs/methods.md P6 k3 = P1's D_KL
    raise ValueError(f"kl_estimator must be one of {', '.join(KL_ESTIMATORS)}; got {estimator!r}.")


def sequence_kl(old_logp: Tensor, ref_logp: Tensor, mask: Tensor, estimator: KLEstimator) -> Tensor:
    """Per-sequence KL estimate Σ_t k_t of the sampling policy from the reference, over each row's valid tokens:
    the penalty β · this is subtracted from the reward when ``kl_placement="reward"`` (no gradient flows).

    The sequence KL is the sum of the per-token terms (chain rule), so it is summed, not averaged. With k1 it is
    log π_old(y) − log π_ref(y), whose policy gradient as a reward is ∇ KL(π ‖ π_ref) (InstructGPT's placement).

    Args:
        old_logp: ``[B, T]`` log-probs of the sampled tokens under the policy that sampled them.
        ref_logp: ``[B, T]`` log-probs of the same tokens under the reference policy.
        mask: ``[B, T]``, 1 for sampled tokens.
        estimator: ``"k1"``, ``"k2"`` or ``"k3"``.

    Returns:
        ``[B]`` float tensor in nats, detached.
    """
    if tuple(old_logp.shape) != tuple(ref_logp.shape) or tuple(mask.shape) != tuple(old_logp.shape):
        raise ValueError(
            f"old_logp, ref_logp and mask must share one [B, T] shape; got {tuple(old_logp.shape)}, "
            f"{tuple(ref_logp.shape)} and {tuple(mask.shape)}."
        )
    dtype = torch.promote_types(old_logp.dtype, torch.float32)
    per_token = kl_estimate(old_logp.detach().to(dtype), ref_logp.detach().to(dtype), estimator)
    return (per_token * mask.detach().to(dtype)).sum(dim=1)


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
    correction: Tensor | None = None,
) -> LossOutput:
    """The loss −J of ``config.algorithm`` for one batch of completions (docs/methods.md P1-P5).

    Args:
        logp: ``[B, T]`` log π_θ of the sampled tokens, with grad.
        old_logp: ``[B, T]`` log π_old of the same tokens (detached here).
        advantages: ``[B]`` one advantage per sequence (detached here).
        mask: ``[B, T]`` bool or 0/1 float, 1 for tokens that count.
        config: the algorithm and its hyperparameters.
        ref_logp: ``[B, T]`` log π_ref, required when the KL is in the loss (``config.kl_in_loss``), else ignored.
        batch_sequences, batch_tokens: when these B rows are one micro-batch of a larger optimizer batch, that
            batch's sequence count and valid-token count (N). The normalisers below then use them, so the micro-batch
            losses (and their gradients) add up to the whole batch's loss. Default: this micro-batch's own.
        correction: ``[B, T]`` stop-gradient importance weights of a train-inference mismatch correction
            (`workers.rl.mismatch.correction_weights`, docs/methods.md P7) multiplying each token's policy-gradient term
            (the sequence's term for GSPO, whose weights must then be per sequence: ``seq_tis`` or ``seq_mis``).
            The KL term is not weighted. Default: none.

    Normalisation (|o_i| = valid tokens of sequence i, N = Σ_i |o_i|):
        grpo, gspo: mean over sequences of the per-sequence token mean (P1, P5); empty sequences count as 0.
        dr_grpo, composer: token sum / (B · max_completion_length) (P2, C1).
        dapo, cispo, kimi: token sum / N (P3, P4, K3).

    The computation runs in at least float32. Returns a `LossOutput`.

    Raises:
        ValueError: for mismatched shapes, a missing ``ref_logp`` (KL in the loss), or (Dr. GRPO, Composer) a
            sequence with more valid tokens than ``max_completion_length``.
    """
    # One function on purpose: one formula per algorithm on the same ratios and masks (docs/methods.md P1-P5), side by
    # side so they can be compared.
    _check_inputs(logp, old_logp, advantages, mask, config, ref_logp)
    dtype = torch.promote_types(logp.dtype, torch.float32)
    logp_f = logp.to(dtype)
    weights = mask.detach().to(dtype)
    valid = weights > 0
    adv = advantages.detach().to(dtype)
    log_ratio = logp_f - old_logp.detach().to(dtype)
    if correction is not None and tuple(correction.shape) != tuple(logp.shape):
        raise ValueError(f"correction must have the shape of logp {tuple(logp.shape)}; got {tuple(correction.shape)}.")
    w = correction.detach().to(dtype) if correction is not None else None

    if config.algorithm == "gspo":
        # docs/methods.md P5: s_i = exp(mean_t log ρ_it). Gradient flows through every token's log-ratio, as in TRL's
        # importance_sampling_level="sequence".
        tokens_per_seq = weights.sum(dim=1)
        ratio = torch.exp((log_ratio * weights).sum(dim=1) / tokens_per_seq.clamp(min=1.0))  # [B]
        nonempty = tokens_per_seq > 0
        per_seq = _clipped_surrogate_loss(ratio, adv, config) * nonempty.to(dtype)
        if w is not None:  # a sequence-level correction: one weight per row (its tokens' largest; all equal)
            per_seq = per_seq * (w * weights).amax(dim=1)
        surrogate_loss = per_seq.sum() / (batch_sequences or per_seq.shape[0])
        ratio_valid = nonempty
        clipped = _clip_region(ratio.detach(), adv, config)
    else:
        adv_tok = adv.unsqueeze(1)  # [B, 1]
        if config.algorithm == "cispo":
            # docs/methods.md P4: sg(r̂) · A · log π_θ, r̂ = clip(ρ, 1 − ε_low, 1 + ε_high).
            ratio = torch.exp(log_ratio.detach())
            weight = ratio.clamp(min=1.0 - config.epsilon_low, max=1.0 + config.epsilon_high)
            per_token = -(weight * adv_tok * logp_f)
            clipped = _clip_region(ratio, adv_tok, config)
            if config.cispo_mask:
                # docs/methods.md P4 unified form: M = 0 where the PPO clip would have zeroed the gradient.
                per_token = per_token * (~clipped).to(dtype)
        elif config.algorithm == "kimi":
            # docs/methods.md K3: Clip(ρ, α, β)·A − τ·(log ρ)², "Clip" a gradient mask: a token whose log-ratio leaves
            # [α, β] = [−ε_low, ε_high] keeps its value but gets no policy gradient, whatever the sign of A.
            ratio = torch.exp(log_ratio)
            clipped = (log_ratio.detach() < -config.epsilon_low) | (log_ratio.detach() > config.epsilon_high)
            policy_term = torch.where(clipped, ratio.detach(), ratio) * adv_tok
            per_token = -policy_term * (w if w is not None else 1.0) + config.tau * log_ratio.square()
        else:
            # docs/methods.md P1/P2/P3: min(ρ·A, clip(ρ, 1 − ε_low, 1 + ε_high)·A) per token.
            ratio = torch.exp(log_ratio)
            per_token = _clipped_surrogate_loss(ratio, adv_tok, config)
            clipped = _clip_region(ratio.detach(), adv_tok, config)
        if w is not None and config.algorithm != "kimi":  # kimi weighted its policy term above, not τ(log ρ)²
            per_token = per_token * w
        surrogate_loss = _normalise(per_token, weights, config, batch_sequences, batch_tokens)
        ratio_valid = valid

    loss = surrogate_loss
    kl_mean = torch.zeros((), dtype=dtype, device=logp.device)
    if config.kl_in_loss:
        assert ref_logp is not None  # checked in _check_inputs
        per_token_kl = kl_estimate(logp_f, ref_logp.detach().to(dtype), config.kl_estimator)
        # docs/methods.md P1: −β·D_KL sits inside the same normalisation as the surrogate.
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
        ratio_count=float(ratio_valid.sum().item()),
        kl_tokens=float(weights.sum().item()) if config.kl_in_loss else 0.0,
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
    if config.algorithm in PER_SEQUENCE_NORMALISER:
        # docs/methods.md P1: (1/G) Σ_i 1/|o_i|
        return (masked.sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)).sum() / sequences
    if config.algorithm in CONSTANT_NORMALISER:
        assert config.max_completion_length is not None  # checked by LossConfig
        return masked.sum() / (sequences * config.max_completion_length)  # docs/methods.md P2
    tokens = batch_tokens if batch_tokens is not None else weights.sum().clamp(min=1.0)
    return masked.sum() / tokens  # docs/methods.md P3/P4: 1 / Σ_i |o_i|


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
    if config.kl_in_loss:
        if ref_logp is None:
            raise ValueError(
                "ref_logp is required when the KL is in the loss (kl_coef > 0); pass the reference policy's "
                "log-probs or set kl_coef 0."
            )
        if tuple(ref_logp.shape) != shape:
            raise ValueError(f"ref_logp must have the shape of logp {shape}; got {tuple(ref_logp.shape)}.")
    if config.algorithm in CONSTANT_NORMALISER:
        assert config.max_completion_length is not None  # checked by LossConfig
        # Only sampled tokens count: observation tokens between turns sit in the [B, T] positions with mask 0.
        longest = int((mask.detach() != 0).sum(dim=1).max().item())
        if longest > config.max_completion_length:
            raise ValueError(
                f"max_completion_length={config.max_completion_length} is shorter than a sequence's {longest} "
                "sampled tokens; the constant normaliser must be the most tokens the policy can sample in one "
                "episode (max_new_tokens x the environment's max_turns)."
            )
