"""`llm/v1`: the synthetic-task generator on a language model (any `workers.models` policy backend).

The model sees a bundle's supporting chunks and its bridges and must reply with one JSON object,
`{"question", "answer", "clues", "quotes": {chunk_id: [verbatim sentences]}}`. Its quotes are its extraction step;
whether they hold is decided by code (`workers.search.synth_steps.verify_candidate`), never by the model, and which
chunks contain the answer is always recomputed from the text. A reply that is not such an object is kept as a proposal
with `error` set, so the pipeline drops and counts it (`generator_output_unparsable`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from workers.models import BackendKind, PolicyBackend, SamplingParams, make_backend
from workers.search.synth_steps import Bundle, Extraction, Proposal, answer_chunks

LLM_GENERATOR = "llm/v1"
PASSAGE_CHARS = 600  # per supporting chunk: five passages and the instructions stay well inside 2k tokens
REPLY_START = '{"question": "'

SYSTEM_PROMPT = (
    "You write multi-hop search questions from documentation passages. The question must need every passage to "
    "answer, must not contain the answer, and the answer must be a short name or phrase copied from a passage. "
    "Reply with one JSON object and nothing else."
)


def bundle_prompt(bundle: Bundle, passage_chars: int = PASSAGE_CHARS) -> str:
    """The user message for one bundle: the passages with their ids (each cut to `passage_chars` characters), the
    bridges, and the reply format."""
    lines = ["Passages:"]
    for chunk in bundle.chunks:
        text = " ".join(chunk.text.split())[:passage_chars]
        lines.append(f"[{chunk.chunk_id}] {text}")
    lines.append("")
    lines.append("How they connect:")
    for hop, mention in enumerate(bundle.bridges):
        lines.append(
            f"- passage [{bundle.chunks[hop].chunk_id}] mentions {mention.surface!r}, which passage "
            f"[{bundle.chunks[hop + 1].chunk_id}] documents."
        )
    example = {
        "question": "...",
        "answer": "...",
        "clues": ["...", "..."],
        "quotes": {c.chunk_id: ["a sentence copied exactly from this passage"] for c in bundle.chunks},
    }
    lines.append("")
    lines.append(
        "Write one question that needs all passages. Give clues (one per passage, describing it without naming the "
        "answer), the answer, and for every passage at least one sentence copied exactly from it. Reply with JSON "
        "in this shape:"
    )
    lines.append(json.dumps(example, ensure_ascii=False))
    return "\n".join(lines)


def parse_reply(text: str) -> Proposal:
    """A proposal from the model's reply; `error` names what is wrong when the reply is not the expected JSON."""
    raw = text.strip()
    start = raw.find("{")
    if start < 0:
        return Proposal(error="the reply holds no JSON object", raw=raw)
    try:
        value, _ = json.JSONDecoder().raw_decode(raw[start:])
    except json.JSONDecodeError as exc:
        return Proposal(error=f"the reply is not valid JSON ({exc.msg} at character {exc.pos})", raw=raw)
    if not isinstance(value, dict):
        return Proposal(error="the reply's JSON is not an object", raw=raw)
    problems: list[str] = []
    question, answer, clues, quotes = (value.get(k) for k in ("question", "answer", "clues", "quotes"))
    if not isinstance(question, str) or not question.strip():
        problems.append("question must be a non-empty string")
    if not isinstance(answer, str) or not answer.strip():
        problems.append("answer must be a non-empty string")
    if not isinstance(clues, list) or not all(isinstance(c, str) for c in clues):
        problems.append("clues must be a list of strings")
    if not isinstance(quotes, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(q, str) for q in v) for k, v in quotes.items()
    ):
        problems.append("quotes must map chunk ids to lists of strings")
    if problems:
        return Proposal(error="; ".join(problems), raw=raw)
    assert isinstance(question, str) and isinstance(answer, str) and isinstance(clues, list)
    assert isinstance(quotes, dict)
    return Proposal(
        question=question.strip(),
        answer=answer.strip(),
        clues=[c.strip() for c in clues if c.strip()],
        quotes={k: [q for q in v if q.strip()] for k, v in quotes.items()},
        raw=raw,
    )


class LLMGenerator:
    """Proposals from a policy backend, one batched greedy `generate` call per batch of bundles (greedy, so the
    same weights give the same tasks).

    The assistant's reply is started for the model with `REPLY_START` (the opening of the JSON object): small models
    asked for JSON otherwise tend to answer in prose ("Question: ... Output: ..."), and the start costs nothing to a
    model that would have written it anyway."""

    def __init__(
        self,
        backend: PolicyBackend,
        *,
        model_name: str,
        max_new_tokens: int = 384,
        passage_chars: int = PASSAGE_CHARS,
    ) -> None:
        self.backend = backend
        self.name = f"{LLM_GENERATOR}:{model_name}"
        self.sampling = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
        self.passage_chars = passage_chars

    def propose(self, bundles: Sequence[Bundle]) -> list[Proposal]:
        if not bundles:
            return []
        start = list(self.backend.tokenizer.encode(REPLY_START, add_special_tokens=False))
        prompts = [
            self.backend.encode_chat(
                [
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": bundle_prompt(b, self.passage_chars)},
                ]
            )
            + start
            for b in bundles
        ]
        generations = self.backend.generate(prompts, self.sampling)
        return [parse_reply(REPLY_START + g.text) for g in generations]

    def extract(self, bundle: Bundle, proposal: Proposal) -> Extraction:
        # The model's quotes are the extraction; the clues are free text (obfuscated clues need not quote), so there
        # are no clue quotes to check against the question.
        return Extraction(
            document_quotes={k: list(v) for k, v in proposal.quotes.items()},
            clue_quotes=[],
            contains_truth=answer_chunks(bundle, proposal.answer),
        )


def make_llm_generator(
    model: str, *, backend: BackendKind = "transformers", max_new_tokens: int = 384, passage_chars: int = PASSAGE_CHARS
) -> LLMGenerator:
    """An `LLMGenerator` on a built-in model name or a local model directory (see workers.models.registry)."""
    return LLMGenerator(
        make_backend(backend, model), model_name=model, max_new_tokens=max_new_tokens, passage_chars=passage_chars
    )
