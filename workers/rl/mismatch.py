"""Train-inference mismatch: how far the rollout engine's log-probabilities are from the learner's, and the
importance-sampling corrections for it (docs/methods.md P7; Yao et al. 2025, as exposed by verl, slime and ms-swift).

Two policies hide behind π_old: the engine that sampled (π_eng, whose log-probs each sampled token carries) and the
learner's recomputation of the same tokens with the same weights (π_old). With a bf16 engine against an fp32
learner, or text re-encoded between turns, they differ, and on-policy training quietly becomes off-policy.

Per token, δ = log π_old − log π_eng and r = exp(δ). `mismatch_stats` reports mean and max |δ|, the k3 estimate of
KL(π_eng ‖ π_old) (the samples come from π_eng, so k3 = r − 1 − log r with r = π_old / π_eng) and the share of tokens
whose r leaves [1/C, C]. `correction_weights` gives the stop-gradient factor w that multiplies each token's
policy-gradient term:

- ``tis``: token-level truncated IS, w_t = min(r_t, C);
- ``mis``: token-level masked IS, w_t = r_t if r_t <= C else 0;
- ``seq_tis``: r_seq = exp(mean_t δ_t) (the geometric mean), w = min(r_seq, C) for every token of the sequence;
- ``seq_mis``: w = r_seq while r_seq is within [1/C, C], else 0 (the sequence is dropped).

C = 2 is the common default. The loss's ratio ρ stays π_θ / π_old: the correction is a separate factor.

Shapes as in `workers.rl.losses`: ``[B, T]`` log-probs of the sampled tokens and a 0/1 mask of the tokens that count.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from workers.rl.config_sections import CORRECTIONS, DEFAULT_MISMATCH_CAP, Correction

SEQUENCE_CORRECTIONS = frozenset({"seq_tis", "seq_mis"})
DEFAULT_CAP = DEFAULT_MISMATCH_CAP


def _delta(learner_logp: Tensor, engine_logp: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    if tuple(learner_logp.shape) != tuple(engine_logp.shape) or tuple(mask.shape) != tuple(learner_logp.shape):
        raise ValueError(
            "learner_logp, engine_logp and mask must share one [B, T] shape; got "
            f"{tuple(learner_logp.shape)}, {tuple(engine_logp.shape)} and {tuple(mask.shape)}."
        )
    weights = mask.detach().to(torch.float64)
    delta = (learner_logp.detach().to(torch.float64) - engine_logp.detach().to(torch.float64)) * weights
    return delta, weights


def mismatch_sums(
    learner_logp: Tensor, engine_logp: Tensor, mask: Tensor, cap: float = DEFAULT_CAP
) -> dict[str, float]:
    """Sums over the valid tokens (so micro-batches and ranks add up): tokens, Σ|δ|, max |δ|, Σ k3, tokens outside
    [1/C, C]. `mismatch_metrics` turns them into the step's figures."""
    delta, weights = _delta(learner_logp, engine_logp, mask)
    valid = weights > 0
    ratio = torch.exp(delta)
    k3 = (ratio - 1.0 - delta) * weights
    log_cap = math.log(cap)
    outside = (delta.abs() > log_cap) & valid
    return {
        "tokens": float(weights.sum()),
        "abs_delta_sum": float(delta.abs().sum()),
        "abs_delta_max": float(delta.abs().max()) if delta.numel() else 0.0,
        "k3_sum": float(k3.sum()),
        "outside": float(outside.sum()),
    }


def sums_by_engine(
    learner_logp: Tensor, engine_logp: Tensor, mask: Tensor, engines: list[int], num_engines: int, cap: float
) -> dict[str, float]:
    """`mismatch_sums` of the whole micro-batch, and with more than one engine the same sums of each engine's rows
    under `engine<e>/<key>` (row i was sampled by engine `engines[i]`), every engine's keys present (zeros when it
    has no row here) so ranks can reduce them in one order."""
    sums = mismatch_sums(learner_logp, engine_logp, mask, cap)
    if num_engines <= 1:
        return sums
    for e in range(num_engines):
        rows = [i for i, owner in enumerate(engines) if owner == e]
        part = (
            mismatch_sums(learner_logp[rows], engine_logp[rows], mask[rows], cap)
            if rows
            else dict.fromkeys(("tokens", "abs_delta_sum", "abs_delta_max", "k3_sum", "outside"), 0.0)
        )
        sums.update({f"engine{e}/{key}": value for key, value in part.items()})
    return sums


def sum_keys(num_engines: int) -> tuple[list[str], list[str]]:
    """The keys of `sums_by_engine` for `num_engines` engines, in one order on every rank: (summed, maxima)."""
    prefixes = [""] + ([f"engine{e}/" for e in range(num_engines)] if num_engines > 1 else [])
    summed = [f"{p}{k}" for p in prefixes for k in ("tokens", "abs_delta_sum", "k3_sum", "outside")]
    return summed, [f"{p}abs_delta_max" for p in prefixes]


def add_sums(total: dict[str, float], more: dict[str, float]) -> dict[str, float]:
    """Combine two `mismatch_sums` (max for the maxima, sums for the rest; per-engine keys alike)."""
    if not total or not more:
        return dict(total or more)
    keys = list(total) + [k for k in more if k not in total]
    return {
        key: max(total.get(key, 0.0), more.get(key, 0.0))
        if key.endswith("abs_delta_max")
        else total.get(key, 0.0) + more.get(key, 0.0)
        for key in keys
    }


def mismatch_metrics(sums: dict[str, float]) -> dict[str, float]:
    """The step's metrics (charted under ``mismatch/``): mean and max |δ| (nats), KL(π_eng ‖ π_old) by k3 per token,
    the share of tokens whose ratio leaves [1/C, C], and how many tokens were compared; with several engines also
    each engine's mean |δ| and KL (``mismatch/engine<e>/...``), so one engine that drifts shows."""
    tokens = sums.get("tokens", 0.0)
    if tokens <= 0:
        return {}
    metrics = {
        "mismatch/abs_logprob_diff_mean": sums["abs_delta_sum"] / tokens,
        "mismatch/abs_logprob_diff_max": sums["abs_delta_max"],
        "mismatch/kl_k3": sums["k3_sum"] / tokens,
        "mismatch/ratio_outside_share": sums["outside"] / tokens,
        "mismatch/tokens": tokens,
    }
    engines = sorted({key.split("/")[0] for key in sums if key.startswith("engine")})
    for engine in engines:
        count = sums.get(f"{engine}/tokens", 0.0)
        if count > 0:
            metrics[f"mismatch/{engine}/abs_logprob_diff_mean"] = sums[f"{engine}/abs_delta_sum"] / count
            metrics[f"mismatch/{engine}/kl_k3"] = sums[f"{engine}/k3_sum"] / count
    return metrics


def correction_weights(
    learner_logp: Tensor, engine_logp: Tensor, mask: Tensor, correction: Correction, cap: float = DEFAULT_CAP
) -> Tensor:
    """The stop-gradient factor per token (``[B, T]``, float32, 0 on padding) of `correction`; all ones for
    ``none``. Sequence-level corrections repeat the sequence's weight on each of its tokens."""
    delta, weights = _delta(learner_logp, engine_logp, mask)
    if correction == "none":
        return weights.to(torch.float32)
    ratio = torch.exp(delta)
    if correction == "tis":
        w = ratio.clamp(max=cap)
    elif correction == "mis":
        w = torch.where(ratio <= cap, ratio, torch.zeros_like(ratio))
    elif correction in SEQUENCE_CORRECTIONS:
        tokens = weights.sum(dim=1)
        seq_ratio = torch.exp(delta.sum(dim=1) / tokens.clamp(min=1.0))  # geometric mean of r over the sequence
        if correction == "seq_tis":
            per_seq = seq_ratio.clamp(max=cap)
        else:
            inside = (seq_ratio >= 1.0 / cap) & (seq_ratio <= cap)
            per_seq = torch.where(inside, seq_ratio, torch.zeros_like(seq_ratio))
        w = per_seq.unsqueeze(1).expand_as(delta)
    else:
        raise ValueError(f"correction must be one of {', '.join(CORRECTIONS)}; got {correction!r}.")
    return (w * weights).to(torch.float32)


def correction_share(weights: Tensor, mask: Tensor, correction: Correction, cap: float = DEFAULT_CAP) -> float:
    """Share of valid tokens the correction changed materially: truncated (w = C), or masked (w = 0)."""
    valid = mask.detach() > 0
    count = int(valid.sum())
    if correction == "none" or count == 0:
        return 0.0
    if correction in ("tis", "seq_tis"):
        touched = (weights >= cap - 1e-6) & valid
    else:
        touched = (weights == 0) & valid
    return float(touched.sum()) / count
