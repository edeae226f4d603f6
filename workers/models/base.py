"""The policy backend contract: token ids in, sampled token ids and their log-probabilities out.

Rollout workers and the trainer only ever exchange token ids, never re-tokenised text, so the trainer scores
exactly the tokens the policy sampled. Two implementations exist: `workers.models.hf.HFBackend` (transformers,
CPU or one GPU) and `workers.models.vllm_backend.VLLMBackend` (vLLM, GPU).

What `Generation.logprobs` holds (both backends agree):

- Sampling (`temperature > 0`): `log softmax(logits / temperature)` at the sampled token, the temperature-scaled
  distribution *before* top-p truncation. That is the quantity a trainer recomputes for the new policy (it divides
  its logits by the same temperature and has no top-p), so the importance ratio of an unchanged policy is exactly
  1. With `top_p < 1` the token was drawn from the renormalised nucleus, whose log-probability is this value minus
  `log(nucleus mass)`; we report the untruncated value on purpose.
- Greedy (`temperature == 0`): `log softmax(logits)` at the argmax token, that is the temperature-1 distribution
  (a temperature-0 distribution is degenerate; this matches vLLM, which treats temperature 0 as 1 for logprobs).

Stopping: a row ends when it samples an end-of-sequence token, when its decoded text contains one of
`SamplingParams.stop`, or after `max_new_tokens` tokens. `Generation.token_ids` keeps every sampled token, the EOS
token and the token that completed a stop string included (the trainer must learn to emit them); `Generation.text`
is the decoded text without special tokens and cut just before the first stop string (the stop string itself is
not in `text`). This is vLLM's default behaviour too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast, runtime_checkable

if TYPE_CHECKING:
    from torch import Tensor
    from transformers import PreTrainedTokenizerBase

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one batch of completions.

    `temperature` 0 means greedy decoding (and then `top_p` and `seed` do not matter). `top_p` is nucleus
    sampling: keep the most probable tokens whose cumulative probability first reaches `top_p` (the top token is
    always kept). `stop` strings end a completion as soon as the decoded text contains one. `seed` makes sampling
    reproducible for the same prompts, parameters and weights on the same backend; `None` draws fresh randomness.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 128
    stop: tuple[str, ...] = field(default=())
    seed: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, int | float):
            raise ValueError(f"temperature must be a number, got {self.temperature!r}")
        if not 0.0 <= float(self.temperature) < float("inf"):
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature!r}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, int | float):
            raise ValueError(f"top_p must be a number, got {self.top_p!r}")
        if not 0.0 < float(self.top_p) <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 disables nucleus sampling), got {self.top_p!r}")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int):
            raise ValueError(f"max_new_tokens must be an integer, got {self.max_new_tokens!r}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if isinstance(self.stop, str):
            # A bare string would silently become one stop string per character.
            raise ValueError(f"stop must be a sequence of strings, not a string: use stop=({self.stop!r},)")
        stop = tuple(self.stop)
        for item in stop:
            if not isinstance(item, str) or not item:
                raise ValueError(f"stop strings must be non-empty strings, got {item!r}")
        object.__setattr__(self, "stop", stop)
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Generation:
    """One completion of one prompt.

    `token_ids` and `logprobs` have the same length (the number of generated tokens); `logprobs[i]` is the natural
    log-probability of `token_ids[i]` as defined in this module's docstring. `policy_version` is the backend's
    `policy_version` when the completion was generated.
    """

    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: FinishReason
    policy_version: int


@runtime_checkable
class PolicyBackend(Protocol):
    """A policy that samples completions for token-id prompts and accepts new weights from the trainer.

    Implementations are not thread-safe: one caller at a time (a Ray actor gives that for free).
    """

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The model's tokenizer (use it to build prompts and to decode)."""
        ...

    @property
    def policy_version(self) -> int:
        """The version of the weights now loaded: 0 for the base model, then whatever `load_state_dict` set."""
        ...

    def generate(self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Sample one completion per prompt (`len(result) == len(prompt_token_ids)`, same order)."""
        ...

    def load_state_dict(self, state: Mapping[str, Tensor], version: int) -> None:
        """Copy `state` (Hugging Face parameter names, any dtype and device) into the weights; set the version.

        `state` may hold a subset of the parameters (the rest are kept). Unknown names or wrong shapes raise
        `ValueError` before any weight changes.
        """
        ...

    def sleep(self) -> int:
        """Release the device memory the engine holds while a colocated learner trains; returns the bytes freed
        (0 where there is nothing to free, as on CPU). `generate` refuses until `wake`."""
        ...

    def wake(self) -> None:
        """Take the device back after `sleep`; new weights are loaded after waking."""
        ...

    def state_dict(self) -> dict[str, Tensor]:
        """A CPU copy of the current weights under Hugging Face parameter names."""
        ...

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> list[int]:
        """Token ids of `messages` rendered with the model's chat template."""
        ...


def encode_chat(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
) -> list[int]:
    """Render chat `messages` (`{"role": ..., "content": ...}` dicts) with the tokenizer's chat template.

    With `add_generation_prompt` the ids end with the assistant header, ready for `generate`.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model's tokenizer has no chat template: build prompt token ids yourself")
    ids = tokenizer.apply_chat_template(
        [dict(message) for message in messages],
        add_generation_prompt=add_generation_prompt,
        tokenize=True,
        return_dict=False,
    )
    if not isinstance(ids, list) or not all(isinstance(token, int) for token in ids):
        raise TypeError(f"apply_chat_template returned {type(ids).__name__}, expected a list of token ids")
    return cast(list[int], ids)


def check_prompts(prompt_token_ids: Sequence[Sequence[int]], vocab_size: int) -> list[list[int]]:
    """Copy prompts into lists of ints, refusing empty prompts and ids outside `[0, vocab_size)`."""
    prompts: list[list[int]] = []
    for index, prompt in enumerate(prompt_token_ids):
        ids = [int(token) for token in prompt]
        if not ids:
            raise ValueError(f"prompt_token_ids[{index}] is empty: every prompt needs at least one token")
        bad = [token for token in ids if not 0 <= token < vocab_size]
        if bad:
            raise ValueError(
                f"prompt_token_ids[{index}] holds token id {bad[0]}, outside the vocabulary [0, {vocab_size})"
            )
        prompts.append(ids)
    return prompts


def truncate_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """`text` cut just before the earliest occurrence of any stop string, and whether one occurred."""
    cut = min((index for index in (text.find(s) for s in stop) if index >= 0), default=-1)
    if cut < 0:
        return text, False
    return text[:cut], True
