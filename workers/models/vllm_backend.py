"""`VLLMBackend`: the policy on vLLM (GPU images only; vllm is imported when the backend is built).

It keeps the contract of `workers.models.base`:

- Logprobs: the engine runs with `logprobs_mode="processed_logprobs"` and each request asks for `logprobs=0`
  (the sampled token only). vLLM's processed logprobs are taken after temperature scaling *and* after top-k/top-p
  masking, so they equal `HFBackend`'s temperature-scaled, untruncated logprobs exactly when `top_p == 1` (the
  usual RL setting). With `top_p < 1` vLLM reports the log-probability under the renormalised nucleus, which is
  higher by `-log(nucleus mass)`; a trainer that needs the untruncated value must use `top_p == 1` here. Greedy
  requests (temperature 0) are scored at temperature 1, as in `HFBackend`.
- Seeds: vLLM seeds each request on its own, so row `i` gets `seed + i`; rows with the same prompt (a GRPO group)
  still get different samples. Same seed, prompts and weights give the same samples on the same engine.
- Stops: vLLM keeps the EOS token and the tokens that completed a stop string in `token_ids` and cuts the stop
  string from the text (`include_stop_str_in_output=False`), as `HFBackend` does.

Weight updates go through a worker extension (`WeightSyncExtension`, installed with `worker_extension_cls`)
whose method `collective_rpc` calls inside each worker process; the tensors travel through vLLM's RPC channel on
the CPU, which is fine for one GPU and small models. The prefix cache is reset after every update, since its KV
blocks were computed with the old weights.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from workers.models.base import Generation, SamplingParams, check_prompts, encode_chat
from workers.models.registry import load_tokenizer

# Weights are sent to the workers in chunks of about this many bytes, to bound the size of one RPC message.
_CHUNK_BYTES = 512 * 2**20


class WeightSyncExtension:
    """Methods mixed into vLLM's GPU worker class (`worker_extension_cls`); they run inside the worker process.

    This class must stay importable without vllm: the worker imports it by its qualified name.
    """

    model_runner: Any

    def crucible_load_weights(self, weights: list[tuple[str, Tensor]]) -> int:
        """Load `(Hugging Face name, tensor)` pairs into the worker's model; returns how many were given.

        The model's own `load_weights` maps HF names onto vLLM's fused layers (q/k/v into qkv_proj, gate/up into
        gate_up_proj) and converts dtype and device.
        """
        runner = self.model_runner
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        model.load_weights(weights=iter(weights))
        return len(weights)


class VLLMBackend:
    """A `PolicyBackend` on a vLLM engine in this process (one GPU by default).

    `engine_kwargs` go to `vllm.LLM` as they are (for example `tensor_parallel_size`, `max_num_seqs`).
    """

    def __init__(
        self,
        model_path: Path | str,
        *,
        dtype: torch.dtype | str = "auto",
        gpu_memory_utilization: float = 0.5,
        max_model_len: int | None = None,
        seed: int = 0,
        enable_prefix_caching: bool = True,
        enforce_eager: bool = False,
        **engine_kwargs: Any,
    ) -> None:
        try:
            import vllm
        except ImportError as error:
            raise ImportError(
                "VLLMBackend needs vllm, which is only installed in GPU images (the `gpu` extra); "
                "use the transformers backend on CPU"
            ) from error
        path = Path(model_path)
        if not (path / "config.json").is_file():
            raise ValueError(f"model_path {os.fspath(path)!r} is not a model directory (no config.json)")
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        self._path = path
        self._tokenizer = load_tokenizer(path)
        self._shapes = _checkpoint_shapes(path)
        self._tied = bool(json.loads((path / "config.json").read_text()).get("tie_word_embeddings", False))
        self._updates: dict[str, Tensor] = {}
        self._version = 0
        self._vocab_size = int(json.loads((path / "config.json").read_text()).get("vocab_size") or 0)
        self._llm = vllm.LLM(
            model=os.fspath(path),
            tokenizer=os.fspath(path),
            dtype=str(dtype).removeprefix("torch.") if isinstance(dtype, torch.dtype) else dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            seed=seed,
            enable_prefix_caching=enable_prefix_caching,
            enforce_eager=enforce_eager,
            logprobs_mode="processed_logprobs",
            worker_extension_cls=f"{__name__}.{WeightSyncExtension.__qualname__}",
            **engine_kwargs,
        )
        self._vllm = vllm

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def llm(self) -> Any:
        """The underlying `vllm.LLM`."""
        return self._llm

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> list[int]:
        return encode_chat(self._tokenizer, messages, add_generation_prompt=add_generation_prompt)

    def generate(self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Sample one completion per prompt in one engine call; see this module's docstring for the semantics."""
        prompts = check_prompts(prompt_token_ids, self._vocab_size or 2**62)
        if not prompts:
            return []
        from vllm.inputs import TokensPrompt

        requests = [
            self._vllm.SamplingParams(
                n=1,
                temperature=float(params.temperature),
                top_p=float(params.top_p),
                max_tokens=params.max_new_tokens,
                stop=list(params.stop) or None,
                seed=None if params.seed is None or params.greedy else params.seed + row,
                logprobs=0,
                skip_special_tokens=True,
                include_stop_str_in_output=False,
            )
            for row in range(len(prompts))
        ]
        outputs = self._llm.generate(
            [TokensPrompt(prompt_token_ids=prompt) for prompt in prompts], requests, use_tqdm=False
        )
        generations = []
        for prompt, output in zip(prompts, outputs, strict=True):
            completion = output.outputs[0]
            if completion.finish_reason not in ("stop", "length"):
                raise RuntimeError(f"vLLM ended a request with finish_reason={completion.finish_reason!r}")
            token_ids = [int(token) for token in completion.token_ids]
            if completion.logprobs is None or len(completion.logprobs) != len(token_ids):
                raise RuntimeError("vLLM returned no logprob for some sampled tokens")
            logprobs = [
                float(position[token].logprob) for position, token in zip(completion.logprobs, token_ids, strict=True)
            ]
            generations.append(
                Generation(
                    prompt_token_ids=prompt,
                    token_ids=token_ids,
                    logprobs=logprobs,
                    text=str(completion.text),
                    finish_reason=completion.finish_reason,
                    policy_version=self._version,
                )
            )
        return generations

    def load_state_dict(self, state: Mapping[str, Tensor], version: int) -> None:
        """Send `state` (Hugging Face names; a subset is fine) to the engine's workers and set `policy_version`.

        Names and shapes are checked against the model directory's checkpoint before anything is sent.
        """
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"version must be a non-negative integer, got {version!r}")
        unknown = sorted(set(state) - set(self._shapes))
        if unknown:
            shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
            raise ValueError(f"state holds names the model does not have: {shown}")
        for name, tensor in state.items():
            if tuple(tensor.shape) != self._shapes[name]:
                raise ValueError(
                    f"state[{name!r}] has shape {tuple(tensor.shape)}, the model expects {self._shapes[name]}"
                )
        cpu_state = {name: tensor.detach().to("cpu").contiguous() for name, tensor in state.items()}
        if self._tied and "lm_head.weight" in cpu_state:
            # vLLM's tied models skip `lm_head.weight` on load; the embedding carries the shared matrix.
            head = cpu_state.pop("lm_head.weight")
            cpu_state.setdefault("model.embed_tokens.weight", head)
        for chunk in _chunks(cpu_state):
            self._llm.collective_rpc("crucible_load_weights", args=(chunk,))
        self._llm.reset_prefix_cache()
        self._updates.update(cpu_state)
        self._version = version

    def sleep(self) -> int:
        """vLLM's sleep mode, level 1 (the engine must be built with `enable_sleep_mode=True`): the weights go to
        host memory and the KV cache is dropped while a colocated learner trains; returns the bytes freed."""
        import torch

        before = torch.cuda.mem_get_info()[0]
        self._llm.sleep(level=1)
        return max(0, int(torch.cuda.mem_get_info()[0] - before))

    def wake(self) -> None:
        self._llm.wake_up()

    def state_dict(self) -> dict[str, Tensor]:
        """The checkpoint's tensors with every update loaded since start-up applied (CPU, HF names).

        Read from the model directory and the updates this backend sent, not back from the GPU (vLLM's layers
        are fused and renamed). Updates are kept as CPU copies for this, so they cost host memory.
        """
        from safetensors.torch import load_file

        state: dict[str, Tensor] = {}
        for file in sorted(self._path.glob("*.safetensors")):
            state.update(load_file(os.fspath(file)))
        state.update({name: tensor.clone() for name, tensor in self._updates.items()})
        if self._tied and "model.embed_tokens.weight" in state:
            state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
        return state


def _checkpoint_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape, read from the safetensors headers (no tensor data is loaded)."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(os.fspath(file), framework="pt") as handle:
            for name in handle.keys():
                shapes[name] = tuple(handle.get_slice(name).get_shape())
    if not shapes:
        raise ValueError(f"{os.fspath(path)!r} holds no *.safetensors weights")
    config = json.loads((path / "config.json").read_text())
    tied = config.get("tie_word_embeddings", False)
    if tied and "lm_head.weight" not in shapes and "model.embed_tokens.weight" in shapes:
        # Tied heads are saved once; accept the head's name too (vLLM skips it and keeps the tie).
        shapes["lm_head.weight"] = shapes["model.embed_tokens.weight"]
    return shapes


def _chunks(state: Mapping[str, Tensor]) -> Iterator[list[tuple[str, Tensor]]]:
    chunk: list[tuple[str, Tensor]] = []
    size = 0
    for name, tensor in state.items():
        chunk.append((name, tensor))
        size += tensor.numel() * tensor.element_size()
        if size >= _CHUNK_BYTES:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk
