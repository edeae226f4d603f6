"""Dr. GRPO's constant normaliser on a real multi-turn search episode: search results of far more than 512 tokens
sit between the policy's turns, and the normaliser (max_new_tokens x the environment's max_turns) counts only the
tokens the policy sampled, so the episode is normalised instead of refused."""

from __future__ import annotations

import pytest
import torch

from tests.workers.jobs.test_flags_in_jobs import ScriptedBackend
from workers.envs.toolcalls import format_tool_call
from workers.models.registry import TINY_LLAMA
from workers.rl.config import TrainConfig, loss_config_for
from workers.rl.losses import policy_loss
from workers.rl.rollout import RolloutWorker
from workers.search.index import IndexConfig, SearchIndex
from workers.search.index_store import save_index
from workers.search.types import Chunk

MAX_NEW_TOKENS = 48
MAX_TURNS = 3
SENTENCE = "The lighthouse keepers of the northern isles kept a log of every storm, ship and tide they saw. "


@pytest.fixture(scope="module")
def index_uri(tmp_path_factory) -> str:  # type: ignore[no-untyped-def]
    chunks = [
        Chunk(chunk_id=f"log{d}#{i}", doc_id=f"log{d}", position=i, text=SENTENCE * 12, title=f"Log {d}")
        for d in range(4)
        for i in range(3)
    ]
    uri = f"file://{tmp_path_factory.mktemp('index')}/idx"
    save_index(SearchIndex.build(chunks, IndexConfig(dense=False)), uri)
    return uri


def test_a_long_search_episode_fits_dr_grpos_constant_from_the_environments_limits(index_uri):
    env_params = {"index_uri": index_uri, "max_turns": MAX_TURNS, "result_budget": 900, "top_k": 5}
    replies = [
        format_tool_call("search_corpus", {"query": "lighthouse keepers storm log"}),
        format_tool_call("search_corpus", {"query": "ship and tide records of the isles"}),
        "<Document id=log0#0></Document>",
    ]
    worker = RolloutWorker(
        ScriptedBackend(replies),  # type: ignore[arg-type]
        environment="search",
        env_params=env_params,
        reward={"terms": [{"type": "f_beta"}]},
        max_new_tokens=MAX_NEW_TOKENS,
    )
    row = {"id": "q1", "prompt": "What did the keepers log?", "gold_chunk_ids": ["log0#0"]}
    samples = worker.rollout([row], group_size=2, seed=0).samples
    samples[0].reward, samples[1].reward = 1.0, 0.0  # a group with signal

    sample = samples[0]
    observations = _zero_runs(sample.loss_mask)
    assert sample.num_turns == MAX_TURNS and len(observations) == MAX_TURNS - 1
    assert min(observations) > 512  # each search result is longer than the old 512-token-per-turn guess
    old_guess = MAX_NEW_TOKENS * MAX_TURNS + (MAX_TURNS - 1) * 512
    assert len(sample.loss_mask) > old_guess  # the completion region the old positional check compared
    assert all(len(s.loss_mask) == len(s.old_logprobs) for s in samples)

    config = TrainConfig(
        base_model=TINY_LLAMA,
        algorithm="dr_grpo",
        environment="search",
        env_params=env_params,
        prompts_per_step=1,
        group_size=2,
        sampling={"max_new_tokens": MAX_NEW_TOKENS},
    )
    assert loss_config_for(config).max_completion_length == MAX_NEW_TOKENS * MAX_TURNS
    assert sample.sampled_tokens <= MAX_NEW_TOKENS * MAX_TURNS

    # The learner's loss call on this batch, as `Learner.train_step` builds it (one row per episode, the completion
    # region with its observation tokens masked out), on-policy so the value is known: −Σ_i Â_i |o_i| / (B · L).
    mask = torch.tensor([[float(m) for m in s.loss_mask] for s in samples])
    logp = torch.tensor([s.old_logprobs for s in samples], requires_grad=True)
    advantages = torch.tensor([0.5, -0.5])  # Dr. GRPO: r − mean, no std
    out = policy_loss(logp, logp.detach(), advantages, mask, loss_config_for(config), batch_sequences=2)
    lengths = [s.sampled_tokens for s in samples]
    expected = -(0.5 * lengths[0] - 0.5 * lengths[1]) / (2 * MAX_NEW_TOKENS * MAX_TURNS)
    assert out.loss.item() == pytest.approx(expected, abs=1e-7)


def _zero_runs(mask: list[int]) -> list[int]:
    runs, current = [], 0
    for value in mask:
        if value == 0:
            current += 1
        elif current:
            runs.append(current)
            current = 0
    return runs + ([current] if current else [])
