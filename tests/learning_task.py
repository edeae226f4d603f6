"""The learning task of Crucible's training checks: a tiny model that can learn it in a few dozen steps, with a
reward that varies within a group from the first step (issue 37).

The tiny random model (`tiny-llama-smollm2-tokenizer`) spreads its mass over 49,152 tokens, so a task it must
answer in words would never be rewarded. `shaped_tiny_model` saves a copy of it whose LM head prefers a few
candidate tokens (about 18% each for four), and `colour_tasks` asks questions whose one-word answer is one of
them ("blue"). A one-token reply is scored by the real exact-answer environment and the reward config's
`normalized_match` term: about 0.18 at the start, so most groups of 8 hold both a right and a wrong answer, and a
policy that moves mass onto the right token is paid for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ANSWER = "blue"
COLOURS = ["blue", "red", "green", "yellow"]
"""Candidate words; each is one token of SmolLM2's vocabulary ('blue' 16591, 'red' 455, 'green' 9298, 'yellow'
23429)."""

QUESTIONS = [
    "What colour is the sky on a clear day?",
    "What colour is the sea in a postcard?",
    "What colour are forget-me-not flowers?",
    "What colour is a sapphire?",
    "What colour is the flag of the United Nations?",
    "What colour is a blueberry?",
    "What colour is denim?",
    "What colour is the Smurfs' skin?",
]


def colour_tasks(n: int) -> list[dict[str, Any]]:
    """`n` exact-answer task rows whose answer is "blue" (the questions cycle)."""
    return [
        {"id": f"colour-{i}", "prompt": f"{QUESTIONS[i % len(QUESTIONS)]} Answer with one word.", "answer": ANSWER}
        for i in range(n)
    ]


def candidate_ids(tokenizer: Any, words: list[str] = COLOURS) -> list[int]:
    ids = []
    for word in words:
        encoded = tokenizer.encode(word, add_special_tokens=False)
        if len(encoded) != 1:
            raise ValueError(f"{word!r} is {len(encoded)} tokens in this vocabulary; the task needs one")
        ids.append(encoded[0])
    return ids


def shaped_tiny_model(target: Path, candidates: list[int] | None = None) -> Path:
    """Save into `target` the tiny model with a constant direction in its residual stream (dimension 0 of every
    embedding) that the LM head maps to about +14 logits for the candidate tokens only (default: `COLOURS`)."""
    import torch
    from transformers import AutoModelForCausalLM

    from workers.models.registry import TINY_LLAMA, load_tokenizer, resolve_base_model

    source = resolve_base_model(TINY_LLAMA)
    tokenizer = load_tokenizer(source)
    candidates = candidate_ids(tokenizer) if candidates is None else candidates
    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32, local_files_only=True)
    # Untie the LM head from the embeddings so the two can be shaped apart.
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach().clone())
    with torch.no_grad():
        model.get_input_embeddings().weight[:, 0] = 50.0
        head = model.lm_head.weight
        head[:, 0] = 0.0
        head[candidates, 0] = 2.8  # h[0] is about 5 after the final norm: a logit of about +14
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target
