"""Policy losses (docs/methods.md P1-P6) against formulas evaluated by hand in plain Python floats.

One small batch serves most tests: 2 sequences of 3 tokens, the last token of sequence 2 is padding.

    log ρ = log π_θ − log π_old   [[0.1, −0.3, 0.5], [−0.05, 0.2, (0.9)]]
    ρ                             [[1.10517, 0.74082, 1.64872], [0.95123, 1.22140, (2.45960)]]
    A                             [1.0, −0.5]
    log r = log π_ref − log π_θ   [[0.2, −0.1, 0.0], [0.3, −0.2, (5.0)]]

With ε = 0.2, token (0, 2) sits above 1 + ε with A > 0, so the clip zeroes its gradient; token (1, 1) sits above
1 + ε with A < 0, where the pessimistic min keeps the unclipped term and its gradient.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from workers.rl.losses import LossConfig, kl_estimate, policy_loss, sequence_kl

LOGP = [[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]]
LOG_RATIO = [[0.1, -0.3, 0.5], [-0.05, 0.2, 0.9]]
LOG_R_REF = [[0.2, -0.1, 0.0], [0.3, -0.2, 5.0]]
MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
ADV = [1.0, -0.5]
VALID = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
LENGTHS = [3, 2]


def batch() -> dict[str, torch.Tensor]:
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    return {
        "logp": logp,
        "old_logp": torch.tensor(LOGP, dtype=torch.float64) - torch.tensor(LOG_RATIO, dtype=torch.float64),
        "advantages": torch.tensor(ADV, dtype=torch.float64),
        "mask": torch.tensor(MASK, dtype=torch.float64),
        "ref_logp": torch.tensor(LOGP, dtype=torch.float64) + torch.tensor(LOG_R_REF, dtype=torch.float64),
    }


def rho(i: int, t: int) -> float:
    return math.exp(LOG_RATIO[i][t])


def ppo_term(ratio: float, adv: float, eps_low: float, eps_high: float) -> float:
    """min(ρ·A, clip(ρ, 1 − ε_low, 1 + ε_high)·A), the per-token objective of P1-P3."""
    return min(ratio * adv, min(max(ratio, 1 - eps_low), 1 + eps_high) * adv)


def k3(log_r: float) -> float:
    return math.exp(log_r) - 1 - log_r


def grad_of(out_loss: torch.Tensor, logp: torch.Tensor) -> list[list[float]]:
    (grad,) = torch.autograd.grad(out_loss, logp)
    return grad.tolist()


def assert_grid(actual: list[list[float]], expected: list[list[float]]) -> None:
    for row_actual, row_expected in zip(actual, expected, strict=True):
        assert row_actual == pytest.approx(row_expected, abs=1e-12)


# --- GRPO (P1) --------------------------------------------------------------------------------------------------


def test_grpo_averages_tokens_within_each_sequence_then_averages_sequences() -> None:
    config = LossConfig(algorithm="grpo", epsilon_low=0.2, epsilon_high=0.2)

    out = policy_loss(**{k: v for k, v in batch().items() if k != "ref_logp"}, config=config)

    # seq 1 terms: 1.10517, 0.74082 (ρ < 0.8 but A > 0: the min keeps ρ·A), 1.2 (clipped)
    seq1 = (ppo_term(rho(0, 0), 1.0, 0.2, 0.2) + ppo_term(rho(0, 1), 1.0, 0.2, 0.2) + 1.2 * 1.0) / 3
    # seq 2 terms: −0.47562, −0.61070 (ρ > 1.2 with A < 0: the min keeps ρ·A)
    seq2 = (rho(1, 0) * -0.5 + rho(1, 1) * -0.5) / 2
    assert out.loss.item() == pytest.approx(-(seq1 + seq2) / 2, abs=1e-12)
    assert out.policy_loss == pytest.approx(out.loss.item(), abs=1e-12)
    assert out.kl == 0.0


def test_grpo_gradient_is_minus_rho_times_advantage_over_length_and_batch_except_where_clipped() -> None:
    data = batch()
    config = LossConfig(algorithm="grpo", epsilon_low=0.2, epsilon_high=0.2)

    out = policy_loss(data["logp"], data["old_logp"], data["advantages"], data["mask"], config)

    expected = [
        [-rho(0, 0) * 1.0 / (2 * 3), -rho(0, 1) * 1.0 / (2 * 3), 0.0],
        [-rho(1, 0) * -0.5 / (2 * 2), -rho(1, 1) * -0.5 / (2 * 2), 0.0],
    ]
    assert_grid(grad_of(out.loss, data["logp"]), expected)


def test_grpo_adds_beta_times_the_k3_kl_inside_the_per_sequence_mean() -> None:
    data = batch()
    config = LossConfig(algorithm="grpo", epsilon_low=0.2, epsilon_high=0.2, kl_coef=0.04, kl_estimator="k3")

    out = policy_loss(data["logp"], data["old_logp"], data["advantages"], data["mask"], config, data["ref_logp"])

    no_kl = policy_loss(data["logp"], data["old_logp"], data["advantages"], data["mask"], replace(config, kl_coef=0))
    kl_seq1 = (k3(0.2) + k3(-0.1) + k3(0.0)) / 3
    kl_seq2 = (k3(0.3) + k3(-0.2)) / 2
    assert out.loss.item() == pytest.approx(no_kl.loss.item() + 0.04 * (kl_seq1 + kl_seq2) / 2, abs=1e-12)
    assert out.policy_loss == pytest.approx(no_kl.loss.item(), abs=1e-12)
    # the kl metric is the plain mean over the 5 valid tokens; the padded log r = 5.0 is ignored
    assert out.kl == pytest.approx((k3(0.2) + k3(-0.1) + k3(0.0) + k3(0.3) + k3(-0.2)) / 5, abs=1e-12)
    # d k3 / d log π_θ = 1 − r, weighted like the surrogate: β / (B · |o_i|)
    surrogate_grad = grad_of(no_kl.loss, data["logp"])
    expected = [[0.0] * 3 for _ in range(2)]
    for i, t in VALID:
        expected[i][t] = surrogate_grad[i][t] + 0.04 * (1 - math.exp(LOG_R_REF[i][t])) / (2 * LENGTHS[i])
    assert_grid(grad_of(out.loss, data["logp"]), expected)


def test_grpo_on_policy_loss_is_minus_the_mean_advantage() -> None:
    data = batch()
    config = LossConfig(algorithm="grpo", epsilon_low=0.2, epsilon_high=0.2)

    out = policy_loss(data["logp"], data["logp"].detach(), data["advantages"], data["mask"], config)

    assert out.loss.item() == pytest.approx(-(1.0 - 0.5) / 2, abs=1e-12)
    assert (out.ratio_mean, out.ratio_max, out.clip_fraction) == (1.0, 1.0, 0.0)


def test_grpo_counts_an_empty_sequence_as_zero_in_the_batch_mean() -> None:
    data = batch()
    config = LossConfig(algorithm="grpo", epsilon_low=0.2, epsilon_high=0.2)
    full = policy_loss(data["logp"], data["old_logp"], data["advantages"], data["mask"], config)

    padded = policy_loss(
        torch.cat([data["logp"], torch.zeros(1, 3, dtype=torch.float64)]),
        torch.cat([data["old_logp"], torch.full((1, 3), -1.0, dtype=torch.float64)]),
        torch.cat([data["advantages"], torch.tensor([2.0], dtype=torch.float64)]),
        torch.cat([data["mask"], torch.zeros(1, 3, dtype=torch.float64)]),
        config,
    )

    assert padded.loss.item() == pytest.approx(full.loss.item() * 2 / 3, abs=1e-12)


def test_metrics_report_clipped_share_and_ratios_over_valid_tokens_only() -> None:
    data = batch()
    config = LossConfig(algorithm="grpo", epsilon_low=0.2, epsilon_high=0.2)

    out = policy_loss(data["logp"], data["old_logp"], data["advantages"], data["mask"], config)

    # only token (0, 2) is in the clip region: A > 0 and ρ = 1.649 > 1.2
    assert out.clip_fraction == pytest.approx(1 / 5)
    assert out.ratio_mean == pytest.approx(sum(rho(i, t) for i, t in VALID) / 5, abs=1e-12)
    assert out.ratio_max == pytest.approx(math.exp(0.5), abs=1e-12)  # not the padded e^0.9
    assert set(out.metrics()) == {"policy_loss", "kl", "clip_fraction", "ratio_mean", "ratio_max"}


# --- Dr. GRPO (P2) and DAPO (P3) --------------------------------------------------------------------------------


def test_dr_grpo_divides_the_token_sum_by_batch_size_times_max_completion_length() -> None:
    data = batch()
    config = LossConfig(algorithm="dr_grpo", epsilon_low=0.2, epsilon_high=0.2, max_completion_length=4)

    out = policy_loss(data["logp"], data["old_logp"], data["advantages"], data["mask"], config)

    token_sum = sum(ppo_term(rho(i, t), ADV[i], 0.2, 0.2) for i, t in VALID)
    assert out.loss.item() == pytest.approx(-token_sum / (2 * 4), abs=1e-12)
    expected = [
        [-rho(0, 0) / 8, -rho(0, 1) / 8, 0.0],
        [-rho(1, 0) * -0.5 / 8, -rho(1, 1) * -0.5 / 8, 0.0],
    ]
    assert_grid(grad_of(out.loss, data["logp"]), expected)


def test_composer_normalises_like_dr_grpo_and_keeps_its_kl_out_of_the_loss() -> None:
    data = batch()
    args = (data["logp"], data["old_logp"], data["advantages"], data["mask"])

    composer = policy_loss(*args, LossConfig.defaults("composer", max_completion_length=4))
    dr_grpo = policy_loss(*args, LossConfig.defaults("dr_grpo", max_completion_length=4))

    assert composer.loss.item() == pytest.approx(dr_grpo.loss.item(), abs=1e-15) and composer.kl == 0.0


def test_dapo_divides_the_token_sum_by_the_number_of_valid_tokens_and_clips_higher() -> None:
    data = batch()
    config = LossConfig.defaults("dapo")

    out = policy_loss(data["logp"], data["old_logp"], data["advantages"], data["mask"], config)

    # token (0, 2): ρ = 1.649 is clipped at 1.28 rather than 1.2; token (1, 1): ρ = 1.221 is now inside the range
    terms = [rho(0, 0), rho(0, 1), 1.28, rho(1, 0) * -0.5, rho(1, 1) * -0.5]
    assert [ppo_term(rho(i, t), ADV[i], 0.2, 0.28) for i, t in VALID] == pytest.approx(terms)
    assert out.loss.item() == pytest.approx(-sum(terms) / 5, abs=1e-12)
    assert out.clip_fraction == pytest.approx(1 / 5)


def test_dapo_adds_the_k2_kl_with_the_same_token_normaliser() -> None:
    data = batch()
    config = replace(LossConfig.defaults("dapo"), kl_coef=0.1, kl_estimator="k2")

    out = policy_loss(data["logp"], data["old_logp"], data["advantages"], data["mask"], config, data["ref_logp"])

    # k2 = ½ (log r)²
    k2_sum = sum(0.5 * LOG_R_REF[i][t] ** 2 for i, t in VALID)
    assert out.loss.item() == pytest.approx(out.policy_loss + 0.1 * k2_sum / 5, abs=1e-12)
    assert out.kl == pytest.approx(k2_sum / 5, abs=1e-12)
    assert out.kl_tokens == 5


# --- KL placement (P6) ------------------------------------------------------------------------------------------


def test_k1_in_the_loss_is_refused_because_its_gradient_is_zero_in_expectation() -> None:
    with pytest.raises(ValueError, match="^kl_estimator='k1' in the loss has zero gradient.*kl_placement='reward'"):
        replace(LossConfig.defaults("grpo"), kl_estimator="k1")
    # Off (β = 0) it is harmless, and in the reward it is k1's placement.
    assert replace(LossConfig.defaults("grpo"), kl_estimator="k1", kl_coef=0.0).kl_coef == 0.0
    assert replace(LossConfig.defaults("grpo"), kl_estimator="k1", kl_placement="reward").kl_in_reward


def test_the_k1_loss_gradient_averages_to_zero_on_policy_which_is_why_it_is_refused() -> None:
    """E_π[∇ k1] = Σ_y π ∇log π = ∇ Σ_y π = 0: the exact expectation over a 3-token vocabulary."""
    logits = torch.tensor([0.3, -1.0, 0.8], dtype=torch.float64, requires_grad=True)
    ref = torch.log_softmax(torch.tensor([0.0, 0.5, -0.2], dtype=torch.float64), dim=0)
    logp = torch.log_softmax(logits, dim=0)
    probs = logp.exp().detach()
    k1 = kl_estimate(logp, ref, "k1")
    (k1_grad,) = torch.autograd.grad((probs * k1).sum(), logits, retain_graph=True)  # E of the per-sample grad
    assert k1_grad.abs().max().item() < 1e-15
    # k2's expected gradient is the true ∇ KL(π ‖ π_ref): it is a working loss-placed estimator.
    k2 = kl_estimate(logp, ref, "k2")
    (k2_grad,) = torch.autograd.grad((probs * k2).sum(), logits, retain_graph=True)
    exact = (logp.exp() * (logp - ref)).sum()
    (kl_grad,) = torch.autograd.grad(exact, logits)
    assert torch.allclose(k2_grad, kl_grad, atol=1e-12)


def test_a_reward_placed_kl_adds_nothing_to_the_loss_and_needs_no_reference() -> None:
    data = batch()
    config = replace(LossConfig.defaults("dapo"), kl_coef=0.1, kl_estimator="k1", kl_placement="reward")
    plain = policy_loss(data["logp"], data["old_logp"], data["advantages"], data["mask"], LossConfig.defaults("dapo"))

    out = policy_loss(data["logp"], data["old_logp"], data["advantages"], data["mask"], config)

    assert out.loss.item() == pytest.approx(plain.loss.item(), abs=1e-15) and out.kl == 0.0


def test_sequence_kl_sums_the_estimator_over_each_sequences_sampled_tokens() -> None:
    data = batch()
    old = data["old_logp"]
    ref = old + torch.tensor(LOG_R_REF, dtype=torch.float64)  # log π_ref − log π_old = LOG_R_REF

    k1 = sequence_kl(old, ref, data["mask"], "k1")
    k3_values = sequence_kl(old, ref, data["mask"], "k3")

    assert k1.tolist() == pytest.approx([-(0.2 - 0.1 + 0.0), -(0.3 - 0.2)], abs=1e-12)  # Σ_t log π_old − log π_ref
    assert k3_values.tolist() == pytest.approx([k3(0.2) + k3(-0.1) + k3(0.0), k3(0.3) + k3(-0.2)], abs=1e-12)
    assert not k1.requires_grad


# --- CISPO (P4) -------------------------------------------------------------------------------------------------


def test_cispo_loss_is_minus_capped_weight_times_advantage_times_logp_over_the_token_count() -> None:
    data = batch()
    config = LossConfig(algorithm="cispo", epsilon_low=1.0, epsilon_high=0.2)

    out = policy_loss(data["logp"], data["old_logp"], data["advantages"], data["mask"], config)

    weights = [[rho(0, 0), rho(0, 1), 1.2], [rho(1, 0), 1.2]]  # r̂ = min(ρ, 1.2); no lower bound
    total = sum(weights[i][t] * ADV[i] * LOGP[i][t] for i, t in VALID)
    assert out.loss.item() == pytest.approx(-total / 5, abs=1e-12)
    assert out.clip_fraction == pytest.approx(1 / 5)  # token (0, 2): A > 0 and ρ > 1.2


def test_cispo_gradient_is_the_stop_gradient_weight_times_advantage_over_the_token_count() -> None:
    data = batch()
    config = LossConfig(algorithm="cispo", epsilon_low=1.0, epsilon_high=0.2)

    out = policy_loss(data["logp"], data["old_logp"], data["advantages"], data["mask"], config)

    # every valid token keeps a gradient, even the capped ones: −sg(r̂)·A / N
    expected = [
        [-rho(0, 0) / 5, -rho(0, 1) / 5, -1.2 / 5],
        [-rho(1, 0) * -0.5 / 5, -1.2 * -0.5 / 5, 0.0],
    ]
    assert_grid(grad_of(out.loss, data["logp"]), expected)


def test_cispo_unified_mask_drops_tokens_the_ppo_clip_would_have_zeroed() -> None:
    data = batch()
    config = LossConfig(algorithm="cispo", epsilon_low=0.02, epsilon_high=0.2, cispo_mask=True)

    out = policy_loss(data["logp"], data["old_logp"], data["advantages"], data["mask"], config)

    # (0, 2): A > 0, ρ = 1.649 > 1.2 → masked. (1, 0): A < 0, ρ = 0.951 < 0.98 → masked.
    # (0, 1): ρ = 0.741 is lifted to 0.98 but A > 0, so kept. (1, 1): capped at 1.2 but A < 0, so kept.
    kept = {(0, 0): rho(0, 0), (0, 1): 0.98, (1, 1): 1.2}
    total = sum(w * ADV[i] * LOGP[i][t] for (i, t), w in kept.items())
    assert out.loss.item() == pytest.approx(-total / 5, abs=1e-12)  # still divided by all 5 valid tokens
    expected = [[-rho(0, 0) / 5, -0.98 / 5, 0.0], [0.0, -1.2 * -0.5 / 5, 0.0]]
    assert_grid(grad_of(out.loss, data["logp"]), expected)
    assert out.clip_fraction == pytest.approx(2 / 5)


# --- GSPO (P5) --------------------------------------------------------------------------------------------------


def test_gspo_clips_the_geometric_mean_sequence_ratio() -> None:
    data = batch()
    config = LossConfig.defaults("gspo")

    out = policy_loss(data["logp"], data["old_logp"], data["advantages"], data["mask"], config)

    s1 = math.exp((0.1 - 0.3 + 0.5) / 3)  # 1.10517 > 1 + 4e-4 with A > 0: clipped
    s2 = math.exp((-0.05 + 0.2) / 2)  # 1.07788 with A < 0: the min keeps s·A
    assert out.loss.item() == pytest.approx(-((1 + 4e-4) * 1.0 + s2 * -0.5) / 2, abs=1e-12)
    assert out.clip_fraction == pytest.approx(1 / 2)
    assert out.ratio_mean == pytest.approx((s1 + s2) / 2, abs=1e-12)
    assert out.ratio_max == pytest.approx(s1, abs=1e-12)
    # d s_i / d log π_θ(o_it) = s_i / |o_i|, so each token of sequence 2 gets −A·s2 / |o_2| / B; the clipped
    # sequence gets no gradient
    token_grad = 0.5 * s2 / 2 / 2
    expected = [[0.0, 0.0, 0.0], [token_grad, token_grad, 0.0]]
    assert_grid(grad_of(out.loss, data["logp"]), expected)


def test_gspo_ignores_an_empty_sequence() -> None:
    config = LossConfig.defaults("gspo")
    logp = torch.tensor([[-1.0, -1.0], [-2.0, -2.0]], dtype=torch.float64, requires_grad=True)

    out = policy_loss(
        logp,
        logp.detach(),
        torch.tensor([1.0, 3.0], dtype=torch.float64),
        torch.tensor([[1.0, 1.0], [0.0, 0.0]], dtype=torch.float64),
        config,
    )

    # on-policy s = 1: sequence 1 contributes −A = −1, the empty one 0 (not −3)
    assert out.loss.item() == pytest.approx(-1.0 / 2, abs=1e-12)
    assert out.ratio_mean == 1.0


# --- KL estimators (P6) -----------------------------------------------------------------------------------------


def test_kl_estimators_use_r_equal_to_reference_over_policy() -> None:
    logp = torch.tensor([-1.0], dtype=torch.float64)
    ref_logp = torch.tensor([-1.5], dtype=torch.float64)  # log r = −0.5

    assert kl_estimate(logp, ref_logp, "k1").item() == pytest.approx(0.5)
    assert kl_estimate(logp, ref_logp, "k2").item() == pytest.approx(0.125)
    assert kl_estimate(logp, ref_logp, "k3").item() == pytest.approx(math.exp(-0.5) - 1 + 0.5)


def test_k1_and_k3_average_to_kl_of_policy_from_reference_under_the_policy() -> None:
    policy = [0.5, 0.3, 0.2]
    reference = [0.2, 0.5, 0.3]
    forward_kl = sum(p * math.log(p / q) for p, q in zip(policy, reference, strict=True))  # KL(π_θ ‖ π_ref)
    logp = torch.tensor(policy, dtype=torch.float64).log()
    ref_logp = torch.tensor(reference, dtype=torch.float64).log()
    weights = torch.tensor(policy, dtype=torch.float64)

    for estimator in ("k1", "k3"):
        expectation = (weights * kl_estimate(logp, ref_logp, estimator)).sum().item()
        assert expectation == pytest.approx(forward_kl, abs=1e-12), estimator


def test_kl_estimate_rejects_an_unknown_estimator() -> None:
    with pytest.raises(ValueError, match="kl_estimator must be one of k1, k2, k3"):
        kl_estimate(torch.zeros(1), torch.zeros(1), "k4")  # type: ignore[arg-type]


# --- inputs and dtypes ------------------------------------------------------------------------------------------


def test_no_gradient_reaches_old_logp_or_advantages() -> None:
    data = batch()
    old_logp = data["old_logp"].clone().requires_grad_(True)
    advantages = data["advantages"].clone().requires_grad_(True)

    out = policy_loss(data["logp"], old_logp, advantages, data["mask"], LossConfig.defaults("dapo"))
    out.loss.backward()

    assert old_logp.grad is None and advantages.grad is None
    assert data["logp"].grad is not None


def test_a_bool_mask_gives_the_same_loss_as_a_float_mask() -> None:
    data = batch()
    config = LossConfig.defaults("dapo")

    as_float = policy_loss(data["logp"], data["old_logp"], data["advantages"], data["mask"], config)
    as_bool = policy_loss(data["logp"], data["old_logp"], data["advantages"], data["mask"].bool(), config)

    assert as_bool.loss.item() == as_float.loss.item()


def test_bfloat16_log_probs_are_computed_in_float32() -> None:
    data = batch()
    logp = data["logp"].detach().to(torch.bfloat16).requires_grad_(True)

    config = LossConfig.defaults("grpo")

    out = policy_loss(logp, data["old_logp"], data["advantages"], data["mask"], config, data["ref_logp"])
    out.loss.backward()

    assert out.loss.dtype == torch.float32
    assert logp.grad is not None and logp.grad.dtype == torch.bfloat16


def test_it_requires_ref_logp_when_the_kl_is_on() -> None:
    data = batch()

    with pytest.raises(ValueError, match=r"ref_logp is required when the KL is in the loss \(kl_coef > 0\)"):
        policy_loss(data["logp"], data["old_logp"], data["advantages"], data["mask"], LossConfig.defaults("grpo"))


def test_it_does_not_need_ref_logp_when_the_kl_is_off() -> None:
    data = batch()

    out = policy_loss(data["logp"], data["old_logp"], data["advantages"], data["mask"], LossConfig.defaults("dapo"))

    assert math.isfinite(out.loss.item())


@pytest.mark.parametrize(
    ("name", "override", "message"),
    [
        ("old_logp", torch.zeros(2, 2), r"old_logp must have the shape of logp \(2, 3\)"),
        ("mask", torch.ones(3, 3), r"mask must have the shape of logp \(2, 3\)"),
        ("advantages", torch.zeros(2, 1), r"advantages must be \[B\]"),
        ("ref_logp", torch.zeros(2), r"ref_logp must have the shape of logp"),
        ("logp", torch.zeros(6), r"logp must be a \[B, T\] tensor"),
    ],
)
def test_it_rejects_tensors_of_the_wrong_shape(name: str, override: torch.Tensor, message: str) -> None:
    data = batch()
    data[name] = override

    with pytest.raises(ValueError, match=message):
        policy_loss(config=LossConfig.defaults("grpo"), **data)


def test_dr_grpo_rejects_a_sequence_with_more_sampled_tokens_than_max_completion_length() -> None:
    data = batch()
    config = LossConfig.defaults("dr_grpo", max_completion_length=2)

    with pytest.raises(ValueError, match="max_completion_length=2 is shorter than a sequence's 3 sampled tokens"):
        policy_loss(data["logp"], data["old_logp"], data["advantages"], data["mask"], config)


def test_dr_grpo_counts_sampled_tokens_not_positions_so_observations_between_turns_do_not_count() -> None:
    """A multi-turn episode's completion region holds observation tokens (mask 0) between the sampled turns:
    600 positions of which 8 are sampled fit a normaliser of 8."""
    mask = torch.zeros(1, 600, dtype=torch.float64)
    mask[0, :4] = 1.0
    mask[0, 596:] = 1.0  # two turns of 4 sampled tokens around a 592-token tool result
    logp = torch.full((1, 600), -1.0, dtype=torch.float64, requires_grad=True)
    config = LossConfig.defaults("dr_grpo", max_completion_length=8)

    out = policy_loss(logp, logp.detach(), torch.tensor([1.0], dtype=torch.float64), mask, config)

    assert out.loss.item() == pytest.approx(-8 / (1 * 8), abs=1e-12)  # on-policy: ρ = 1 on each sampled token


# --- LossConfig -------------------------------------------------------------------------------------------------


def test_defaults_carry_the_reported_settings_and_a_source() -> None:
    expected = {
        "grpo": (0.2, 0.2, 0.04, "k3"),
        "dr_grpo": (0.2, 0.2, 0.0, "k3"),
        "composer": (0.2, 0.2, 0.001, "k1"),
        "dapo": (0.2, 0.28, 0.0, "k3"),
        "cispo": (1.0, 4.0, 0.0, "k3"),
        "gspo": (3e-4, 4e-4, 0.0, "k3"),
    }
    for algorithm, values in expected.items():
        config = LossConfig.defaults(algorithm)  # type: ignore[arg-type]
        assert config.algorithm == algorithm
        assert (config.epsilon_low, config.epsilon_high, config.kl_coef, config.kl_estimator) == values
        assert config.source and "arXiv" in config.source
        assert config.cispo_mask is False


def test_dr_grpo_defaults_fall_back_to_a_generation_limit_that_a_run_can_override() -> None:
    assert LossConfig.defaults("dr_grpo").max_completion_length == 1024
    assert LossConfig.defaults("dr_grpo", max_completion_length=512).max_completion_length == 512


def test_configs_that_differ_only_in_source_are_equal() -> None:
    assert LossConfig.defaults("dapo") == replace(LossConfig.defaults("dapo"), source="")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"algorithm": "ppo"}, "algorithm"),
        ({"epsilon_low": -0.1}, "epsilon_low"),
        ({"epsilon_high": math.inf}, "epsilon_high"),
        ({"epsilon_high": "0.2"}, "epsilon_high"),
        ({"kl_coef": math.nan}, "kl_coef"),
        ({"kl_coef": -0.04}, "kl_coef"),
        ({"kl_estimator": "k4"}, "kl_estimator"),
        ({"max_completion_length": 0}, "max_completion_length"),
        ({"cispo_mask": True}, "cispo_mask"),
    ],
)
def test_it_rejects_a_bad_config_naming_the_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field} "):
        replace(LossConfig.defaults("grpo"), **changes)  # type: ignore[arg-type]


def test_dr_grpo_requires_max_completion_length() -> None:
    with pytest.raises(ValueError, match="^max_completion_length is required for algorithm='dr_grpo'"):
        LossConfig(algorithm="dr_grpo", epsilon_low=0.2, epsilon_high=0.2)


def test_defaults_reject_an_unknown_algorithm() -> None:
    with pytest.raises(ValueError, match="^algorithm must be one of"):
        LossConfig.defaults("ppo")  # type: ignore[arg-type]


@pytest.mark.parametrize("algorithm", ["grpo", "dr_grpo", "composer", "dapo", "cispo", "gspo"])
def test_micro_batch_losses_with_the_batch_normalisers_add_up_to_the_whole_batch(algorithm):
    torch.manual_seed(0)
    logp = (torch.randn(4, 5, dtype=torch.float64) - 2).requires_grad_()
    old = logp.detach() + 0.1 * torch.randn(4, 5, dtype=torch.float64)
    ref = logp.detach() + 0.1 * torch.randn(4, 5, dtype=torch.float64)
    adv = torch.tensor([1.0, -0.5, 0.25, -1.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.float64)
    config = LossConfig.defaults(algorithm, max_completion_length=5)
    config = LossConfig(**{**config.__dict__, "kl_coef": 0.1})
    whole = policy_loss(logp, old, adv, mask, config, ref).loss
    (grad_whole,) = torch.autograd.grad(whole, logp)
    parts = [
        policy_loss(
            logp[rows], old[rows], adv[rows], mask[rows], config, ref[rows], batch_sequences=4, batch_tokens=13.0
        ).loss
        for rows in (slice(0, 1), slice(1, 4))
    ]
    (grad_parts,) = torch.autograd.grad(sum(parts), logp)
    assert torch.allclose(sum(parts), whole, rtol=1e-12)
    assert torch.allclose(grad_parts, grad_whole, rtol=1e-12)


# --- Kimi K2.5 (K3) ---------------------------------------------------------------------------------------------
# With the band [−0.25, 0.4] on log ρ, token (0, 1) (log ρ −0.3) sits below it and token (0, 2) (log ρ 0.5) above
# it: both keep their value but lose their policy gradient, whatever the advantage's sign.


def _kimi(tau: float = 0.1) -> LossConfig:
    return LossConfig(algorithm="kimi", epsilon_low=0.25, epsilon_high=0.4, tau=tau)


def test_kimi_loss_is_minus_ratio_times_advantage_plus_tau_log_ratio_squared_over_the_token_count() -> None:
    data = batch()

    out = policy_loss(data["logp"], data["old_logp"], data["advantages"], data["mask"], _kimi())

    # docs/methods.md K3: −(1/N) Σ (ρ·A − τ·(log ρ)²), N = 5 valid tokens
    total = sum(rho(i, t) * ADV[i] - 0.1 * LOG_RATIO[i][t] ** 2 for i, t in VALID)
    assert out.loss.item() == pytest.approx(-total / 5, abs=1e-12)
    assert out.clip_fraction == pytest.approx(2 / 5)  # tokens (0, 1) and (0, 2) leave the band


def test_kimi_gradient_is_masked_outside_the_log_ratio_band_and_keeps_the_quadratic_term() -> None:
    data = batch()

    out = policy_loss(data["logp"], data["old_logp"], data["advantages"], data["mask"], _kimi())

    # d/dlogp of −ρ·A/N is −ρ·A/N inside the band, 0 outside; d/dlogp of τ·(log ρ)²/N is 2τ·log ρ/N everywhere
    def expected(i: int, t: int) -> float:
        inside = -0.25 <= LOG_RATIO[i][t] <= 0.4
        return (-rho(i, t) * ADV[i] if inside else 0.0) / 5 + 2 * 0.1 * LOG_RATIO[i][t] / 5

    grid = [[expected(0, 0), expected(0, 1), expected(0, 2)], [expected(1, 0), expected(1, 1), 0.0]]
    assert_grid(grad_of(out.loss, data["logp"]), grid)


def test_kimi_on_policy_loss_is_minus_the_token_mean_advantage_with_no_quadratic_gradient() -> None:
    data = batch()
    old = data["logp"].detach().clone()

    out = policy_loss(data["logp"], old, data["advantages"], data["mask"], _kimi(tau=0.5))

    assert out.loss.item() == pytest.approx(-(3 * 1.0 + 2 * -0.5) / 5, abs=1e-12)
    assert out.clip_fraction == 0.0
    grid = [[-1.0 / 5] * 3, [0.5 / 5, 0.5 / 5, 0.0]]
    assert_grid(grad_of(out.loss, data["logp"]), grid)


def test_kimi_defaults_name_their_choices_and_tau_is_refused_elsewhere() -> None:
    config = LossConfig.defaults("kimi")
    assert (config.epsilon_low, config.epsilon_high, config.tau) == (math.log(2.0), math.log(2.0), 0.01)
    assert "ours" in config.source and "MuonClip" in config.source
    with pytest.raises(ValueError, match="tau .* applies only to algorithm='kimi'"):
        LossConfig(algorithm="grpo", epsilon_low=0.2, epsilon_high=0.2, tau=0.1)
