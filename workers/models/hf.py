"""`HFBackend`: the policy on transformers, with its own KV-cached sampling loop.

Why not `model.generate`: we need the log-probability of every sampled token under the exact distribution the
trainer will recompute (see `workers.models.base`), and a batch must stop as soon as every row has finished
instead of decoding all `max_new_tokens` steps. Finished rows also leave the batch (their KV cache rows are
dropped), so a long straggler does not pay for the rows that stopped early.

One step of the loop, for the `b` rows still running:
  logits [b, vocab] (float32) -> token [b] -> one forward of tokens [b, 1] against the cache -> next logits.
The prompt forward (prefill) computes logits for the last position only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicCache

from workers.models.base import (
    FinishReason,
    Generation,
    SamplingParams,
    check_prompts,
    encode_chat,
    truncate_at_stop,
)
from workers.models.registry import load_tokenizer


class HFBackend:
    """A `PolicyBackend` on a transformers causal LM loaded from a local directory.

    `threads` sets torch's intra-op thread count for the whole process (torch has no per-model setting); `None`
    leaves it alone. Weights are kept in `dtype`; logits are upcast to float32 before sampling.
    """

    def __init__(
        self,
        model_path: Path | str,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        threads: int | None = None,
    ) -> None:
        if threads is not None:
            if threads < 1:
                raise ValueError(f"threads must be >= 1, got {threads}")
            torch.set_num_threads(threads)
        path = Path(model_path)
        if not (path / "config.json").is_file():
            raise ValueError(f"model_path {os.fspath(path)!r} is not a model directory (no config.json)")
        self._device = torch.device(device)
        self._tokenizer = load_tokenizer(path)
        model = AutoModelForCausalLM.from_pretrained(
            os.fspath(path), dtype=dtype, device_map=self._device, local_files_only=True
        )
        model.train(False)
        model.requires_grad_(False)
        self._model: PreTrainedModel = model
        self._version = 0
        self._asleep = False
        config = self._model.config
        self._vocab_size = int(config.vocab_size)
        self._max_positions = int(getattr(config, "max_position_embeddings", 0) or 0) or None
        self._eos_ids = _eos_token_ids(self._model, self._tokenizer)
        pad = self._tokenizer.pad_token_id
        self._pad_id = int(pad) if pad is not None else min(self._eos_ids, default=0)

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    @property
    def model(self) -> PreTrainedModel:
        """The underlying transformers model (in eval mode, gradients off)."""
        return self._model

    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Token ids that end a completion: the generation config's `eos_token_id`s and the tokenizer's EOS."""
        return self._eos_ids

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> list[int]:
        return encode_chat(self._tokenizer, messages, add_generation_prompt=add_generation_prompt)

    @torch.inference_mode()
    def generate(self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Sample one completion per prompt; see `workers.models.base` for what the logprobs and texts hold.

        Prompts of different lengths are left-padded into one batch. A row's budget is `params.max_new_tokens`,
        cut to the model's `max_position_embeddings` minus its prompt length (finish reason "length").
        """
        # One function on purpose: the sampling loop: padding, the per-row budgets, stop strings and log-probs share
        # the loop's state.
        if self._asleep:
            raise RuntimeError("the engine is asleep (the learner is training on its device): call wake() first")
        prompts = check_prompts(prompt_token_ids, self._vocab_size)
        if not prompts:
            return []
        budgets = [self._budget(index, len(prompt), params.max_new_tokens) for index, prompt in enumerate(prompts)]
        generator = self._generator(params)
        device = self._device

        width = max(len(prompt) for prompt in prompts)
        input_ids = torch.full((len(prompts), width), self._pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[row, width - len(prompt) :] = 1
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        # Left padding shifts each row's first real token to a different column; positions count real tokens only.
        position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self._model.config)
        output = self._model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        logits = output.logits[:, -1, :]
        next_position = position_ids[:, -1] + 1

        rows = list(range(len(prompts)))  # batch position -> prompt index, for the rows still running
        tokens_out: list[list[int]] = [[] for _ in prompts]
        logprobs_out: list[list[float]] = [[] for _ in prompts]
        finished: list[tuple[str, FinishReason] | None] = [None] * len(prompts)
        while True:
            tokens, logprobs = _sample(logits, params, generator)
            keep: list[int] = []
            for position, (row, token, logprob) in enumerate(
                zip(rows, tokens.tolist(), logprobs.tolist(), strict=True)
            ):
                tokens_out[row].append(token)
                logprobs_out[row].append(logprob)
                finished[row] = self._finish(tokens_out[row], budgets[row], params.stop)
                if finished[row] is None:
                    keep.append(position)
            if not keep:
                break
            if len(keep) < len(rows):
                index = torch.tensor(keep, dtype=torch.long, device=device)
                cache.batch_select_indices(index)
                tokens, attention_mask, next_position = tokens[index], attention_mask[index], next_position[index]
                rows = [rows[position] for position in keep]
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(rows), 1))], dim=1)
            output = self._model(
                input_ids=tokens.unsqueeze(1),
                attention_mask=attention_mask,
                position_ids=next_position.unsqueeze(1),
                past_key_values=cache,
                use_cache=True,
            )
            logits = output.logits[:, -1, :]
            next_position = next_position + 1

        generations = []
        for row, prompt in enumerate(prompts):
            outcome = finished[row]
            assert outcome is not None
            text, reason = outcome
            generations.append(
                Generation(
                    prompt_token_ids=prompt,
                    token_ids=tokens_out[row],
                    logprobs=logprobs_out[row],
                    text=text,
                    finish_reason=reason,
                    policy_version=self._version,
                )
            )
        return generations

    def load_state_dict(self, state: Mapping[str, Tensor], version: int) -> None:
        """Copy `state` into the model's weights (a subset of names is fine) and set `policy_version`.

        Tensors are converted to the model's dtype and device. Unknown names and shape mismatches raise
        `ValueError` before anything is copied. Tied weights (SmolLM2's embedding and LM head) share storage, so
        either name updates both.
        """
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"version must be a non-negative integer, got {version!r}")
        current = self._model.state_dict()  # detached views of the live parameters and buffers
        unknown = sorted(set(state) - set(current))
        if unknown:
            shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
            raise ValueError(f"state holds names the model does not have: {shown}")
        for name, tensor in state.items():
            if tuple(tensor.shape) != tuple(current[name].shape):
                raise ValueError(
                    f"state[{name!r}] has shape {tuple(tensor.shape)}, the model expects {tuple(current[name].shape)}"
                )
        with torch.no_grad():
            for name, tensor in state.items():
                current[name].copy_(tensor)
        self._version = version

    def sleep(self) -> int:
        """Give the device back while a colocated learner trains on it; returns the bytes released. On GPU the
        weights move to host memory (vLLM's sleep level 1 does the same); on CPU they live in host memory already
        and nothing is released (0). `generate` refuses until `wake`."""
        released = 0
        if self._device.type != "cpu":
            released = sum(p.numel() * p.element_size() for p in self._model.parameters())
            self._model.to(torch.device("cpu"))  # type: ignore[arg-type]
            torch.cuda.empty_cache()
        self._asleep = True
        return released

    def wake(self) -> None:
        if self._device.type != "cpu":
            self._model.to(self._device)  # type: ignore[arg-type]
        self._asleep = False

    def state_dict(self) -> dict[str, Tensor]:
        """A CPU copy of every parameter and buffer under its Hugging Face name (tied weights appear twice)."""
        return {name: tensor.detach().to("cpu", copy=True) for name, tensor in self._model.state_dict().items()}

    def _budget(self, index: int, prompt_length: int, max_new_tokens: int) -> int:
        if self._max_positions is None:
            return max_new_tokens
        room = self._max_positions - prompt_length
        if room < 1:
            raise ValueError(
                f"prompt_token_ids[{index}] has {prompt_length} tokens; the model's context is "
                f"{self._max_positions} positions, leaving no room to generate"
            )
        return min(max_new_tokens, room)

    def _generator(self, params: SamplingParams) -> torch.Generator | None:
        if params.greedy:
            return None
        generator = torch.Generator(device=self._device)
        if params.seed is None:
            generator.seed()
        else:
            generator.manual_seed(params.seed)
        return generator

    def _finish(self, token_ids: list[int], budget: int, stop: tuple[str, ...]) -> tuple[str, FinishReason] | None:
        """(text, reason) once a row is done, else None. Called after each token, so the first stop wins."""
        if token_ids[-1] in self._eos_ids:
            return self._decode(token_ids[:-1]), "stop"
        if stop:
            text, stopped = truncate_at_stop(self._decode(token_ids), stop)
            if stopped:
                return text, "stop"
        if len(token_ids) >= budget:
            return self._decode(token_ids), "length"
        return None

    def _decode(self, token_ids: list[int]) -> str:
        text = self._tokenizer.decode(token_ids, skip_special_tokens=True)
        assert isinstance(text, str)
        return text


def _sample(logits: Tensor, params: SamplingParams, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """Next tokens [b] (int64) and their log-probabilities [b] (float32, nats) from logits [b, vocab].

    Greedy: argmax, scored under temperature 1. Sampling: draw from softmax(logits / T) restricted to the top-p
    nucleus; score under softmax(logits / T) without the nucleus cut (see `workers.models.base`).
    """
    logits = logits.float()
    if params.greedy:
        tokens = logits.argmax(dim=-1)
        logprobs = torch.log_softmax(logits, dim=-1)
        return tokens, logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    logprobs = torch.log_softmax(logits / params.temperature, dim=-1)
    probs = logprobs.exp()
    if params.top_p < 1.0:
        probs = _nucleus(probs, params.top_p)
    tokens = torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
    return tokens, logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _nucleus(probs: Tensor, top_p: float) -> Tensor:
    """probs [b, vocab] with every token outside the top-p nucleus zeroed (unnormalised; multinomial rescales).

    A token is kept when the probability mass of the tokens ranked above it is still below `top_p`, so the
    nucleus is the smallest top set reaching `top_p` and always holds the most probable token.
    """
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_above = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_above >= top_p, 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)


def _eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    ids: set[int] = set()
    generation_config = getattr(model, "generation_config", None)
    configured = getattr(generation_config, "eos_token_id", None)
    if configured is None:
        configured = getattr(model.config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif isinstance(configured, list | tuple):
        ids.update(int(token) for token in configured)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)
