"""`VLLMBackend` against the transformers backend and an uncached forward pass (GPU images with vllm only).

The tiny random Llama runs in float32 on both sides, so logprobs agree to about 1e-3 (GPU kernels differ).
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may reach a model hub; set before transformers is imported

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.gpu

vllm = pytest.importorskip("vllm")
if not torch.cuda.is_available():
    pytest.skip("VLLMBackend needs a CUDA GPU", allow_module_level=True)

from workers.models import TINY_LLAMA, PolicyBackend, SamplingParams, resolve_base_model, tiny_llama  # noqa: E402
from workers.models.hf import HFBackend  # noqa: E402
from workers.models.vllm_backend import VLLMBackend  # noqa: E402

PROMPTS = [
    [1, 9690, 198, 2683],
    [1, 4093, 198, 26843, 2, 198, 1, 520, 9531, 198],
    [17, 3000, 45, 812, 9, 11000, 2210, 77, 5, 4096, 300, 31, 8, 15000, 19],
]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return resolve_base_model(TINY_LLAMA, cache_dir=tmp_path_factory.mktemp("model-cache"))


@pytest.fixture(scope="module")
def reference(tiny_path: Path) -> HFBackend:
    return HFBackend(tiny_path)


@pytest.fixture(scope="module")
def engine(tiny_path: Path) -> Iterator[VLLMBackend]:
    backend = VLLMBackend(
        tiny_path, dtype="float32", gpu_memory_utilization=0.2, max_model_len=512, enforce_eager=True, seed=0
    )
    yield backend
    del backend


def _full_forward_logprobs(backend: HFBackend, prompt: list[int], tokens: list[int], temperature: float) -> list[float]:
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = backend.model(input_ids=ids).logits[0].double()
    predicting = logits[len(prompt) - 1 : len(prompt) - 1 + len(tokens)]
    logprobs = torch.log_softmax(predicting / temperature, dim=-1)
    return logprobs[torch.arange(len(tokens)), torch.tensor(tokens)].tolist()


def test_vllm_sampled_logprobs_equal_a_full_forward_at_the_sampling_temperature(
    engine: VLLMBackend, reference: HFBackend
) -> None:
    assert isinstance(engine, PolicyBackend)
    generations = engine.generate(PROMPTS, SamplingParams(temperature=0.7, max_new_tokens=10, seed=3))
    for prompt, generation in zip(PROMPTS, generations, strict=True):
        assert generation.prompt_token_ids == prompt
        assert len(generation.token_ids) == len(generation.logprobs) == 10
        assert generation.finish_reason == "length" and generation.policy_version == 0
        expected = _full_forward_logprobs(reference, prompt, generation.token_ids, temperature=0.7)
        assert generation.logprobs == pytest.approx(expected, abs=1e-3)


def test_vllm_greedy_matches_the_transformers_backend(engine: VLLMBackend, reference: HFBackend) -> None:
    params = SamplingParams(temperature=0, max_new_tokens=8)
    for ours, theirs in zip(engine.generate(PROMPTS, params), reference.generate(PROMPTS, params), strict=True):
        assert ours.token_ids == theirs.token_ids
        assert ours.logprobs == pytest.approx(theirs.logprobs, abs=1e-3)
        assert ours.text == theirs.text


def test_vllm_the_same_seed_gives_the_same_samples(engine: VLLMBackend) -> None:
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=11)
    first = [g.token_ids for g in engine.generate([PROMPTS[0]] * 3, params)]
    assert first == [g.token_ids for g in engine.generate([PROMPTS[0]] * 3, params)]
    assert len({tuple(tokens) for tokens in first}) == 3  # rows of one prompt still differ (seed + row)


def test_vllm_a_stop_string_ends_the_row_and_is_cut_from_the_text(engine: VLLMBackend, reference: HFBackend) -> None:
    (free,) = reference.generate(PROMPTS[2:3], SamplingParams(temperature=0, max_new_tokens=16))
    stop = free.text[len(free.text) // 2 : len(free.text) // 2 + 2]
    params = SamplingParams(temperature=0, max_new_tokens=16, stop=(stop,))
    (ours,) = engine.generate(PROMPTS[2:3], params)
    (theirs,) = reference.generate(PROMPTS[2:3], params)
    assert ours.finish_reason == theirs.finish_reason == "stop"
    assert ours.token_ids == theirs.token_ids
    assert ours.text == theirs.text and stop not in ours.text


def test_vllm_load_state_dict_swaps_the_weights_and_sets_the_policy_version(
    tiny_path: Path, reference: HFBackend, tmp_path: Path
) -> None:
    other = tiny_llama(seed=1)
    other_dir = tmp_path / "seed-1"
    other.save_pretrained(str(other_dir))
    for name in TOKENIZER_FILES:
        shutil.copy2(tiny_path / name, other_dir / name)
    expected = HFBackend(other_dir).generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=8))

    backend = VLLMBackend(tiny_path, dtype="float32", gpu_memory_utilization=0.2, max_model_len=512, enforce_eager=True)
    before = backend.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=8))
    backend.load_state_dict(other.state_dict(), version=4)
    after = backend.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=8))

    assert backend.policy_version == 4 and all(g.policy_version == 4 for g in after)
    assert [g.token_ids for g in after] == [g.token_ids for g in expected]
    assert [g.token_ids for g in after] != [g.token_ids for g in before]
    state = backend.state_dict()
    assert set(state) == set(reference.state_dict())
    assert torch.equal(state["model.norm.weight"], other.state_dict()["model.norm.weight"])
    with pytest.raises(ValueError, match="model.layers.7"):
        backend.load_state_dict({"model.layers.7.mlp.up_proj.weight": torch.zeros(1)}, version=5)
    assert backend.policy_version == 4


def _small_engine(tiny_path: Path, **engine_kwargs: Any) -> VLLMBackend:
    return VLLMBackend(
        tiny_path, dtype="float32", gpu_memory_utilization=0.2, max_model_len=512, enforce_eager=True, **engine_kwargs
    )


def test_sleep_mode_frees_the_gpu_and_the_engine_generates_with_new_weights_after_waking(tiny_path: Path) -> None:
    """Colocated placement (workers.rl.placement): the engine sleeps while the learner trains on its GPU."""
    engine = _small_engine(tiny_path, seed=0, enable_sleep_mode=True)
    params = SamplingParams(max_new_tokens=4, temperature=0.0, seed=0)
    before = engine.generate(PROMPTS[:1], params)[0]
    assert engine.sleep() > 0  # the KV cache at least goes back to the device
    engine.wake()
    state = {name: torch.zeros_like(tensor) for name, tensor in engine.state_dict().items() if "norm" in name}
    engine.load_state_dict(state, version=1)  # new weights after waking, as the trainer sends them
    after = engine.generate(PROMPTS[:1], params)[0]
    assert after.policy_version == 1
    assert (after.token_ids, after.logprobs) != (before.token_ids, before.logprobs)  # zeroed norms change them


def test_an_engine_over_two_gpus_is_one_tensor_parallel_group(tiny_path: Path) -> None:
    """A run whose engine asks for 2 GPUs (compute.per_engine.gpus) gets tensor_parallel_size=2 (workers.jobs.train)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("tensor parallelism needs two GPUs")
    engine = _small_engine(tiny_path, tensor_parallel_size=2)
    [generation] = engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=4, temperature=0.0))
    assert 1 <= len(generation.token_ids) <= 4 and generation.policy_version == 0
