"""Our advantages and policy losses against TRL 1.16's `GRPOTrainer`, used as an independent oracle.

How TRL is called: `GRPOTrainer._compute_loss(model, inputs)` holds every loss variant but first runs the model
through `_get_per_token_logps_and_entropies`. `TRLLoss` below subclasses the trainer, skips its ``__init__``
(which needs a model, a dataset and an accelerator), sets only the attributes `_compute_loss` reads, and
overrides `_get_per_token_logps_and_entropies` to hand back our own ``[B, T]`` log-prob tensor (a leaf with
``requires_grad``). The same values then go through our `policy_loss`, and losses, gradients and the clip and KL
metrics are compared in float64. If a TRL upgrade reads a new attribute, these tests fail with an
AttributeError that names it.

TRL computes advantages inline in `_generate_and_score_completions`, so the advantage oracle re-states those
lines (group mean, TRL's own `nanstd`, ``+ 1e-4``) over TRL-style contiguous groups.

Convention differences between docs/methods.md section 4 (our implementation) and TRL 1.16 (also in
``workers/rl/CONVENTIONS.md``):

1. Sign and scale: both return a loss (−J). TRL divides GRPO, Dr. GRPO and BNPO losses by the gradient
   accumulation steps, and DAPO/CISPO by ``num_items_in_batch`` rescaled to one accumulation window; here there
   is one process, one accumulation step and one step per generation, so no extra factor appears.
2. KL direction: both use r = π_ref / π_θ, k3 = r − 1 − log r (P1), added per token and normalised like the
   policy term. TRL's default ``use_bias_correction_kl=True`` multiplies k3 by ρ = π_θ / π_old *with* its gradient:
   even on-policy (ρ = 1) the KL gradient gains β·k3·∇log π_θ per token. We follow P1 (no factor); parity needs
   ``use_bias_correction_kl=False``. TRL's default β is 0 and it only implements k3; k1 and k2 are ours alone.
3. Dr. GRPO: TRL's default ``scale_rewards="group"`` divides advantages by the std even for
   ``loss_type="dr_grpo"``; ``"none"`` gives P2. Both divide the token sum by B · max_completion_length.
4. DAPO: TRL's default loss_type is ``"dapo"`` but ``epsilon_high`` falls back to ``epsilon`` (0.2): no
   clip-higher unless ``epsilon_high=0.28`` is set. TRL normalises by the token count of the whole generation
   batch; ours by the tokens passed in (equal when the call sees the whole batch).
5. CISPO: TRL's ``epsilon_high`` is an absolute cap on the weight (recommended 5.0), ours a distance from 1
   (``cap = 1 + epsilon_high``, default 4.0 ⇒ 5.0). TRL has no lower bound (ours: ``1 − epsilon_low``, default
   ε_low = 1 ⇒ 0, i.e. none) and no unified mask (ours: ``cispo_mask``). Left unset, TRL's cap falls back to
   ``epsilon`` = 0.2, below 1, so every weight is at most 0.2: a silently shrunken gradient.
6. GSPO: TRL's ``importance_sampling_level="sequence"`` with ``loss_type="grpo"`` is P5, gradient included
   (s_i = exp(mean_t log ρ) differentiated through every token). Empty sequences contribute 0 in both.
7. Advantages: TRL's (r − mean) / (std + 1e-4) with the n−1 std over contiguous groups is our
   ``scale="group"``. TRL zeroes the advantage of unscorable (NaN-reward) completions; we reject NaN rewards. For
   an all-equal group TRL returns ±ulp / 1e-4 rounding noise, we return exactly 0 (and drop the group unless
   ``drop_equal_groups=False``).
8. Metrics: our ``clip_fraction`` equals TRL's ``clip_ratio/region_mean`` (for CISPO, ``cispo_clip_ratio`` when
   ε_low >= 1), and our ``kl`` its ``kl`` metric (without bias correction).
9. Tinker's ``cispo`` loss (which Chroma used) sums over tokens without normalising: N times ours and TRL's.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Literal

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import nanstd

from workers.rl.advantages import group_advantages
from workers.rl.losses import LossConfig, LossOutput, policy_loss


class _OneProcess:
    """The few `accelerate.Accelerator` methods `_compute_loss` calls, for a single process."""

    num_processes = 1

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    gather_for_metrics = gather

    def reduce(self, tensor: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        return tensor


class TRLLoss(GRPOTrainer):
    """TRL's `_compute_loss` with our log-probs in place of a model forward pass."""

    def __init__(  # deliberately no super().__init__: it would build a model, a dataset and an accelerator
        self,
        *,
        loss_type: str,
        epsilon_low: float,
        epsilon_high: float,
        beta: float,
        importance_sampling_level: str = "token",
        use_bias_correction_kl: bool = False,
        max_completion_length: int | None = None,
    ) -> None:
        self.loss_type = loss_type
        self.epsilon_low = epsilon_low
        self.epsilon_high = epsilon_high
        self.beta = beta
        self.importance_sampling_level = importance_sampling_level
        self.max_completion_length = max_completion_length
        self.args = SimpleNamespace(use_bias_correction_kl=use_bias_correction_kl, delta=None, steps_per_generation=1)
        self.model = SimpleNamespace(training=True)
        self.accelerator = _OneProcess()
        self.current_gradient_accumulation_steps = 1
        self.top_entropy_quantile = 1.0
        self.off_policy_mask_threshold = None
        self.use_vllm = False
        self.vllm_importance_sampling_correction = False
        self.aux_loss_enabled = False
        self._entropy_bonus_enabled = False
        self._metrics: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        self._logps: torch.Tensor | None = None

    def _get_per_token_logps_and_entropies(
        self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor, None]:
        assert self._logps is not None
        return self._logps, torch.zeros_like(self._logps.detach()), None

    def loss(self, batch: Batch, logp: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """TRL's loss for ``batch`` with ``logp`` as the policy's log-probs, and its logged metrics."""
        self._logps = logp
        size, length = logp.shape
        inputs = {
            "prompt_ids": torch.zeros(size, 1, dtype=torch.long),
            "prompt_mask": torch.ones(size, 1, dtype=torch.long),
            "completion_ids": torch.zeros(size, length, dtype=torch.long),
            "completion_mask": batch.mask.long(),
            "advantages": batch.advantages,
            "old_per_token_logps": batch.old_logp,
            "ref_per_token_logps": batch.ref_logp,
            "num_items_in_batch": batch.mask.sum(),
        }
        loss = self._compute_loss(None, inputs)
        metrics = {name: values[-1] for name, values in self._metrics["train"].items()}
        return loss, metrics


@dataclass
class Batch:
    logp: torch.Tensor  # [B, T] values only; each side gets its own leaf
    old_logp: torch.Tensor
    ref_logp: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor  # [B, T] bool


GROUP_SIZE = 4


def make_batch(
    seed: int,
    *,
    log_ratio_scale: float,
    scale: Literal["none", "group"] = "group",
    size: int = 12,
    length: int = 7,
) -> Batch:
    """Random completions with ragged lengths 1..length, off-policy by ``log_ratio_scale``, in float64."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (size,), generator=gen)
    lengths[0] = length
    mask = torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)
    logp = -3.0 * torch.rand(size, length, generator=gen, dtype=torch.float64) - 0.01
    old_logp = logp + log_ratio_scale * torch.randn(size, length, generator=gen, dtype=torch.float64)
    ref_logp = logp + 0.3 * torch.randn(size, length, generator=gen, dtype=torch.float64)
    rewards = torch.randint(0, 4, (size,), generator=gen).to(torch.float64)
    advantages = group_advantages(rewards, GROUP_SIZE, scale=scale, drop_equal_groups=False).advantages
    assert bool(advantages.ne(0).any())
    return Batch(logp=logp, old_logp=old_logp, ref_logp=ref_logp, advantages=advantages, mask=mask)


@dataclass
class Compared:
    ours: LossOutput
    our_grad: torch.Tensor
    trl_loss: torch.Tensor
    trl_metrics: dict[str, float]
    trl_grad: torch.Tensor

    def assert_same_loss_and_gradient(self) -> None:
        torch.testing.assert_close(self.ours.loss, self.trl_loss, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(self.our_grad, self.trl_grad, rtol=1e-10, atol=1e-12)


def compare(batch: Batch, ours: LossConfig, trl: TRLLoss) -> Compared:
    """Our output and gradient, and TRL's loss, metrics and gradient, for the same batch."""
    our_logp = batch.logp.clone().requires_grad_(True)
    out = policy_loss(our_logp, batch.old_logp, batch.advantages, batch.mask, ours, batch.ref_logp)
    (our_grad,) = torch.autograd.grad(out.loss, our_logp)
    trl_logp = batch.logp.clone().requires_grad_(True)
    trl_loss, trl_metrics = trl.loss(batch, trl_logp)
    (trl_grad,) = torch.autograd.grad(trl_loss, trl_logp)
    return Compared(out, our_grad, trl_loss, trl_metrics, trl_grad)


# --- PPO-style clipped losses: GRPO, Dr. GRPO, DAPO, GSPO -------------------------------------------------------

CLIPPED_CASES = {
    "grpo with k3 kl": (
        LossConfig(algorithm="grpo", epsilon_low=0.2, epsilon_high=0.2, kl_coef=0.04, kl_estimator="k3"),
        {"loss_type": "grpo", "epsilon_low": 0.2, "epsilon_high": 0.2, "beta": 0.04},
        "group",
        0.3,
    ),
    "grpo without kl": (
        LossConfig(algorithm="grpo", epsilon_low=0.2, epsilon_high=0.2),
        {"loss_type": "grpo", "epsilon_low": 0.2, "epsilon_high": 0.2, "beta": 0.0},
        "group",
        0.3,
    ),
    "dr grpo with unscaled advantages": (
        LossConfig(algorithm="dr_grpo", epsilon_low=0.2, epsilon_high=0.2, max_completion_length=10),
        {"loss_type": "dr_grpo", "epsilon_low": 0.2, "epsilon_high": 0.2, "beta": 0.0, "max_completion_length": 10},
        "none",
        0.3,
    ),
    "dapo with clip-higher": (
        LossConfig.defaults("dapo"),
        {"loss_type": "dapo", "epsilon_low": 0.2, "epsilon_high": 0.28, "beta": 0.0},
        "group",
        0.3,
    ),
    "dapo with k3 kl": (
        dataclasses.replace(LossConfig.defaults("dapo"), kl_coef=0.04),
        {"loss_type": "dapo", "epsilon_low": 0.2, "epsilon_high": 0.28, "beta": 0.04},
        "group",
        0.3,
    ),
    "gspo": (
        LossConfig.defaults("gspo"),
        {"loss_type": "grpo", "epsilon_low": 3e-4, "epsilon_high": 4e-4, "beta": 0.0},
        "group",
        1e-3,
    ),
    "gspo with k3 kl": (
        dataclasses.replace(LossConfig.defaults("gspo"), kl_coef=0.04),
        {"loss_type": "grpo", "epsilon_low": 3e-4, "epsilon_high": 4e-4, "beta": 0.04},
        "group",
        1e-3,
    ),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("case", list(CLIPPED_CASES))
def test_clipped_losses_match_trl_in_value_gradient_and_metrics(case: str, seed: int) -> None:
    ours, trl_kwargs, scale, log_ratio_scale = CLIPPED_CASES[case]
    level = "sequence" if ours.algorithm == "gspo" else "token"
    trl = TRLLoss(importance_sampling_level=level, **trl_kwargs)  # type: ignore[arg-type]
    batch = make_batch(seed, log_ratio_scale=log_ratio_scale, scale=scale)  # type: ignore[arg-type]

    compared = compare(batch, ours, trl)

    compared.assert_same_loss_and_gradient()
    # the batch exercises both sides of the clip, so the comparison covers clipped and unclipped terms
    clip_fraction = compared.ours.clip_fraction
    assert 0 < clip_fraction < 1
    assert clip_fraction == pytest.approx(compared.trl_metrics["clip_ratio/region_mean"], rel=1e-6)  # TRL: float32
    if ours.kl_coef:
        assert compared.ours.kl == pytest.approx(compared.trl_metrics["kl"], rel=1e-10)


# --- CISPO ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("our_epsilon_high", "trl_cap"), [(4.0, 5.0), (0.5, 1.5)])
def test_cispo_matches_trl_when_its_absolute_cap_is_one_plus_our_epsilon_high(
    seed: int, our_epsilon_high: float, trl_cap: float
) -> None:
    ours = dataclasses.replace(LossConfig.defaults("cispo"), epsilon_high=our_epsilon_high)
    trl = TRLLoss(loss_type="cispo", epsilon_low=0.2, epsilon_high=trl_cap, beta=0.0)  # TRL ignores epsilon_low here
    batch = make_batch(seed, log_ratio_scale=1.5)

    compared = compare(batch, ours, trl)

    compared.assert_same_loss_and_gradient()
    capped = (batch.logp - batch.old_logp).exp().gt(trl_cap) & batch.mask
    assert bool(capped.any()), "the batch should exercise the cap"
    assert compared.ours.clip_fraction == pytest.approx(compared.trl_metrics["cispo_clip_ratio"], rel=1e-6)


def test_cispo_unified_mask_has_no_trl_counterpart_and_changes_the_loss() -> None:
    batch = make_batch(0, log_ratio_scale=1.5)
    trl = TRLLoss(loss_type="cispo", epsilon_low=0.2, epsilon_high=1.5, beta=0.0)
    masked = LossConfig(algorithm="cispo", epsilon_low=1.0, epsilon_high=0.5, cispo_mask=True)

    compared = compare(batch, masked, trl)

    assert abs(compared.ours.loss.item() - compared.trl_loss.item()) > 1e-6


# --- KL bias correction (TRL default) ---------------------------------------------------------------------------


def test_trl_default_kl_bias_correction_keeps_on_policy_values_but_adds_beta_k3_to_the_gradient() -> None:
    batch = make_batch(3, log_ratio_scale=0.0)  # old_logp == logp: ρ = 1 in value
    ours = LossConfig.defaults("grpo")
    trl = TRLLoss(loss_type="grpo", epsilon_low=0.2, epsilon_high=0.2, beta=0.04, use_bias_correction_kl=True)

    compared = compare(batch, ours, trl)

    torch.testing.assert_close(compared.ours.loss, compared.trl_loss, rtol=1e-10, atol=1e-12)
    # TRL's k3·ρ has d/dlog π_θ = k3·ρ + ρ·dk3; with ρ = 1 the extra term is β·k3 / (B · |o_i|) per token
    weights = batch.mask.to(torch.float64)
    log_r = batch.ref_logp - batch.logp
    k3 = log_r.exp() - 1 - log_r
    extra = 0.04 * k3 * weights / (weights.sum(dim=1, keepdim=True) * batch.logp.shape[0])
    assert bool(extra.abs().max() > 1e-4)
    torch.testing.assert_close(compared.trl_grad - compared.our_grad, extra, rtol=1e-9, atol=1e-12)


# --- advantages -------------------------------------------------------------------------------------------------


def trl_style_advantages(rewards: torch.Tensor, group_size: int, *, scale_rewards: str) -> torch.Tensor:
    """The advantage lines of TRL's `_generate_and_score_completions` (sum_then_normalize), with TRL's nanstd."""
    grouped = rewards.view(-1, group_size)
    baseline = grouped.mean(dim=1).repeat_interleave(group_size)
    centred = rewards - baseline
    if scale_rewards == "none":
        return centred
    return centred / (nanstd(grouped, dim=1).repeat_interleave(group_size) + 1e-4)


@pytest.mark.parametrize(("ours", "theirs"), [("group", "group"), ("none", "none")])
def test_advantages_match_trl_over_contiguous_groups(ours: Literal["none", "group"], theirs: str) -> None:
    gen = torch.Generator().manual_seed(7)
    rewards = torch.rand(32, generator=gen, dtype=torch.float64) * 2 - 0.5
    rewards[8:16] = 0.7  # one all-equal group: TRL gives ~0, we give exactly 0

    result = group_advantages(rewards, 8, scale=ours, drop_equal_groups=False)

    torch.testing.assert_close(result.advantages, trl_style_advantages(rewards, 8, scale_rewards=theirs))
    assert result.advantages[8:16].eq(0).all()


def test_trl_defaults_that_differ_from_the_papers_are_still_what_our_docs_say() -> None:
    defaults = {field.name: field.default for field in dataclasses.fields(GRPOConfig)}

    assert defaults["loss_type"] == "dapo"
    assert (defaults["epsilon"], defaults["epsilon_high"]) == (0.2, None)  # no clip-higher, CISPO cap 0.2
    assert defaults["beta"] == 0.0
    assert defaults["use_bias_correction_kl"] is True
    assert defaults["scale_rewards"] == "group"
    assert defaults["importance_sampling_level"] == "token"
