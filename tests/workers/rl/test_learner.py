"""The learner's bookkeeping: resume is exact, data order continues, weight sync rebuilds the policy bit-for-bit."""

from __future__ import annotations

import random

import pytest
import torch

from workers.models.registry import TINY_LLAMA, resolve_base_model
from workers.rl.config import TrainConfig
from workers.rl.learner import Learner
from workers.rl.packing import completion_logprobs
from workers.rl.rollout import Sample
from workers.rl.steps import data_order
from workers.rl.weightsync import WeightSyncReceiver


def _config(**overrides):  # type: ignore[no-untyped-def]
    base = {
        "base_model": TINY_LLAMA,
        "prompts_per_step": 2,
        "group_size": 2,
        "learning_rate": 1e-2,
        "loss": {"kl_coef": 0.0},
        "sampling": {"max_new_tokens": 6},
    }
    return TrainConfig(**{**base, **overrides})


def _samples(learner: Learner, seed: int) -> list[Sample]:
    """Four fixed episodes (two groups of two) with rewards that differ inside each group."""
    rng = random.Random(seed)
    samples = []
    for i in range(4):
        prompt = [rng.randrange(100, 5000) for _ in range(5)]
        completion = [rng.randrange(100, 5000) for _ in range(4 + i)]
        tokens = prompt + completion
        with torch.no_grad():
            (old,) = completion_logprobs(learner.model, [tokens], [len(prompt)])
        samples.append(
            Sample(
                task_id=f"t{i // 2}",
                group=i // 2,
                token_ids=tokens,
                completion_start=len(prompt),
                loss_mask=[1] * len(completion),
                old_logprobs=old.tolist(),
                reward=float(i % 2),
                terms={},
                policy_version=learner.version,
                num_turns=1,
                malformed_tool_calls=0,
                finish_reason="length",
                error=None,
                trajectory={"id": f"x{i}"},
            )
        )
    return samples


@pytest.fixture(scope="module")
def model_path():  # type: ignore[no-untyped-def]
    return resolve_base_model(TINY_LLAMA)


def test_a_resumed_learner_continues_exactly_where_the_checkpoint_left_off(model_path):
    straight = Learner(model_path, _config())
    straight.train_step(_samples(straight, 0))
    blob = straight.checkpoint_bytes(data_position=4)
    straight.train_step(_samples(straight, 1))

    resumed = Learner(model_path, _config(seed=99))  # a different init: the checkpoint must override it
    resumed.load_checkpoint(blob)
    assert (resumed.step, resumed.version) == (1, 1)
    resumed.train_step(_samples(resumed, 1))
    assert (resumed.step, resumed.version) == (2, 2)
    for (name, a), (_, b) in zip(straight.model.named_parameters(), resumed.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name


def test_a_checkpoint_from_another_model_is_refused(model_path):
    learner = Learner(model_path, _config())
    blob = learner.checkpoint_bytes(data_position=0)
    lora = Learner(model_path, _config(lora={"rank": 2, "target_modules": ["q_proj"]}))
    with pytest.raises(ValueError, match="does not fit this model"):
        lora.load_checkpoint(blob)


def test_rollout_workers_rebuild_the_learners_weights_bit_for_bit_from_deltas(model_path):
    learner = Learner(model_path, _config())
    receiver = WeightSyncReceiver()
    blob, stats = learner.weight_update()
    assert blob is not None and stats["sync_ratio_vs_full"] > 0
    receiver.receive(blob)
    assert learner.weight_update() == (None, {})  # nothing changed: nothing to send
    for seed in (0, 1):
        learner.train_step(_samples(learner, seed))
        blob, _ = learner.weight_update()
        assert blob is not None
        state = receiver.receive(blob)
        for name, value in learner.policy_state().items():
            assert torch.equal(state[name], value), name


def test_lora_trains_only_the_adapters_and_syncs_merged_weights(model_path):
    learner = Learner(model_path, _config(lora={"rank": 2, "alpha": 4, "target_modules": ["q_proj", "v_proj"]}))
    trainable = [n for n, p in learner.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    before = learner.policy_state()
    learner.train_step(_samples(learner, 0))
    after = learner.policy_state()
    assert set(before) == set(after) and not any("lora_" in k for k in after)
    changed = {k for k in after if not torch.equal(before[k], after[k])}
    assert changed and all("q_proj" in k or "v_proj" in k for k in changed)


def test_the_data_order_of_a_resumed_run_continues_the_uninterrupted_one():
    straight = [data_order(10, seed=3, step=s, per_step=4) for s in range(6)]
    assert straight[2:] == [data_order(10, seed=3, step=s, per_step=4) for s in range(2, 6)]
    first_epoch = [i for step in straight for i in step][:10]
    assert sorted(first_epoch) == list(range(10))  # every task once per epoch


def _split(sample: Sample, at: int, gap: int) -> Sample:
    """The same episode as two segments: the first ends after `at` completion tokens; the second re-encodes
    everything so far (with `gap` observation tokens the first segment never trained on) as its prompt."""
    tokens, start = sample.token_ids, sample.completion_start
    observation = list(range(7000, 7000 + gap))
    first = tokens[: start + at]
    second_prompt = first + observation
    second = second_prompt + tokens[start + at :]
    return Sample(
        **{
            **sample.__dict__,
            "token_ids": second,
            "completion_start": len(second_prompt),
            "prior_segments": [(first, start)],
        }
    )


def test_a_segmented_episode_trains_exactly_like_the_same_tokens_in_one_sequence(model_path):
    """A context rewrite (the search environment's prune) splits an episode into segments; when the rewrite
    changes nothing, the loss and the update must equal those of the one-sequence episode with the observation
    masked out."""
    plain = Learner(model_path, _config())
    segmented = Learner(model_path, _config())
    samples = _samples(plain, 0)
    gap = 3
    joined: list[Sample] = []
    split: list[Sample] = []
    for sample in samples:
        at = 2
        observation = list(range(7000, 7000 + gap))
        completion = sample.token_ids[sample.completion_start :]
        tokens = sample.token_ids[: sample.completion_start] + completion[:at] + observation + completion[at:]
        with torch.no_grad():
            (old,) = completion_logprobs(plain.model, [tokens], [sample.completion_start])
        mask = [1] * at + [0] * gap + [1] * (len(completion) - at)
        joined.append(
            Sample(**{**sample.__dict__, "token_ids": tokens, "loss_mask": mask, "old_logprobs": old.tolist()})
        )
        kept_old = [value for value, m in zip(old.tolist(), mask, strict=True) if m]
        split.append(_split(Sample(**{**sample.__dict__, "old_logprobs": kept_old}), at, gap))
    assert split[0].total_tokens == len(split[0].prior_segments[0][0]) + len(split[0].token_ids)
    # Compare gradients, not updated weights: AdamW turns float noise on near-zero gradients into lr-sized steps.
    grads: dict[str, list[torch.Tensor]] = {"plain": [], "segmented": []}
    for key, learner in (("plain", plain), ("segmented", segmented)):
        learner.optimizer.register_step_pre_hook(
            lambda opt, args, kwargs, key=key, learner=learner: grads[key].extend(  # type: ignore[misc]
                p.grad.detach().clone() for p in learner.params
            )
        )
    a = plain.train_step(joined)
    b = segmented.train_step(split)
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-7)
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    for g, h in zip(grads["plain"], grads["segmented"], strict=True):
        torch.testing.assert_close(g, h, rtol=1e-4, atol=1e-7)


def test_a_run_from_another_runs_checkpoint_starts_from_its_policy_and_its_own_checkpoints_stack(model_path, tmp_path):
    """SFT → RL → RL: run B starts from run A's LoRA checkpoint (merged), trains adapters of its own, and B's
    checkpoint read back anywhere (evals, serving) is A's policy plus B's update, not the base plus B's."""
    from workers.rl.checkpoints import checkpoint_policy_state

    lora = {"rank": 2, "alpha": 4, "target_modules": ["q_proj", "v_proj"]}
    first = Learner(model_path, _config(lora=lora))
    first.train_step(_samples(first, 0))
    uri_a = f"file://{tmp_path}/a.pt"
    (tmp_path / "a.pt").write_bytes(first.checkpoint_bytes(data_position=2))
    policy_a = first.policy_state()

    second = Learner(model_path, _config(lora=lora, checkpoint_uri=uri_a, seed=5))
    assert (second.step, second.version) == (0, 0)  # a fresh run, not a resume
    for name, value in second.policy_state().items():
        assert torch.equal(value, policy_a[name]), name
    second.train_step(_samples(second, 1))
    (tmp_path / "b.pt").write_bytes(second.checkpoint_bytes(data_position=2))
    policy_b = second.policy_state()
    assert any(not torch.equal(policy_b[k], policy_a[k]) for k in policy_b)

    read_back, version = checkpoint_policy_state(TINY_LLAMA, f"file://{tmp_path}/b.pt")
    assert version == 1
    for name, value in policy_b.items():
        assert torch.allclose(read_back[name], value, atol=1e-6), name


def test_a_start_checkpoint_that_is_gone_fails_naming_it(model_path, tmp_path):
    config = _config(checkpoint_uri=f"file://{tmp_path}/gone.pt")
    with pytest.raises(FileNotFoundError, match="gone.pt"):
        Learner(model_path, config)
