"""The SFT warm-up's fine-tuning: cross-entropy on the sampled tokens only, over segmented episodes too."""

from __future__ import annotations

import random

import torch

from workers.models.registry import TINY_LLAMA, resolve_base_model
from workers.rl.config_sections import SFTConfig
from workers.rl.packing import completion_logprobs
from workers.rl.rollout import Sample
from workers.rl.sft import fine_tune


def _sample(rng: random.Random, segmented: bool) -> Sample:
    prompt = [rng.randrange(100, 5000) for _ in range(6)]
    target = [11, 22, 33, 44, 55, 66]
    observation = [rng.randrange(100, 5000) for _ in range(3)]
    tokens = prompt + target[:3] + observation + target[3:]
    mask = [1, 1, 1, 0, 0, 0, 1, 1, 1]
    prior: list[tuple[list[int], int]] = []
    start = len(prompt)
    if segmented:
        prior = [(prompt + target[:3], len(prompt))]
        tokens = prompt + target[:3] + observation + target[3:]
        start = len(prompt) + 3 + len(observation)
        mask = [1] * 6
    return Sample(
        task_id="t",
        group=0,
        token_ids=tokens,
        completion_start=start,
        loss_mask=mask,
        old_logprobs=[0.0] * len(mask),
        reward=1.0,
        terms={},
        policy_version=0,
        num_turns=2,
        malformed_tool_calls=0,
        finish_reason="stop",
        error=None,
        trajectory={"id": "x"},
        prior_segments=prior,
    )


def test_fine_tuning_raises_the_likelihood_of_the_sampled_tokens_and_not_of_the_context() -> None:
    from transformers import AutoModelForCausalLM

    path = resolve_base_model(TINY_LLAMA)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, local_files_only=True)
    rng = random.Random(0)
    samples = [_sample(rng, segmented=i % 2 == 1) for i in range(6)]
    probe = samples[0]
    with torch.no_grad():
        (before,) = completion_logprobs(model, [probe.token_ids], [probe.completion_start])
    losses = fine_tune(model, samples, SFTConfig(epochs=6, learning_rate=3e-3, max_tokens_per_pack=256))
    with torch.no_grad():
        (after,) = completion_logprobs(model, [probe.token_ids], [probe.completion_start])
    assert losses[-1] < losses[0] * 0.7
    trained = torch.tensor(probe.loss_mask, dtype=torch.bool)
    # The sampled tokens became likelier; the observation tokens were never targets.
    assert (after[trained] - before[trained]).mean() > 1.0
    assert (after[~trained] - before[~trained]).mean() < (after[trained] - before[trained]).mean() / 4


def test_the_scripted_coding_teacher_solves_a_task_and_the_environment_keeps_only_solved_episodes_once() -> None:
    """Phase 1 with `teacher_model: scripted-coding`: the agent's episodes in the student's tokens, then the
    coding environment's own SFT rule (solved, no error, no malformed call, once per task and diff)."""
    from tests.apps.coding.test_import import task_row
    from workers.coding.environment import CodingAgentEnv
    from workers.rewards.schema import coding_agent_spec
    from workers.rl.sft import generate

    config = SFTConfig(
        teacher_model="scripted-coding",
        base_model=TINY_LLAMA,
        environment="coding_agent",
        env_params={"max_turns": 12},
        rollouts_per_task=2,
    )
    unsolvable = task_row("no-patch", reference_patch=None)  # the agent skips a task it has no patch for
    samples = generate(config, [task_row(), unsolvable], coding_agent_spec().model_dump(mode="json"))
    assert [s.task_id for s in samples] == ["clamp-upper", "clamp-upper"]
    assert all(s.reward > 0.5 and sum(s.loss_mask) > 0 for s in samples)
    broken = {**samples[0].trajectory, "hidden_tests": {"resolved": False}, "diff": "x"}
    kept, report = CodingAgentEnv.select_for_sft([s.trajectory for s in samples] + [broken])
    assert kept == [0] and report["dropped"] == {"error": 0, "malformed": 0, "unresolved": 1, "duplicate": 1}


def test_the_search_teacher_finds_the_named_function_in_the_sft_job() -> None:
    """`teacher_model: scripted-coding-search`: the same job, the agent locating the function by search."""
    from tests.apps.coding.test_import import task_row
    from workers.rewards.schema import coding_agent_spec
    from workers.rl.sft import generate

    config = SFTConfig(
        teacher_model="scripted-coding-search",
        base_model=TINY_LLAMA,
        environment="coding_agent",
        env_params={"max_turns": 12},
        rollouts_per_task=1,
    )
    row = task_row(
        instruction="clamp() in mathx.py lets values above the maximum through. Fix it.",
        source={"path": "mathx.py", "function": "clamp"},
    )
    [sample] = generate(config, [row], coding_agent_spec().model_dump(mode="json"))
    tools = [t["tool"] for t in sample.trajectory["turns"] if t["role"] == "assistant" and t.get("tool")]
    assert tools[:2] == ["search_code", "read_file"] and tools[-1] == "finish" and "list_files" not in tools
    assert sample.trajectory["hidden_tests"]["resolved"] is True
