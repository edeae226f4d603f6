"""Policy backends on transformers, base-model resolution and the model cache.

The tiny random Llama (SmolLM2's tokenizer, 2 layers) keeps these fast. Logprobs are checked against an
independent computation: one full forward of prompt + completion, no KV cache, no padding, log-softmax by hand.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may reach a model hub; set before transformers is imported

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import PreTrainedModel

from workers.models import (
    BUILTINS,
    SMOLLM2,
    TINY_LLAMA,
    Generation,
    PolicyBackend,
    SamplingParams,
    UnknownBaseModel,
    make_backend,
    registry,
    resolve_base_model,
    tiny_llama,
)
from workers.models.hf import HFBackend

REPO_ROOT = Path(__file__).resolve().parents[3]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")

# Fixed prompts of different lengths (ids inside SmolLM2's vocabulary), so batches need left padding.
PROMPTS = [
    [1, 9690, 198, 2683],
    [1, 4093, 198, 26843, 2, 198, 1, 520, 9531, 198],
    [17, 3000, 45, 812, 9, 11000, 2210, 77, 5, 4096, 300, 31, 8, 15000, 19],
]


# --- fixtures ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model-cache")


@pytest.fixture(scope="session")
def tiny_path(model_cache: Path) -> Path:
    return resolve_base_model(TINY_LLAMA, cache_dir=model_cache)


@pytest.fixture(scope="session")
def tiny(tiny_path: Path) -> HFBackend:
    """Shared and read-only: tests that load weights build their own backend."""
    return HFBackend(tiny_path)


def _model_dir_like(template: Path, target: Path, model: PreTrainedModel | None = None) -> Path:
    """A copy of the model directory `template` at `target`, optionally with `model`'s weights instead."""
    if model is None:
        shutil.copytree(template, target)
        return target
    model.save_pretrained(str(target))
    for name in TOKENIZER_FILES:
        shutil.copy2(template / name, target / name)
    return target


def _with_eos(template: Path, target: Path, eos_ids: list[int]) -> Path:
    """A copy of `template` whose generation config ends completions on `eos_ids` (besides <|im_end|>)."""
    _model_dir_like(template, target)
    config_file = target / "generation_config.json"
    config = json.loads(config_file.read_text())
    config["eos_token_id"] = [2, *eos_ids]
    config_file.write_text(json.dumps(config))
    return target


def _full_forward_logprobs(backend: HFBackend, prompt: list[int], tokens: list[int], temperature: float) -> list[float]:
    """log softmax(logits / T) at each generated token, from one uncached, unpadded forward pass."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = backend.model(input_ids=ids).logits[0].double()
    predicting = logits[len(prompt) - 1 : len(prompt) - 1 + len(tokens)]  # position i predicts token i + 1
    logprobs = torch.log_softmax(predicting / temperature, dim=-1)
    return logprobs[torch.arange(len(tokens)), torch.tensor(tokens)].tolist()


def _greedy(backend: HFBackend, prompts: list[list[int]], max_new_tokens: int) -> list[Generation]:
    return backend.generate(prompts, SamplingParams(temperature=0, max_new_tokens=max_new_tokens))


@pytest.fixture
def forward_batch_sizes() -> Iterator[tuple[list[int], Any]]:
    """(batch size of every forward call, a function that starts recording on a backend)."""
    sizes: list[int] = []
    handles = []

    def record(backend: HFBackend) -> None:
        def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            sizes.append(int(kwargs["input_ids"].shape[0]))

        handles.append(backend.model.register_forward_pre_hook(hook, with_kwargs=True))

    yield sizes, record
    for handle in handles:
        handle.remove()


# --- logprobs ----------------------------------------------------------------------------------------------------


def test_sampled_logprobs_equal_a_full_forward_at_the_sampling_temperature(tiny: HFBackend) -> None:
    params = SamplingParams(temperature=0.7, max_new_tokens=10, seed=3)
    generations = tiny.generate(PROMPTS, params)
    for prompt, generation in zip(PROMPTS, generations, strict=True):
        assert generation.prompt_token_ids == prompt
        assert len(generation.token_ids) == len(generation.logprobs) == 10
        expected = _full_forward_logprobs(tiny, prompt, generation.token_ids, temperature=0.7)
        assert generation.logprobs == pytest.approx(expected, abs=1e-4)


def test_greedy_picks_the_argmax_and_scores_it_at_temperature_one(tiny: HFBackend) -> None:
    (generation,) = _greedy(tiny, PROMPTS[1:2], max_new_tokens=8)
    ids = torch.tensor([PROMPTS[1] + generation.token_ids])
    with torch.no_grad():
        logits = tiny.model(input_ids=ids).logits[0, len(PROMPTS[1]) - 1 : -1]
    assert generation.token_ids == logits.argmax(dim=-1).tolist()
    expected = _full_forward_logprobs(tiny, PROMPTS[1], generation.token_ids, temperature=1.0)
    assert generation.logprobs == pytest.approx(expected, abs=1e-4)


def test_top_p_restricts_the_draw_but_the_logprob_stays_untruncated(tiny: HFBackend) -> None:
    # A nucleus of almost zero mass holds only the top token: sampling becomes greedy at any temperature. The
    # reported logprob is still the temperature-scaled one (a renormalised nucleus would report 0).
    greedy = _greedy(tiny, PROMPTS, max_new_tokens=6)
    nucleus = tiny.generate(PROMPTS, SamplingParams(temperature=1.5, top_p=1e-6, max_new_tokens=6, seed=0))
    for prompt, top, sampled in zip(PROMPTS, greedy, nucleus, strict=True):
        assert sampled.token_ids == top.token_ids
        expected = _full_forward_logprobs(tiny, prompt, sampled.token_ids, temperature=1.5)
        assert sampled.logprobs == pytest.approx(expected, abs=1e-4)
        assert max(sampled.logprobs) < -0.01


def test_a_left_padded_batch_matches_one_prompt_at_a_time_under_greedy(tiny: HFBackend) -> None:
    batched = _greedy(tiny, PROMPTS, max_new_tokens=12)
    for prompt, together in zip(PROMPTS, batched, strict=True):
        (alone,) = _greedy(tiny, [prompt], max_new_tokens=12)
        assert together.token_ids == alone.token_ids
        assert together.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
        assert together.text == alone.text


# --- stopping ----------------------------------------------------------------------------------------------------


def test_rows_without_a_stop_end_with_length_after_max_new_tokens(tiny: HFBackend) -> None:
    generations = _greedy(tiny, PROMPTS, max_new_tokens=7)
    for generation in generations:
        assert 2 not in generation.token_ids  # <|im_end|> never came up, so only the budget ended the row
        assert len(generation.token_ids) == 7
        assert generation.finish_reason == "length"
        assert generation.text == tiny.tokenizer.decode(generation.token_ids, skip_special_tokens=True)


def test_a_stop_string_ends_the_row_at_the_token_that_completes_it_and_is_cut_from_the_text(tiny: HFBackend) -> None:
    (free,) = _greedy(tiny, PROMPTS[2:3], max_new_tokens=16)
    decode = tiny.tokenizer.decode
    full_text = decode(free.token_ids, skip_special_tokens=True)
    # A two-character stop string that first appears after a few tokens.
    start = len(decode(free.token_ids[:3], skip_special_tokens=True))
    stop = next(
        full_text[i : i + 2]
        for i in range(start, len(full_text) - 1)
        if full_text[i : i + 2].isprintable() and "\ufffd" not in full_text[i : i + 2]
    )
    # Oracle: the shortest prefix of the free run whose text contains the stop string.
    cut = next(k for k in range(1, 17) if stop in decode(free.token_ids[:k], skip_special_tokens=True))
    prefix_text = decode(free.token_ids[:cut], skip_special_tokens=True)

    (stopped,) = tiny.generate(PROMPTS[2:3], SamplingParams(temperature=0, max_new_tokens=16, stop=("zzqx", stop)))
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[:cut]
    assert stopped.logprobs == pytest.approx(free.logprobs[:cut], abs=1e-6)
    assert stopped.text == prefix_text[: prefix_text.index(stop)]
    assert stop not in stopped.text


def test_an_eos_token_ends_the_row_with_stop_and_stays_in_the_tokens_but_not_the_text(
    tiny: HFBackend, tiny_path: Path, tmp_path: Path
) -> None:
    free = _greedy(tiny, PROMPTS, max_new_tokens=12)
    eos = free[0].token_ids[2]  # the third token of row 0 becomes an end-of-sequence token
    backend = HFBackend(_with_eos(tiny_path, tmp_path / "eos-model", [eos]))
    assert backend.eos_token_ids == {2, eos}

    generations = _greedy(backend, PROMPTS, max_new_tokens=12)
    for reference, generation in zip(free, generations, strict=True):
        if eos in reference.token_ids:
            end = reference.token_ids.index(eos) + 1
            assert generation.finish_reason == "stop"
            assert generation.token_ids == reference.token_ids[:end]
            assert generation.token_ids[-1] == eos
            assert generation.text == backend.tokenizer.decode(generation.token_ids[:-1], skip_special_tokens=True)
        else:
            assert generation.finish_reason == "length"
            assert generation.token_ids == reference.token_ids
        assert generation.logprobs == pytest.approx(reference.logprobs[: len(generation.token_ids)], abs=1e-4)
    assert generations[0].finish_reason == "stop" and len(generations[0].token_ids) <= 3


def test_decoding_stops_when_every_row_has_finished_and_finished_rows_leave_the_batch(
    tiny: HFBackend, tiny_path: Path, tmp_path: Path, forward_batch_sizes: tuple[list[int], Any]
) -> None:
    free = _greedy(tiny, PROMPTS, max_new_tokens=12)
    # Each row's 2nd, 4th and 6th tokens end it: rows finish at different steps, all of them by step 6.
    ends = sorted({free[0].token_ids[1], free[1].token_ids[3], free[2].token_ids[5]})
    backend = HFBackend(_with_eos(tiny_path, tmp_path / "eos-model", ends))
    lengths = [next(i + 1 for i, token in enumerate(g.token_ids) if token in ends) for g in free]
    sizes, record = forward_batch_sizes
    record(backend)

    generations = _greedy(backend, PROMPTS, max_new_tokens=50)

    assert [len(g.token_ids) for g in generations] == lengths
    assert all(g.finish_reason == "stop" for g in generations)
    assert len(sizes) == max(lengths)  # one forward per generated position, none after the last row ended
    assert sizes == [sum(length > step for length in lengths) for step in range(max(lengths))]
    # The rows left in the batch after others finished still get exact logprobs.
    for prompt, generation in zip(PROMPTS, generations, strict=True):
        expected = _full_forward_logprobs(backend, prompt, generation.token_ids, temperature=1.0)
        assert generation.logprobs == pytest.approx(expected, abs=1e-4)


# --- reproducibility and weights ---------------------------------------------------------------------------------


def test_the_same_seed_gives_the_same_samples_and_another_seed_does_not(tiny: HFBackend) -> None:
    def sample(seed: int | None) -> list[list[int]]:
        params = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=12, seed=seed)
        return [g.token_ids for g in tiny.generate(PROMPTS, params)]

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)
    assert sample(None) != sample(None)


def test_rows_with_the_same_prompt_get_different_samples(tiny: HFBackend) -> None:
    generations = tiny.generate([PROMPTS[0]] * 4, SamplingParams(temperature=1.0, max_new_tokens=12, seed=1))
    assert len({tuple(g.token_ids) for g in generations}) == 4


def test_load_state_dict_swaps_the_weights_and_sets_the_policy_version(tiny_path: Path, tmp_path: Path) -> None:
    other = tiny_llama(seed=1)
    reference = HFBackend(_model_dir_like(tiny_path, tmp_path / "seed-1", other))
    backend = HFBackend(tiny_path)
    before = _greedy(backend, PROMPTS, max_new_tokens=8)
    assert backend.policy_version == 0 and all(g.policy_version == 0 for g in before)

    backend.load_state_dict(other.state_dict(), version=5)

    after = _greedy(backend, PROMPTS, max_new_tokens=8)
    expected = _greedy(reference, PROMPTS, max_new_tokens=8)
    assert backend.policy_version == 5 and all(g.policy_version == 5 for g in after)
    assert [g.token_ids for g in after] == [g.token_ids for g in expected]
    assert [g.token_ids for g in after] != [g.token_ids for g in before]
    for got, want in zip(after, expected, strict=True):
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-5)


def test_load_state_dict_rejects_unknown_names_and_wrong_shapes_before_changing_anything(tiny_path: Path) -> None:
    backend = HFBackend(tiny_path)
    before = backend.state_dict()
    norm = "model.norm.weight"
    with pytest.raises(ValueError, match="model.layers.9.mlp.up_proj.weight"):
        backend.load_state_dict({norm: torch.zeros(64), "model.layers.9.mlp.up_proj.weight": torch.zeros(1)}, 1)
    with pytest.raises(ValueError, match=r"model\.norm\.weight.*shape \(65,\).*\(64,\)"):
        backend.load_state_dict({"model.layers.0.input_layernorm.weight": torch.zeros(64), norm: torch.zeros(65)}, 1)
    with pytest.raises(ValueError, match="version"):
        backend.load_state_dict({norm: torch.zeros(64)}, -1)
    after = backend.state_dict()
    assert backend.policy_version == 0
    assert all(torch.equal(after[name], before[name]) for name in before)


def test_a_partial_state_dict_changes_only_the_named_weights(tiny_path: Path) -> None:
    backend = HFBackend(tiny_path)
    before = backend.state_dict()
    backend.load_state_dict({"model.norm.weight": torch.full((64,), 0.5, dtype=torch.float64)}, version=1)
    after = backend.state_dict()
    assert torch.equal(after["model.norm.weight"], torch.full((64,), 0.5))
    assert after["model.norm.weight"].dtype == torch.float32
    assert all(torch.equal(after[name], before[name]) for name in before if name != "model.norm.weight")


def test_state_dict_returns_a_copy_that_does_not_alias_the_model(tiny: HFBackend) -> None:
    state = tiny.state_dict()
    assert "model.embed_tokens.weight" in state and state["model.embed_tokens.weight"].shape == (49_152, 64)
    state["model.norm.weight"].fill_(123.0)
    assert not torch.equal(tiny.state_dict()["model.norm.weight"], state["model.norm.weight"])


# --- inputs ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": 2.5}, "max_new_tokens"),
        ({"stop": "\n"}, "stop"),
        ({"stop": ("ok", "")}, "stop"),
        ({"seed": -1}, "seed"),
        ({"seed": True}, "seed"),
    ],
)
def test_sampling_params_reject_bad_values_naming_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_sampling_params_take_any_sequence_of_stop_strings_and_freeze_it() -> None:
    params = SamplingParams(stop=["</answer>", "\n\n"])  # type: ignore[arg-type]
    assert params.stop == ("</answer>", "\n\n")
    assert SamplingParams(temperature=0).greedy and not SamplingParams().greedy


def test_prompts_must_be_non_empty_and_inside_the_vocabulary(tiny: HFBackend) -> None:
    with pytest.raises(ValueError, match=r"prompt_token_ids\[1\] is empty"):
        tiny.generate([[1, 2], []], SamplingParams())
    with pytest.raises(ValueError, match=r"prompt_token_ids\[0\].*49152.*\[0, 49152\)"):
        tiny.generate([[1, 49_152]], SamplingParams())
    assert tiny.generate([], SamplingParams()) == []


def test_encode_chat_renders_the_chat_template_up_to_the_assistant_header(tiny: HFBackend) -> None:
    ids = tiny.encode_chat([{"role": "user", "content": "What is 2+2?"}])
    text = tiny.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\n")
    assert "<|im_start|>user\nWhat is 2+2?<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    without = tiny.encode_chat([{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=False)
    assert ids[: len(without)] == without and len(without) < len(ids)


# --- base models and the cache -----------------------------------------------------------------------------------


def test_an_unknown_base_model_is_refused_with_the_builtin_names_and_the_config_json_rule(tmp_path: Path) -> None:
    with pytest.raises(UnknownBaseModel) as raised:
        resolve_base_model("gpt-17-ultra", cache_dir=tmp_path)
    message = str(raised.value)
    assert "gpt-17-ultra" in message and "config.json" in message
    assert all(name in message for name in BUILTINS)
    assert isinstance(raised.value, ValueError)
    with pytest.raises(UnknownBaseModel, match="without config.json"):
        resolve_base_model(str(tmp_path), cache_dir=tmp_path)


def test_a_local_model_directory_resolves_to_itself(tiny_path: Path, tmp_path: Path) -> None:
    copy = _model_dir_like(tiny_path, tmp_path / "my-model")
    assert resolve_base_model(str(copy), cache_dir=tmp_path / "unused") == copy.resolve()
    assert not (tmp_path / "unused").exists()


def test_a_builtin_model_is_built_once_then_reused_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    builds: list[Path] = []
    build = registry._BUILDERS[TINY_LLAMA]

    def counting_build(target: Path, cache_dir: Path) -> dict[str, object]:
        builds.append(target)
        return build(target, cache_dir)

    monkeypatch.setitem(registry._BUILDERS, TINY_LLAMA, counting_build)
    first = resolve_base_model(TINY_LLAMA, cache_dir=tmp_path)
    source = (first / registry.SOURCE_FILE).read_text()
    second = resolve_base_model(TINY_LLAMA, cache_dir=tmp_path)

    assert first == second == tmp_path / TINY_LLAMA
    assert len(builds) == 1 and not builds[0].exists()  # built in a staging directory, then renamed into place
    assert (second / registry.SOURCE_FILE).read_text() == source
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == [TINY_LLAMA]


def test_two_processes_asking_for_the_same_builtin_at_once_share_one_build(tiny_path: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    # Seed the cache with SmolLM2's tokenizer files so each build copies them instead of parsing the GGUF.
    (cache / SMOLLM2).mkdir(parents=True)
    for name in (*TOKENIZER_FILES, "config.json"):
        shutil.copy2(tiny_path / name, cache / SMOLLM2 / name)
    go = tmp_path / "go"
    script = (
        "import os, pathlib, sys, time\n"
        "from workers.models import resolve_base_model\n"
        f"go = pathlib.Path({str(go)!r})\n"
        "while not go.exists(): time.sleep(0.01)\n"
        f"path = resolve_base_model({TINY_LLAMA!r}, cache_dir=pathlib.Path({str(cache)!r}))\n"
        "print((path / 'crucible-source.json').read_text())\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", script], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        for _ in range(2)
    ]
    time.sleep(1)  # both are waiting for the signal by now (importing workers.models is cheap)
    go.touch()
    outputs = [worker.communicate(timeout=120) for worker in workers]

    assert [worker.returncode for worker in workers] == [0, 0], [err.decode()[-2000:] for _, err in outputs]
    sources = [json.loads(out) for out, _ in outputs]
    assert sources[0]["build_id"] == sources[1]["build_id"]
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) == [SMOLLM2, TINY_LLAMA]


def test_tiny_llama_is_deterministic_given_the_seed_and_uses_smollm2s_vocabulary() -> None:
    first, again, other = tiny_llama(seed=0), tiny_llama(seed=0), tiny_llama(seed=1)
    assert first.config.vocab_size == 49_152 and first.config.num_hidden_layers == 2
    state, state_again, state_other = first.state_dict(), again.state_dict(), other.state_dict()
    assert all(torch.equal(state[name], state_again[name]) for name in state)
    assert not torch.equal(state["model.embed_tokens.weight"], state_other["model.embed_tokens.weight"])


def test_the_cached_tiny_model_holds_the_seed_zero_weights_and_smollm2s_tokenizer(
    tiny: HFBackend, tiny_path: Path
) -> None:
    expected = tiny_llama(seed=0).state_dict()
    assert all(torch.equal(tiny.model.state_dict()[name], expected[name]) for name in expected)
    assert len(tiny.tokenizer) == 49_152
    assert tiny.tokenizer.eos_token == tiny.tokenizer.pad_token == "<|im_end|>"


def test_the_model_cache_comes_from_the_environment_and_must_be_absolute(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(registry.CACHE_ENV, "/srv/models")
    assert registry.model_cache_dir() == Path("/srv/models")
    monkeypatch.setenv(registry.CACHE_ENV, "relative/models")
    with pytest.raises(ValueError, match=registry.CACHE_ENV):
        registry.model_cache_dir()
    monkeypatch.delenv(registry.CACHE_ENV)
    assert registry.model_cache_dir() == Path.home() / ".cache" / "crucible" / "models"


def test_make_backend_builds_a_policy_backend_from_a_builtin_name(
    model_cache: Path, tiny_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(registry.CACHE_ENV, str(model_cache))
    backend = make_backend("transformers", TINY_LLAMA)
    assert isinstance(backend, HFBackend) and isinstance(backend, PolicyBackend)
    assert backend.generate(PROMPTS[:1], SamplingParams(max_new_tokens=2, seed=0))[0].finish_reason == "length"
    with pytest.raises(ValueError, match="kind"):
        make_backend("llama.cpp", tiny_path)  # type: ignore[arg-type]


def test_the_vllm_backend_explains_that_it_needs_vllm_when_it_is_missing(tiny_path: Path) -> None:
    if any(name == "vllm" for name in sys.modules) or _vllm_installed():
        pytest.skip("vllm is installed here")
    from workers.models.vllm_backend import VLLMBackend

    with pytest.raises(ImportError, match="gpu"):
        VLLMBackend(tiny_path)


def _vllm_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


# --- the real base model -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_converts_once_and_answers_a_chat_prompt_ending_at_its_end_token() -> None:
    path = resolve_base_model(SMOLLM2)  # the default cache: converts on the first run only (about 30 s)
    assert resolve_base_model(SMOLLM2) == path
    backend = HFBackend(path)
    assert backend.model.config.num_hidden_layers == 30
    prompt = backend.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    (generation,) = backend.generate([prompt], SamplingParams(temperature=0, max_new_tokens=48))
    assert generation.finish_reason == "stop" and generation.token_ids[-1] == backend.tokenizer.eos_token_id
    assert "Paris" in generation.text and "<|im_end|>" not in generation.text
    expected = _full_forward_logprobs(backend, prompt, generation.token_ids, temperature=1.0)
    assert generation.logprobs == pytest.approx(expected, abs=1e-4)


# --- the built-in model registry ---------------------------------------------------------------------------------


def test_one_registry_carries_every_builtin_and_the_shape_table_derives_from_it() -> None:
    assert list(BUILTINS) == [SMOLLM2, TINY_LLAMA]
    # The shapes workers/rl/config.py held before the registry carried them.
    assert registry.BUILTIN_SHAPES == {
        SMOLLM2: registry.ModelShape(parameters=134_515_008, layers=30, hidden=576, vocab=49_152),
        TINY_LLAMA: registry.ModelShape(parameters=3_300_000, layers=2, hidden=64, vocab=49_152),
    }
    assert set(registry._BUILDERS) == set(registry.BUILTINS)  # every built-in can be built


def test_model_name_problems_accepts_builtins_allowed_names_paths_and_hub_ids(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from workers.models import model_name_problems

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the Hub cannot answer: a well-formed id is left to the workers
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    assert model_name_problems(SMOLLM2) == model_name_problems(TINY_LLAMA) == []
    assert model_name_problems(str(tmp_path / "model")) == []
    # A path is checked on the workers, where the model lives, not on the control plane's host.
    assert model_name_problems("/models/on-the-workers") == model_name_problems("~/models/x") == []
    assert model_name_problems("org/name") == model_name_problems("org/name@v1.0") == []
    assert model_name_problems("scripted-search", allow=["scripted-search"]) == []
    expected = (
        "unknown model {!r}: use a built-in name (smollm2-135m-instruct, tiny-llama-smollm2-tokenizer), a Hub id "
        "(org/name or org/name@revision) or a path starting with / (a model directory with config.json on the "
        "workers)"
    )
    assert model_name_problems("scripted-search") == [expected.format("scripted-search")]
    assert model_name_problems("gpt-9", allow=("scripted-search",)) == [expected.format("gpt-9")]
    assert model_name_problems("org/na me") == [expected.format("org/na me")]
    assert model_name_problems("a/b/c") == [expected.format("a/b/c")]


def test_the_model_registry_imports_without_torch_or_ray() -> None:
    # The control plane imports it to check names; it must not pay for (or need) the training stack.
    script = (
        "import sys\n"
        "import workers.models.registry, workers.rl.config\n"
        "print(sorted(m for m in ('torch', 'ray', 'transformers', 'vllm') if m in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
