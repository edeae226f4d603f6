"""Every rollout readable (issue 39 part 1): a rollout's record carries its tokens with log-probs and versions, and
a training step stores every trajectory in full by default (a share of whole groups plus every flagged one when
`trajectory_sample_rate` is lowered), with the advantage of each sample in its group."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tests.workers.rl.test_token_versions import VersionedBackend, _sample, _worker
from workers.envs.registry import arithmetic_tasks
from workers.rl.config import TrainConfig
from workers.rl.steps import shown_advantages
from workers.rl.token_view import full_record, stored_indices, token_view, with_learner_logprobs


def test_a_rollouts_record_carries_its_sampled_tokens_with_log_probs_and_versions():
    backend = VersionedBackend(version=3)

    def between_turns() -> float:
        if backend.turn == 1:
            backend.version = 4
        return 0.0

    [sample] = (
        _worker(backend).rollout(arithmetic_tasks(1, seed=0), group_size=1, seed=0, between_turns=between_turns).samples
    )
    view = sample.trajectory["tokens"]
    [segment] = view["segments"]
    assert view["sampled"] == sample.sampled_tokens and not view["truncated"]
    assert len(segment["text"]) == len(sample.loss_mask) == len(segment["sampled"])
    assert segment["sampled"] == sample.loss_mask
    # Sampled tokens carry the engine's log-prob (-0.5 from the scripted engine) and their version; the
    # environment's tokens between the turns carry neither.
    sampled = [i for i, m in enumerate(segment["sampled"]) if m]
    observed = [i for i, m in enumerate(segment["sampled"]) if not m]
    assert observed and {segment["logprob"][i] for i in sampled} == {-0.5}
    assert {segment["logprob"][i] for i in observed} == {None} and {segment["version"][i] for i in observed} == {None}
    assert {segment["version"][i] for i in sampled} == {3, 4}
    # The pieces decode back to the completion region's text.
    region = sample.token_ids[sample.completion_start :]
    assert "".join(segment["text"]) == backend.tokenizer.decode(region)
    assert "The answer is 5" in "".join(segment["text"][i] for i in sampled)


def test_the_token_view_is_cut_at_its_limit_and_says_so():
    backend = VersionedBackend()
    ids = backend.tokenizer.encode("one two three four five six", add_special_tokens=False)
    n = len(ids)
    view = token_view(backend.tokenizer, [([9, 9] + ids, 2)], [1] * n, [-1.0] * n, [0] * n, limit=3)
    assert view["truncated"] and len(view["segments"][0]["text"]) == 3 and view["sampled"] == len(ids)


def test_every_trajectory_is_stored_by_default_and_a_lower_rate_keeps_whole_groups_and_every_flagged_one():
    assert TrainConfig(base_model="m").trajectory_sample_rate == 1.0
    assert TrainConfig(base_model="m").trajectory_samples_per_step is None
    flagged = [False] * 16
    assert stored_indices(flagged, 4, 1.0) == list(range(16))
    assert stored_indices(flagged, 4, 0.25) == [0, 1, 2, 3]  # one group of four, whole
    assert stored_indices(flagged, 4, 0.3) == list(range(8))  # 1.2 groups round up to 2
    flagged[13] = True
    assert stored_indices(flagged, 4, 0.0) == [13]  # the flagged one whatever the rate
    assert stored_indices(flagged, 4, 0.25) == [0, 1, 2, 3, 13]
    assert stored_indices(flagged, 4, 1.0, fixed_count=2) == [0, 1, 13]  # a run from before the rate
    for bad in (-0.1, 1.5):
        with pytest.raises(ValidationError, match="trajectory_sample_rate"):
            TrainConfig(base_model="m", trajectory_sample_rate=bad)


def test_the_stored_record_has_the_advantage_of_each_sample_in_its_group():
    samples = [_sample([0]) for _ in range(4)]
    for sample, reward in zip(samples, (1.0, 0.0, 0.0, 0.0), strict=True):
        sample.reward = reward
    assert shown_advantages(samples, 2, "none") == [0.5, -0.5, 0.0, 0.0]  # the second group has no signal
    scaled = shown_advantages(samples, 2, "group")
    assert scaled[0] == pytest.approx(0.5 / (2**-0.5 + 1e-4), rel=1e-5) and scaled[2:] == [0.0, 0.0]
    assert shown_advantages(samples[:3], 2, "none") == [None, None, None]  # not whole groups
    record = full_record(
        {"id": "t-0", "turns": []},
        step=3,
        group=1,
        reward=1.0,
        terms={"exact_match": 1.0},
        advantage=0.5,
        policy_version=2,
        sampled_tokens=7,
        flags=[{"detector": "x", "severity": "low"}],
    )
    assert record["id"] == "t-0" and record["group"] == 1 and record["advantage"] == 0.5 and record["step"] == 3


def test_the_learners_log_probs_sit_beside_the_engines_with_the_samples_gap():
    """Two regions (a turn, the environment's reply, a second turn): positions run on across regions through each
    segment's offset; the environment's tokens get no learner log-prob; the gap counts |δ| over the sampled ones."""
    view = {
        "segments": [
            {"offset": 0, "text": ["a", "b"], "sampled": [1, 1], "logprob": [-0.5, -0.1], "version": [0, 0]},
            {"offset": 2, "text": ["c", "d"], "sampled": [0, 1], "logprob": [None, -2.0], "version": [None, 0]},
        ],
        "sampled": 3,
        "truncated": False,
        "limit": 16384,
    }
    shown = with_learner_logprobs(view, [-0.5, -0.3, 9.9, -0.5])
    assert [seg["learner_logprob"] for seg in shown["segments"]] == [[-0.5, -0.3], [None, -0.5]]
    gap = shown["learner"]
    assert (
        gap["tokens"] == 3 and gap["max_abs_delta"] == 1.5 and gap["mean_abs_delta"] == pytest.approx(1.7 / 3, abs=1e-4)
    )
    assert gap["outside_cap"] == 1 and gap["cap"] == 2.0  # |1.5| > log 2; |0.2| is not
    assert "learner_logprob" not in view["segments"][0]  # the stored view itself is left alone
    old = {"segments": [{"text": ["a"], "sampled": [1], "logprob": [-0.5], "version": [0]}]}
    assert with_learner_logprobs(old, [-0.5]) is old  # stored before offsets: nothing to align with
    record = full_record(
        {"id": "t", "tokens": view},
        step=1,
        group=0,
        reward=1.0,
        terms={},
        advantage=0.5,
        policy_version=0,
        sampled_tokens=3,
        flags=[],
        learner_logprobs=[-0.5, -0.3, 0.0, -0.5],
        mismatch_cap=3.0,
    )
    assert record["tokens"]["learner"]["outside_cap"] == 1 and record["tokens"]["learner"]["cap"] == 3.0
