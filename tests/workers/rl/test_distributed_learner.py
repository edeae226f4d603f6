"""The learner on several ranks makes the update one learner makes: DDP and FSDP2 on two gloo ranks against the
single-process learner, for every algorithm, after two optimizer steps; sharded checkpoints resume on another
world size (2 -> 1 and 1 -> 2); the gathered weights export to a Hugging Face directory.

The ranks are processes started with torch.multiprocessing (the Ray actor group that starts them in a run is
tested in test_learner_group.py); they use torch.distributed's own gloo backend.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from workers.models.registry import TINY_LLAMA, resolve_base_model
from workers.rl.algorithms import METHOD_DEFAULTS
from workers.rl.config import TrainConfig
from workers.rl.distributed import free_port, init_process_group, shard_by_tokens
from workers.rl.learner import Learner
from workers.rl.packing import completion_logprobs
from workers.rl.rollout import Sample

ALGORITHMS = sorted(METHOD_DEFAULTS)
STEPS = 2
LR = 1e-3


def _config(algorithm: str, strategy: str = "single", ranks: int = 1) -> TrainConfig:
    return TrainConfig(
        base_model=TINY_LLAMA,
        algorithm=algorithm,
        prompts_per_step=3,
        group_size=3,
        learning_rate=LR,
        max_tokens_per_pack=64,  # several micro-batches per rank, not as many on each rank
        sampling={"max_new_tokens": 32},
        learner={"strategy": strategy, "ranks": ranks},
    )


def _batches(model_path: Path) -> list[list[Sample]]:
    """Two steps' batches: three groups of three, one group's rewards all equal, lengths that differ, and
    behaviour log-probs off the policy by up to ±0.5 so that the clips and masks act."""
    learner = Learner(model_path, _config("grpo"))
    rng = random.Random(7)
    batches = []
    for step in range(STEPS):
        samples = []
        for i in range(9):
            prompt = [rng.randrange(100, 5000) for _ in range(8 + 3 * (i % 4))]
            completion = [rng.randrange(100, 5000) for _ in range(4 + (7 * i + step) % 26)]
            tokens = prompt + completion
            with torch.no_grad():
                (logp,) = completion_logprobs(learner.model, [tokens], [len(prompt)])
            old = [v + rng.uniform(-0.5, 0.5) for v in logp.tolist()]
            reward = 1.0 if i // 3 == 1 else float(rng.random() < 0.5) + 0.1 * (i % 3)
            samples.append(
                Sample(
                    task_id=f"t{i // 3}",
                    group=i // 3,
                    token_ids=tokens,
                    completion_start=len(prompt),
                    loss_mask=[1] * len(completion),
                    old_logprobs=old,
                    reward=reward,
                    terms={},
                    policy_version=0,
                    num_turns=1,
                    malformed_tool_calls=0,
                    finish_reason="length",
                    error=None,
                    trajectory={"id": f"s{step}-{i}"},
                )
            )
        batches.append(samples)
    return batches


_SINGLE: dict[str, tuple[dict[str, Any], list[dict]]] = {}


def _single(model_path: Path, algorithm: str, batches: list[list[Sample]]) -> tuple[dict[str, Any], list[dict]]:
    """The single-process learner's weights and metrics after the two steps (once per algorithm: the batches are
    the module's fixture)."""
    if algorithm not in _SINGLE:
        learner = Learner(model_path, _config(algorithm))
        metrics = [learner.train_step(batch) for batch in batches]
        _SINGLE[algorithm] = {k: v.clone() for k, v in learner.policy_state().items()}, metrics
    return _SINGLE[algorithm]


def _ranks_train(rank: int, world: int, port: int, model_path: str, batches: Any, out: str) -> None:
    """On each rank: every algorithm under DDP and FSDP2 for two steps; then, under FSDP2, a sharded checkpoint
    after one step (for the 2 -> 1 resume), a resume from the single learner's checkpoint (1 -> 2) and an export."""
    torch.set_num_threads(1)
    init_process_group(rank, world, "127.0.0.1", port)
    folder = Path(out).parent
    results: dict[Any, Any] = {}
    for strategy in ("ddp", "fsdp2"):
        for algorithm in ALGORITHMS:
            learner = Learner(model_path, _config(algorithm, strategy, world))
            metrics = [learner.train_step(batch) for batch in batches]
            if (strategy, algorithm) == ("ddp", "grpo"):  # each rank's share of the token view's learner side
                torch.save(learner.scored_logprobs(), folder / f"scored-rank{rank}.pt")
            state = learner.policy_state()  # every rank gathers; rank 0 holds the weights
            if rank == 0:
                results[(strategy, algorithm)] = ({k: v.clone() for k, v in state.items()}, metrics)
    learner = Learner(model_path, _config("grpo", "fsdp2", world))
    learner.train_step(batches[0])
    learner.save_sharded(str(folder / "two-ranks"), data_position=3)
    learner.export_pretrained(folder / "export")
    resumed = Learner(model_path, _config("grpo", "fsdp2", world))
    results["resumed from one rank"] = resumed.load_sharded(str(folder / "one-rank"))
    resumed.train_step(batches[1])
    state = resumed.policy_state()
    from_file = Learner(model_path, _config("grpo", "fsdp2", world))
    from_file.load_checkpoint((folder / "one-rank.pt").read_bytes())
    from_file.train_step(batches[1])
    state_from_file = from_file.policy_state()
    if rank == 0:
        results["one rank -> two ranks"] = {k: v.clone() for k, v in state.items()}
        results["one-file checkpoint -> two ranks"] = {k: v.clone() for k, v in state_from_file.items()}
        torch.save(results, out)
    torch.distributed.destroy_process_group()


def _spawn(target: Any, *args: Any, world: int = 2) -> None:
    """Run `target` on `world` ranks. A rank killed by a signal is retried once on a fresh port: one clean-clone CI
    run (2026-11-27) saw rank 1 abort (SIGABRT, no message) in this module's first fixture, which passed alone and in
    every other run; the cause was not found (one possibility: the port free_port picks taken before rank 0 binds
    it). An exception raised in a rank (a failed check) is never retried."""
    for attempt in range(2):
        try:
            mp.start_processes(target, args=(world, free_port(), *args), nprocs=world, join=True, start_method="spawn")
            return
        except mp.ProcessExitedException:
            if attempt:
                raise


@pytest.fixture(scope="module")
def model_path() -> Path:
    return resolve_base_model(TINY_LLAMA)


@pytest.fixture(scope="module")
def batches(model_path: Path) -> list[list[Sample]]:
    return _batches(model_path)


@pytest.fixture(scope="module")
def two_rank_results(model_path: Path, batches: list[list[Sample]], tmp_path_factory: Any) -> dict[Any, Any]:
    out = tmp_path_factory.mktemp("ranks") / "results.pt"
    learner = Learner(model_path, _config("grpo"))  # the single learner's checkpoint after one step, for 1 -> 2
    learner.train_step(batches[0])
    learner.save_sharded(str(out.parent / "one-rank"), data_position=3)
    (out.parent / "one-rank.pt").write_bytes(learner.checkpoint_bytes(data_position=3))
    _spawn(_ranks_train, str(model_path), batches, str(out))
    results: dict[Any, Any] = torch.load(out, weights_only=False)
    results["folder"] = out.parent
    return results


def test_the_batch_split_balances_tokens_and_is_the_same_on_every_rank() -> None:
    shares = shard_by_tokens([50, 10, 40, 30, 20, 5], 2)
    assert sorted(i for share in shares for i in share) == list(range(6))
    assert shares == shard_by_tokens([50, 10, 40, 30, 20, 5], 2)
    loads = [sum([50, 10, 40, 30, 20, 5][i] for i in share) for share in shares]
    assert abs(loads[0] - loads[1]) <= 5
    assert shard_by_tokens([3], 4) == [[0], [], [], []]  # a rank may get nothing: it still joins every collective
    with pytest.raises(ValueError, match="world_size"):
        shard_by_tokens([1], 0)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_two_ranks_make_the_update_one_learner_makes(
    model_path: Path, batches: list[list[Sample]], two_rank_results: dict[Any, Any], strategy: str, algorithm: str
) -> None:
    expected, expected_metrics = _single(model_path, algorithm, batches)
    state, metrics = two_rank_results[(strategy, algorithm)]
    assert set(state) == set(expected)
    initial = resolve_initial(model_path)
    moved = max(float((expected[k] - initial[k]).abs().max()) for k in expected)
    assert moved > LR, "the steps must change the weights, or the comparison shows nothing"
    # AdamW divides by the root of the squared gradients: where a gradient is near zero, float rounding in another
    # summation order moves that coordinate by up to lr. So: every parameter within 5% of one step's size, and on
    # average a thousand times closer.
    for name, value in expected.items():
        torch.testing.assert_close(state[name], value, rtol=0, atol=0.05 * LR, msg=f"{strategy} {algorithm} {name}")
    mean_gap = sum(float((state[k] - v).abs().sum()) for k, v in expected.items()) / sum(
        v.numel() for v in expected.values()
    )
    assert mean_gap < 1e-3 * LR
    for mine, theirs in zip(metrics, expected_metrics, strict=True):
        for key in ("loss", "policy_loss", "clip_fraction", "ratio_mean", "ratio_max", "kl", "trained_samples"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), key
        assert mine["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=2e-5)


_INITIAL: dict[str, Any] = {}


def resolve_initial(model_path: Path) -> dict[str, Any]:
    if not _INITIAL:
        _INITIAL.update(Learner(model_path, _config("grpo")).policy_state())
    return _INITIAL


def _assert_same_weights(state: dict[str, Any], expected: dict[str, Any]) -> None:
    assert set(state) == set(expected)
    for name, value in expected.items():
        torch.testing.assert_close(state[name], value, rtol=0, atol=0.05 * LR, msg=name)


def test_a_two_rank_sharded_checkpoint_resumes_on_one_rank(
    model_path: Path, batches: list[list[Sample]], two_rank_results: dict[Any, Any]
) -> None:
    learner = Learner(model_path, _config("grpo"))
    extra = learner.load_sharded(str(two_rank_results["folder"] / "two-ranks"))
    assert (extra["step"], extra["version"], extra["data_position"], extra["world_size"]) == (1, 1, 3, 2)
    assert (learner.step, learner.version) == (1, 1)
    learner.train_step(batches[1])  # the optimizer's moments came back too, or this step would differ
    _assert_same_weights(learner.policy_state(), _single(model_path, "grpo", batches)[0])


def test_a_one_rank_checkpoint_resumes_on_two_sharded_ranks(
    model_path: Path, batches: list[list[Sample]], two_rank_results: dict[Any, Any]
) -> None:
    assert two_rank_results["resumed from one rank"]["world_size"] == 1
    expected = _single(model_path, "grpo", batches)[0]
    _assert_same_weights(two_rank_results["one rank -> two ranks"], expected)
    # the single learner's one-file checkpoint too: each FSDP2 rank keeps its shards of the full tensors
    _assert_same_weights(two_rank_results["one-file checkpoint -> two ranks"], expected)


def test_sharded_weights_export_to_one_hugging_face_directory(
    model_path: Path, batches: list[list[Sample]], two_rank_results: dict[Any, Any]
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = two_rank_results["folder"] / "export"
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    AutoTokenizer.from_pretrained(folder, local_files_only=True)  # evals and serving need it beside the weights
    single = Learner(model_path, _config("grpo"))
    single.train_step(batches[0])
    expected = single.policy_state()
    exported = model.state_dict()
    for name, value in expected.items():
        torch.testing.assert_close(exported[name], value, rtol=0, atol=0.05 * LR, msg=name)
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def test_a_sharded_checkpoint_that_is_not_one_is_refused(model_path: Path, tmp_path: Path) -> None:
    learner = Learner(model_path, _config("grpo"))
    with pytest.raises(ValueError, match="crucible.json is missing"):
        learner.load_sharded(str(tmp_path))


def test_fsdp2_without_a_process_group_says_how_to_start_it(model_path: Path) -> None:
    with pytest.raises(RuntimeError, match="LearnerGroup"):
        Learner(model_path, _config("grpo", "fsdp2", 2))


def _ranks_on_gpus(rank: int, world: int, port: int, model_path: str, batches: Any, out: str) -> None:
    device = f"cuda:{rank}"
    init_process_group(rank, world, "127.0.0.1", port, device=device)
    results = {}
    for strategy in ("ddp", "fsdp2"):
        learner = Learner(model_path, _config("grpo", strategy, world), device=device)
        for batch in batches:
            learner.train_step(batch)
        state = learner.policy_state()
        if rank == 0:
            results[strategy] = {k: v.detach().cpu().clone() for k, v in state.items()}
    if rank == 0:
        torch.save(results, out)
    torch.distributed.destroy_process_group()


@pytest.mark.gpu
def test_two_gpu_ranks_over_nccl_make_the_update_one_learner_makes(
    model_path: Path, batches: list[list[Sample]], tmp_path: Path
) -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    _spawn(_ranks_on_gpus, str(model_path), batches, str(tmp_path / "gpu.pt"))
    results = torch.load(tmp_path / "gpu.pt", weights_only=False)
    single = Learner(model_path, _config("grpo"), device="cuda:0")
    for batch in batches:
        single.train_step(batch)
    expected = {k: v.detach().cpu() for k, v in single.policy_state().items()}
    for strategy in ("ddp", "fsdp2"):
        _assert_same_weights(results[strategy], expected)


def test_two_ranks_score_between_them_every_sample_one_learner_scores(
    model_path: Path, batches: list[list[Sample]], two_rank_results: dict[Any, Any]
) -> None:
    """The token view's learner side under DDP: each rank keeps the samples it scored, no sample on both, and
    merged (as LearnerGroup.scored_logprobs merges them) they are the single learner's, sample by sample."""
    single = Learner(model_path, _config("grpo"))
    for batch in batches:
        single.train_step(batch)
    expected = single.scored_logprobs()
    parts = [torch.load(two_rank_results["folder"] / f"scored-rank{r}.pt") for r in (0, 1)]
    assert parts[0] and parts[1] and not set(parts[0]) & set(parts[1])
    merged = {**parts[0], **parts[1]}
    assert sorted(merged) == sorted(expected)
    for i, values in expected.items():
        assert merged[i] == pytest.approx(values, abs=2e-3), i
