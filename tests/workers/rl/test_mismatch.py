"""Train-inference mismatch (docs/methods.md P7): the measured gap and the corrections, against hand-computed cases, and
in the learner on the tiny model."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from pydantic import ValidationError

from tests.workers.rl.test_learner import _config, _samples
from workers.models.registry import TINY_LLAMA, resolve_base_model
from workers.rl.algorithms import loss_config
from workers.rl.learner import Learner
from workers.rl.losses import policy_loss
from workers.rl.mismatch import correction_share, correction_weights, mismatch_metrics, mismatch_sums

LOG = math.log


def test_the_gap_is_measured_per_token_on_the_valid_tokens_only():
    # δ = log π_old − log π_eng = [log 2, 0, (padding)]; r = [2, 1].
    learner = torch.tensor([[LOG(0.5), LOG(0.25), 0.0]])
    engine = torch.tensor([[LOG(0.25), LOG(0.25), -9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    metrics = mismatch_metrics(mismatch_sums(learner, engine, mask, cap=1.5))
    assert metrics["mismatch/tokens"] == 2
    assert metrics["mismatch/abs_logprob_diff_mean"] == pytest.approx(LOG(2) / 2)
    assert metrics["mismatch/abs_logprob_diff_max"] == pytest.approx(LOG(2))
    assert metrics["mismatch/kl_k3"] == pytest.approx((2 - 1 - LOG(2)) / 2)  # k3 = r − 1 − log r, r = 2 and 1
    assert metrics["mismatch/ratio_outside_share"] == pytest.approx(0.5)  # r = 2 is outside [1/1.5, 1.5]
    # With C = 2.5 the ratio 2 is inside the band; identical log-probs show no gap at all.
    assert mismatch_metrics(mismatch_sums(learner, engine, mask, cap=2.5))["mismatch/ratio_outside_share"] == 0
    same = mismatch_metrics(mismatch_sums(engine, engine, mask))
    assert same["mismatch/abs_logprob_diff_max"] == 0 and same["mismatch/kl_k3"] == 0
    assert mismatch_metrics({}) == {}


def test_each_correction_weighs_tokens_as_its_source_says():
    # r = [4, 0.5] on two valid tokens, a padded third.
    learner = torch.tensor([[LOG(0.8), LOG(0.1), 0.0]])
    engine = torch.tensor([[LOG(0.2), LOG(0.2), 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])

    def weights(kind: str, cap: float = 2.0) -> list[float]:
        return [round(w, 5) for w in correction_weights(learner, engine, mask, kind, cap)[0].tolist()]  # type: ignore[arg-type]

    assert weights("none") == [1.0, 1.0, 0.0]
    assert weights("tis") == [2.0, 0.5, 0.0]  # min(r, C)
    assert weights("mis") == [0.0, 0.5, 0.0]  # r if r <= C else 0
    root2 = round(math.sqrt(2), 5)  # the geometric mean of 4 and 0.5
    assert weights("seq_tis") == [root2, root2, 0.0]
    assert weights("seq_tis", cap=1.2) == [1.2, 1.2, 0.0]
    assert weights("seq_mis") == [root2, root2, 0.0]  # inside [1/2, 2]
    assert weights("seq_mis", cap=1.2) == [0.0, 0.0, 0.0]  # outside [1/1.2, 1.2]: the sequence is dropped
    tis = correction_weights(learner, engine, mask, "tis", 2.0)
    assert correction_share(tis, mask, "tis", 2.0) == 0.5  # one of two valid tokens was truncated
    with pytest.raises(ValueError, match="correction must be one of"):
        correction_weights(learner, engine, mask, "clip", 2.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("algorithm", ["grpo", "dapo", "cispo", "kimi"])
def test_the_correction_multiplies_each_tokens_policy_gradient_term(algorithm):
    torch.manual_seed(0)
    logp = (torch.randn(3, 5) * 0.1 - 2.0).requires_grad_(True)
    old = logp.detach() + torch.randn(3, 5) * 0.05
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.float32)
    adv = torch.tensor([1.0, -0.5, 0.25])
    config = dataclasses.replace(loss_config(algorithm, {"kl_coef": 0.0}), tau=0.0)
    plain = policy_loss(logp, old, adv, mask, config, batch_tokens=12.0)
    ones = policy_loss(logp, old, adv, mask, config, batch_tokens=12.0, correction=torch.ones(3, 5))
    double = policy_loss(logp, old, adv, mask, config, batch_tokens=12.0, correction=torch.full((3, 5), 2.0))
    assert float(ones.loss) == pytest.approx(float(plain.loss))
    assert float(double.loss) == pytest.approx(2 * float(plain.loss))
    # A weight of 0 on a token removes exactly that token's term (the normaliser is the batch's, given).
    dropped = torch.ones(3, 5)
    dropped[0, 1] = 0.0
    masked = mask.clone()
    masked[0, 1] = 0.0
    zero = policy_loss(logp, old, adv, mask, config, batch_tokens=12.0, correction=dropped)
    without = policy_loss(logp, old, adv, masked, config, batch_tokens=12.0)
    if algorithm in ("dapo", "cispo", "kimi"):  # token-sum normalisers: the same N either way
        assert float(zero.loss) == pytest.approx(float(without.loss))
    (grad,) = torch.autograd.grad(zero.loss, logp)
    assert float(grad[0, 1]) == 0.0 and float(grad[0, 0]) != 0.0
    with pytest.raises(ValueError, match="correction must have the shape"):
        policy_loss(logp, old, adv, mask, config, correction=torch.ones(3, 4))


def test_gspo_takes_one_weight_per_sequence():
    logp = torch.full((2, 3), -1.0, requires_grad=True)
    old = torch.full((2, 3), -1.1)
    mask = torch.ones(2, 3)
    adv = torch.tensor([1.0, -1.0])
    config = loss_config("gspo", {"kl_coef": 0.0})
    plain = policy_loss(logp, old, adv, mask, config)
    halved = policy_loss(logp, old, adv, mask, config, correction=torch.tensor([[0.5] * 3, [0.5] * 3]))
    assert float(halved.loss) == pytest.approx(0.5 * float(plain.loss))


def test_bad_corrections_are_refused_naming_the_field():
    with pytest.raises(ValidationError, match="cap must be a finite number > 1"):
        _config(mismatch={"correction": "tis", "cap": 1.0})
    with pytest.raises(ValidationError, match="mismatch.correction"):
        _config(mismatch={"correction": "trunc"})
    with pytest.raises(ValidationError, match="use seq_tis or seq_mis with gspo"):
        _config(algorithm="gspo", mismatch={"correction": "tis"})
    assert _config(algorithm="gspo", mismatch={"correction": "seq_mis", "cap": 3}).mismatch.cap == 3.0
    assert _config().mismatch.correction == "none"  # off by default: on CPU both sides compute in fp32


@pytest.fixture(scope="module")
def model_path():  # type: ignore[no-untyped-def]
    return resolve_base_model(TINY_LLAMA)


def test_every_step_reports_the_gap_and_a_correction_uses_the_learners_recomputation(model_path):
    """The samples' log-probs come from the learner's own weights (fp32 both sides): the measured gap is ~0. An
    engine that reported log-probs 0.8 nats too high shows a gap of 0.8 on every token, every one outside [1/2, 2];
    TIS then truncates none (r = e^-0.8 < 2) and the update equals the uncorrected one on the true log-probs."""
    plain = Learner(model_path, _config())
    measured = _samples(plain, seed=3)
    metrics = plain.train_step(measured)
    assert metrics["mismatch/abs_logprob_diff_max"] < 1e-4 and metrics["mismatch/tokens"] == 4 + 5 + 6 + 7
    # Without a correction the first minibatch's forward is the learner's side (before the update).
    unshifted = plain.scored_logprobs()
    assert sorted(unshifted) == list(range(len(measured)))
    assert all(
        abs(lp - e) < 1e-3
        for i, s in enumerate(measured)
        for lp, e, m in zip(unshifted[i], s.old_logprobs, s.loss_mask, strict=True)
        if m
    )
    assert "mismatch/corrected_share" not in metrics

    corrected = Learner(model_path, _config(mismatch={"correction": "tis"}))
    reference = Learner(model_path, _config())
    samples = _samples(corrected, seed=3)
    shifted = [dataclasses.replace(s, old_logprobs=[v + 0.8 for v in s.old_logprobs]) for s in samples]
    out = corrected.train_step(shifted)
    assert out["mismatch/abs_logprob_diff_mean"] == pytest.approx(0.8, abs=1e-4)
    # The token view's learner side: the learner's log-prob of every position of every scored sample, 0.8 below
    # the shifted engine's on the sampled tokens (with a correction, from its recomputation).
    scored = corrected.scored_logprobs()
    assert sorted(scored) == list(range(len(samples)))
    for i, sample in enumerate(shifted):
        assert len(scored[i]) == len(sample.old_logprobs)
        deltas = [lp - e for lp, e, m in zip(scored[i], sample.old_logprobs, sample.loss_mask, strict=True) if m]
        assert deltas and all(d == pytest.approx(-0.8, abs=2e-3) for d in deltas)
    assert out["mismatch/ratio_outside_share"] == 1.0 and out["mismatch/corrected_share"] == 0.0
    # With TIS the ratio is against the learner's π_old (= the true log-probs), the weight e^-0.8 on every token.
    base = reference.train_step(samples)
    assert out["ratio_mean"] == pytest.approx(1.0, abs=1e-4) and base["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert out["grad_norm"] == pytest.approx(math.exp(-0.8) * base["grad_norm"], rel=1e-3)  # before clipping


CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "2 + 3"}}</tool_call>'


class CharByCharBackend:
    """The tiny model's tokenizer, replying with a tool call and then an answer, each sampled one character per
    token: ids that decode to the text but that the text does not re-encode to (the tokenizer merges them)."""

    def __init__(self) -> None:
        from workers.models.registry import load_tokenizer

        self._tokenizer = load_tokenizer(resolve_base_model(TINY_LLAMA))
        self.turn = 0

    @property
    def tokenizer(self):  # type: ignore[no-untyped-def]
        return self._tokenizer

    @property
    def policy_version(self) -> int:
        return 0

    def encode_chat(self, messages, *, add_generation_prompt=True):  # type: ignore[no-untyped-def]
        from workers.models.base import encode_chat

        return encode_chat(self._tokenizer, messages, add_generation_prompt=add_generation_prompt)

    def generate(self, prompt_token_ids, params):  # type: ignore[no-untyped-def]
        from workers.models.base import Generation

        text = CALL if self.turn == 0 else "The answer is 5"
        self.turn += 1
        ids = [t for c in text for t in self._tokenizer.encode(c, add_special_tokens=False)]
        return [Generation(list(p), list(ids), [-0.5] * len(ids), text, "stop", 0) for p in prompt_token_ids]


def test_the_learner_trains_on_the_engines_token_ids_not_on_re_encoded_text(model_path):
    from workers.envs.registry import arithmetic_tasks
    from workers.rl.rollout import RolloutWorker, trained_ids

    backend = CharByCharBackend()
    reply = CALL
    engine_ids = [t for c in reply for t in backend.tokenizer.encode(c, add_special_tokens=False)]
    assert backend.tokenizer.encode(reply, add_special_tokens=False) != engine_ids  # the text re-encodes otherwise
    worker = RolloutWorker(
        backend,  # type: ignore[arg-type]
        environment="calculator",
        env_params={"max_turns": 3},
        reward={"terms": [{"type": "exact_match"}]},
    )
    [sample] = worker.rollout(arithmetic_tasks(1, seed=0), group_size=1, seed=0).samples
    assert sample.num_turns == 2
    trained = trained_ids(sample.prior_segments, sample.token_ids, sample.completion_start, sample.loss_mask)
    answer = [t for c in "The answer is 5" for t in backend.tokenizer.encode(c, add_special_tokens=False)]
    assert trained == engine_ids + answer and not sample.provenance_mismatch

    # A sample whose trained ids were re-encoded from the text is counted and left out of the update.
    learner = Learner(model_path, _config())
    samples = _samples(learner, seed=5)
    samples[1] = dataclasses.replace(samples[1], provenance_mismatch=True)
    metrics = learner.train_step(samples)
    assert metrics["mismatch/provenance_mismatched_samples"] == 1 and metrics["trained_samples"] == 3


def test_with_several_engines_the_gap_is_also_measured_per_engine(model_path):
    """Two engines; the second reports log-probs 0.5 nats off: the step's gap is the mix, each engine's its own. The
    same with a correction on (the gap then comes from the learner's recomputation of π_old)."""
    for extra in ({}, {"mismatch": {"correction": "tis"}}):
        learner = Learner(model_path, _config(compute={"cpus": 2, "rollout_workers": 2}, **extra))
        samples = _samples(learner, seed=4)
        mixed = [
            dataclasses.replace(s, engine=1, old_logprobs=[v + 0.5 for v in s.old_logprobs]) if i % 2 else s
            for i, s in enumerate(samples)
        ]
        out = learner.train_step(mixed)
        assert out["mismatch/engine0/abs_logprob_diff_mean"] < 1e-4, (extra, out)
        assert out["mismatch/engine1/abs_logprob_diff_mean"] == pytest.approx(0.5, abs=1e-4)
        assert out["mismatch/engine1/kl_k3"] == pytest.approx(math.exp(-0.5) - 1 + 0.5, rel=1e-3)
        share = (5 + 7) / (4 + 5 + 6 + 7)  # engine 1 sampled episodes 1 and 3 (5 and 7 tokens)
        assert out["mismatch/abs_logprob_diff_mean"] == pytest.approx(0.5 * share, abs=1e-4)
    single = Learner(model_path, _config())
    assert not any(k.startswith("mismatch/engine") for k in single.train_step(_samples(single, seed=4)))
