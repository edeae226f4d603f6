"""Synthetic multi-hop search tasks from a corpus (docs/methods.md section 3, "Synthetic data pipeline").

The pipeline, per candidate task:

1. **Gather** supporting chunks (`gather_bundle`): a seed chunk that mentions a name documented in another
   document (a bridge: in the stdlib corpus, `copystat()` in the section of `shutil.copy2` points at the chunk
   headed `## shutil.copystat(...)`; `os.path.join` in any module points at the module `os.path`), the chunk that
   documents it, and, when chaining, a name that chunk mentions in turn, up to `max_hops` bridges. The supporting
   chunks are `[c0, c1, ..., cn]`: chunk `c(i)` mentions bridge `i`, which chunk `c(i+1)` documents, all in
   different documents; the answer is the last bridge's name as `c(n-1)` writes it.
2. **Generate** clues, a question and an answer: a pluggable `TaskGenerator` (`TemplateGenerator`, deterministic
   and model-free; `workers.search.synth_llm.LLMGenerator` on any policy backend).
3. **Extract and verify** (`verify_candidate`): the generator's extraction step yields document quotes per
   supporting chunk, clue quotes and which chunks contain the answer; code then checks, after normalisation
   (lowercase, whitespace collapsed), that every quote appears verbatim in its chunk, that every supporting chunk
   has one, and that some supporting chunk contains the answer. Failures are dropped and counted by reason.
4. **Distractors** (`find_distractors`): BM25 (bm25s) hits for the clues outside the supporting documents that
   never contain the answer in any form.

`synthesize` runs the loop and returns task rows (the search environment's format, `task_row`) and a
verification report (candidates tried, kept, dropped by reason, per-hop counts, examples of drops).
"""

from __future__ import annotations

import json
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from workers.search.synth_corpus import (
    CLOSE_QUOTE,
    OPEN_QUOTE,
    WORD_PATTERN,
    Mention,
    SynthCorpus,
    contains_answer_any_form,
    mentions_name,
    normalize,
    quotable_sentences,
    task_id_for,
)
from workers.search.types import Chunk
from workers.search.wide import WideParams

TEMPLATE_GENERATOR = "template/v1"

# Why a candidate was dropped; the report counts every reason, zeros included, so two reports compare key by key.
DropReason = Literal[
    "generator_output_unparsable",
    "quote_for_unknown_chunk",
    "quote_not_verbatim",
    "no_quote_in_supporting_chunk",
    "clue_quote_not_in_question",
    "answer_in_no_chunk",
    "answer_in_question",
    "duplicate_question",
    "answer_repeated",
    "too_few_distractors",
]
DROP_REASONS: tuple[DropReason, ...] = get_args(DropReason)

_QUOTED = re.compile(f"{OPEN_QUOTE}([^{CLOSE_QUOTE}]+){CLOSE_QUOTE}")
EXAMPLES_PER_REASON = 3
LABELS = ("A", "B", "C", "D")


class SynthParams(BaseModel):
    """What a user chooses for one generation run (the datagen job spec adds its inputs and outputs)."""

    model_config = ConfigDict(extra="forbid")
    generator: Literal["template", "llm"] = "template"
    model: str = Field(
        default="smollm2-135m-instruct", description="generator=llm: a built-in model name or a model directory"
    )
    backend: Literal["transformers", "vllm"] = "transformers"
    num_tasks: int = Field(default=100, ge=1, le=100_000, description="tasks to keep")
    max_hops: int = Field(default=2, ge=1, le=len(LABELS), description="bridges per task: 1 is easy, more is hard")
    distractors: int = Field(default=10, ge=0, le=50, description="distractor chunks per task (at most)")
    min_distractors: int = Field(default=1, ge=0, le=50, description="fewer distractors than this drops the task")
    seed: int = Field(default=0, ge=0, lt=2**63)
    max_candidates: int = Field(default=0, ge=0, le=10_000_000, description="0: 10 x num_tasks + 50")
    max_per_answer: int = Field(
        default=0, ge=0, le=100_000, description="kept tasks sharing one answer, at most; 0: max(3, num_tasks / 50)"
    )
    batch_size: int = Field(default=8, ge=1, le=256, description="candidates per generator call")
    max_new_tokens: int = Field(default=384, ge=16, le=4096, description="generator=llm: reply length limit")
    shape: Literal["multi_hop", "wide"] = Field(
        default="multi_hop",
        description="multi_hop: deep questions joined by bridges (Context-1); wide: tables of N items x M attributes "
        "(WideSearch, for the agent swarm; workers.search.wide, template generator only)",
    )
    wide_columns: list[str] = Field(
        default_factory=lambda: ["document", "kind", "first_parameter"],
        min_length=1,
        description="shape=wide: the attribute columns besides name (document, kind, parameters, first_parameter, "
        "added_in), comma-separated in the form",
    )
    wide_style: Literal["listed", "document"] = Field(
        default="listed",
        description="shape=wide: listed names the items; document asks for every item one document documents",
    )
    wide_min_rows: int = Field(default=3, ge=1, le=100, description="shape=wide: items (rows) per task, at least")
    wide_max_rows: int = Field(default=6, ge=1, le=100, description="shape=wide: items (rows) per task, at most")

    @field_validator("wide_columns", mode="before")
    @classmethod
    def _columns_from_text(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @model_validator(mode="after")
    def _wide_fits(self) -> SynthParams:
        if self.shape == "wide":
            if self.generator != "template":
                raise ValueError("shape 'wide' is generated by code only: set generator to 'template'")
            from pydantic import ValidationError

            try:
                self.wide_params()
            except ValidationError as exc:
                problem = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
                problem = problem.replace("columns:", "wide_columns:").replace("max_rows", "wide_max_rows")
                raise ValueError(problem.replace("min_rows", "wide_min_rows")) from None
        return self

    def wide_params(self) -> Any:
        """The wide generator's parameters (`workers.search.wide.WideParams`)."""
        return WideParams(
            num_tasks=min(self.num_tasks, 10_000),
            min_rows=self.wide_min_rows,
            max_rows=self.wide_max_rows,
            columns=self.wide_columns,
            style=self.wide_style,
            seed=self.seed,
        )

    @field_validator("min_distractors")
    @classmethod
    def _min_within_target(cls, value: int, info: ValidationInfo) -> int:
        target = info.data.get("distractors")
        if isinstance(target, int) and value > target:
            raise ValueError(
                f"min_distractors ({value}) is more than distractors ({target}); lower it or raise distractors"
            )
        return value

    @property
    def candidate_limit(self) -> int:
        return self.max_candidates or 10 * self.num_tasks + 50

    @property
    def answer_limit(self) -> int:
        # Hub names (`sys`, `ValueError`) end many chains; a cap keeps them from dominating the answers.
        return self.max_per_answer or max(3, -(-self.num_tasks // 50))


# --- step 1: gather supporting chunks --------------------------------------------------------------------------
@dataclass(frozen=True)
class Bundle:
    """Supporting chunks of one candidate. `chunks[i]` mentions `bridges[i]`, and `chunks[i + 1]` documents it (the
    chunk the name's heading is in, or a chunk of the document the name titles); so `len(chunks) ==
    len(bridges) + 1`, `hops == len(bridges)`, and every chunk is from a different document."""

    index: int
    chunks: tuple[Chunk, ...]
    bridges: tuple[Mention, ...]

    @property
    def hops(self) -> int:
        return len(self.bridges)

    @property
    def answer_name(self) -> str:
        return self.bridges[-1].surface

    @property
    def chunk_ids(self) -> list[str]:
        return [c.chunk_id for c in self.chunks]


def seed_chunks(corpus: SynthCorpus, params: SynthParams) -> dict[int, list[int]]:
    """Seed chunks per hop target: chunks with a sentence to quote whose chains can reach that many hops (by
    `SynthCorpus.chain_depths`), each list in a seeded shuffled order. Targets no chain reaches are left out."""
    depths = corpus.chain_depths(params.max_hops)
    seeds: dict[int, list[int]] = {}
    for hops in range(1, params.max_hops + 1):
        chosen = [i for i, depth in enumerate(depths) if depth >= hops and corpus.quotable[i]]
        random.Random(f"synth-seeds:{params.seed}:{hops}").shuffle(chosen)
        if chosen:
            seeds[hops] = chosen
    return seeds


def gather_bundle(
    corpus: SynthCorpus,
    seeds: dict[int, list[int]],
    index: int,
    params: SynthParams,
    avoid_answers: frozenset[str] = frozenset(),
) -> Bundle:
    """Candidate `index`: a seed chunk, then a chain of bridges toward its hop target (1 to `max_hops` in turn, among
    the targets some chain reaches), found by a bounded depth-first search; the longest chain found when none
    reaches the target. A last bridge whose normalised name is in `avoid_answers` is tried last. Deterministic in
    (corpus, index, params, avoid_answers)."""
    targets = sorted(seeds)
    target_hops = targets[index % len(targets)]
    pool = seeds[target_hops]
    turn = index // len(targets)
    seed = pool[turn % len(pool)]
    # Each lap over a pool shifts the first bridge, so later laps try new chains instead of repeating earlier ones
    # (which would only be dropped as duplicates).
    lap = turn // len(pool)
    rng = random.Random(f"synth-bundle:{params.seed}:{index}")
    visited = {corpus.chunks[seed].doc_id}
    path = _walk(corpus, seed, visited, target_hops, rng, [CHAIN_SEARCH_BUDGET], lap, avoid_answers)
    return Bundle(
        index=index,
        chunks=(corpus.chunks[seed], *(corpus.chunks[i] for _, i in path)),
        bridges=tuple(m for m, _ in path),
    )


CHAIN_SEARCH_BUDGET = 64  # bridges tried per candidate: enough to find 4-hop chains where they exist, still cheap


def _walk(
    corpus: SynthCorpus,
    current: int,
    visited: frozenset[str] | set[str],
    hops_left: int,
    rng: random.Random,
    budget: list[int],
    shift: int = 0,
    avoid_answers: frozenset[str] = frozenset(),
) -> list[tuple[Mention, int]]:
    """The longest chain of (bridge, chunk documenting it) from chunk `current`, at most `hops_left` long, through
    documents outside `visited`; stops at the first chain of full length or when `budget` runs out."""
    best: list[tuple[Mention, int]] = []
    options = [m for m in corpus.mentions[current] if m.doc_id not in visited]
    # A target without a sentence to quote makes the candidate certain to be dropped: such targets are used only
    # when nothing else is left, so that every bundle has at least one bridge.
    options = [m for m in options if _target_quotable(corpus, m)] or options
    options = _ordered_options(corpus, options, rng)
    if shift and options:
        options = options[shift % len(options) :] + options[: shift % len(options)]
    if hops_left == 1 and avoid_answers:
        options.sort(key=lambda m: normalize(m.surface) in avoid_answers)
    for mention in options:
        if budget[0] <= 0:
            break
        budget[0] -= 1
        seen = set(visited) | {mention.doc_id}
        for chunk in _documenting_chunks(corpus, mention, seen, hops_left > 1, rng):
            path = [(mention, chunk)]
            if hops_left > 1:
                path += _walk(corpus, chunk, seen, hops_left - 1, rng, budget, 0, avoid_answers)
            if len(path) > len(best):
                best = path
            if len(best) == hops_left or budget[0] <= 0:
                return best
    return best


def _ordered_options(corpus: SynthCorpus, options: list[Mention], rng: random.Random) -> list[Mention]:
    # Hubs last, in a seeded random order otherwise.
    shuffled = list(options)
    rng.shuffle(shuffled)
    return sorted(shuffled, key=lambda m: corpus.mention_count[m.target] > corpus.hub_limit)


def _target_quotable(corpus: SynthCorpus, mention: Mention) -> bool:
    chunk = mention.target.chunk
    return corpus.quotable[chunk] if chunk is not None else corpus.doc_quotable[mention.doc_id]


def _documenting_chunks(
    corpus: SynthCorpus, mention: Mention, visited: set[str], onward: bool, rng: random.Random
) -> list[int]:
    """Chunks that can stand for `mention`'s documentation, best first: the chunk its heading is in; for a
    document, the chunks that mention further documents (when the chain goes on) and then its describing chunk."""
    if mention.target.chunk is not None:
        return [mention.target.chunk]
    members = corpus.doc_chunks[mention.doc_id]
    # The earliest chunk with a sentence long enough to quote: in docstrings and articles the opening is the
    # summary, the most distinctive text; a one-line opening ("Return a new list.") is not worth a clue.
    describing = next((i for i in members if corpus.quotable[i]), members[0])
    if not onward:
        return [describing]
    going_on = [i for i in members if corpus.quotable[i] and any(m.doc_id not in visited for m in corpus.mentions[i])]
    rng.shuffle(going_on)
    return [*going_on[:3], describing] if describing not in going_on[:3] else going_on[:3]


# --- step 2: generators ----------------------------------------------------------------------------------------
@dataclass
class Proposal:
    """What a generator made of one bundle. `error` set means its output could not be parsed (then the rest is
    empty and `raw` holds the start of the output for the report)."""

    question: str = ""
    answer: str = ""
    clues: list[str] = field(default_factory=list)
    quotes: dict[str, list[str]] = field(default_factory=dict)
    error: str = ""
    raw: str = ""


@dataclass
class Extraction:
    """Step 3's input: quotes per supporting chunk (`document_quotes`), the quotes found in the clues
    (`clue_quotes`) and the supporting chunks that contain the answer (`contains_truth`, always computed by code)."""

    document_quotes: dict[str, list[str]]
    clue_quotes: list[str]
    contains_truth: list[str]


class TaskGenerator(Protocol):
    """The pluggable step: clues, a question and an answer for each bundle, then the extraction for verification."""

    name: str

    def propose(self, bundles: Sequence[Bundle]) -> list[Proposal]:
        """One proposal per bundle, same order."""
        ...

    def extract(self, bundle: Bundle, proposal: Proposal) -> Extraction:
        """Quotes per supporting chunk and clue quotes, as this generator's extraction step yields them."""
        ...


def answer_chunks(bundle: Bundle, answer: str) -> list[str]:
    """`contains_truth`: supporting chunks whose normalised text contains the normalised answer."""
    needle = normalize(answer)
    return [c.chunk_id for c in bundle.chunks if needle and needle in normalize(c.text)]


def extract_quotes_by_code(bundle: Bundle, proposal: Proposal) -> Extraction:
    """Extraction done by code: the quoted spans of the clues, each assigned to the supporting chunks whose
    normalised text contains it. A clue quote found in no chunk stays in `clue_quotes` (verification drops it)."""
    clue_quotes = [q for clue in proposal.clues for q in _QUOTED.findall(clue)]
    document_quotes: dict[str, list[str]] = {c.chunk_id: [] for c in bundle.chunks}
    for chunk in bundle.chunks:
        text = normalize(chunk.text)
        document_quotes[chunk.chunk_id] = [q for q in clue_quotes if normalize(q) in text]
    return Extraction(
        document_quotes=document_quotes,
        clue_quotes=clue_quotes,
        contains_truth=answer_chunks(bundle, proposal.answer),
    )


class TemplateGenerator:
    """`template/v1`: deterministic and model-free. The question walks the bridges with one verbatim quote per
    supporting chunk, and the answer is the last bridge name as the chunk before it writes it:

        A passage says "<q0>". It mentions a name, A, whose own documentation says "<q1>". What is A? ...

    Quotes are the most distinctive sentence (by IDF) of their chunk that names no bridge and occurs in no other
    chunk; a chunk without such a sentence gets a clue without a quote, which verification then drops."""

    name = TEMPLATE_GENERATOR

    def __init__(self, corpus: SynthCorpus) -> None:
        self.corpus = corpus

    def propose(self, bundles: Sequence[Bundle]) -> list[Proposal]:
        return [self._propose_one(b) for b in bundles]

    def extract(self, bundle: Bundle, proposal: Proposal) -> Extraction:
        return extract_quotes_by_code(bundle, proposal)

    def _propose_one(self, bundle: Bundle) -> Proposal:
        forbidden = _bridge_names(self.corpus, bundle)
        quotes = [pick_quote(self.corpus, self.corpus.index_of[c.chunk_id], forbidden) for c in bundle.chunks]
        clues = [f"A passage says {_quoted(quotes[0])}." if quotes[0] else "A passage exists."]
        for hop in range(1, bundle.hops + 1):
            label = LABELS[hop - 1]
            subject = "It" if hop == 1 else "That documentation"
            described = (
                f"whose own documentation says {_quoted(quotes[hop])}"
                if quotes[hop]
                else "which has its own documentation"
            )
            clues.append(f"{subject} mentions a name, {label}, {described}.")
        last = LABELS[bundle.hops - 1]
        where = "the passage" if bundle.hops == 1 else f"{LABELS[bundle.hops - 2]}'s documentation"
        question = " ".join(clues) + f" What is {last}? Answer with the name exactly as {where} writes it."
        return Proposal(question=question, answer=bundle.answer_name, clues=clues)


def _quoted(text: str | None) -> str:
    return f"{OPEN_QUOTE}{text}{CLOSE_QUOTE}"


def _bridge_names(corpus: SynthCorpus, bundle: Bundle) -> list[str]:
    """Every form of every bridge name (as written, its full name, its last component): no quote may hold one, or
    the question would give away an answer or a step."""
    names: set[str] = set()
    for mention in bundle.bridges:
        full = corpus.entity_names.get(mention.target, mention.surface)
        names.update({mention.surface, full, full.rsplit(".", 1)[-1], mention.surface.rsplit(".", 1)[-1]})
    return sorted(n for n in names if len(n) >= 3)


def pick_quote(corpus: SynthCorpus, index: int, forbidden: Sequence[str]) -> str | None:
    """The chunk's most distinctive quotable span: a sentence (its first `QUOTE_MAX_WORDS` words) of at least
    `QUOTE_MIN_WORDS` words with three content words, naming nothing in `forbidden` (as a word) and occurring
    in no other chunk. Highest summed IDF wins; ties go to the earlier sentence. None when nothing qualifies."""
    candidates: list[tuple[float, int, str]] = []
    for order, quote in enumerate(quotable_sentences(corpus.chunks[index].text)):
        if corpus.sentence_count[normalize(quote)] > 1 or any(mentions_name(quote, name) for name in forbidden):
            continue
        score = sum(corpus.idf.get(w, 0.0) for w in set(WORD_PATTERN.findall(normalize(quote))))
        candidates.append((-score, order, quote))
    for _, _, quote in sorted(candidates)[:5]:
        if corpus.quote_is_unique(quote, index):
            return quote
    return None


# --- step 3: verify --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    reason: DropReason | None
    detail: str = ""


def verify_candidate(bundle: Bundle, proposal: Proposal, extraction: Extraction) -> Verdict:
    """docs/methods.md section 3, step 3, as code: every document quote verbatim in its chunk after normalisation, every
    supporting chunk with at least one, every clue quote in the question, and the answer in a supporting chunk
    (recomputed from the text; a generator's own claim is never trusted) and not given away by the question."""
    if proposal.error:
        return Verdict("generator_output_unparsable", proposal.error)
    by_id = {c.chunk_id: c for c in bundle.chunks}
    unknown = sorted(set(extraction.document_quotes) - set(by_id))
    if unknown:
        return Verdict("quote_for_unknown_chunk", f"quotes name {unknown[0]!r}, not a supporting chunk")
    for chunk_id, quotes in extraction.document_quotes.items():
        text = normalize(by_id[chunk_id].text)
        for quote in quotes:
            if not normalize(quote) or normalize(quote) not in text:
                return Verdict("quote_not_verbatim", f"{quote[:80]!r} is not in {chunk_id}")
    found_anywhere = {normalize(q) for quotes in extraction.document_quotes.values() for q in quotes}
    for quote in extraction.clue_quotes:
        if normalize(quote) not in found_anywhere:
            return Verdict("quote_not_verbatim", f"clue quote {quote[:80]!r} is in no supporting chunk")
    for chunk in bundle.chunks:
        if not extraction.document_quotes.get(chunk.chunk_id):
            return Verdict("no_quote_in_supporting_chunk", f"no quote matches {chunk.chunk_id}")
    question = normalize(proposal.question)
    for quote in extraction.clue_quotes:
        if normalize(quote) not in question:
            return Verdict("clue_quote_not_in_question", f"{quote[:80]!r} is not in the question")
    truth = answer_chunks(bundle, proposal.answer)
    if not truth:
        return Verdict("answer_in_no_chunk", f"{proposal.answer[:80]!r} is in none of {bundle.chunk_ids}")
    if mentions_name(proposal.question, proposal.answer):
        return Verdict("answer_in_question", f"the question contains {proposal.answer[:80]!r}")
    return Verdict(None)


# --- step 4: distractors ---------------------------------------------------------------------------------------
def find_distractors(
    corpus: SynthCorpus, bundle: Bundle, answer: str, queries: Sequence[str], count: int
) -> tuple[list[str], int]:
    """Up to `count` chunk ids that match some clue (BM25 score > 0 for one of `queries`, taken round-robin so
    several clues are represented) outside the supporting documents, and never contain `answer` in any form.
    Returns the ids and how many hits were refused for containing the answer."""
    if count <= 0 or not queries:
        return [], 0
    gold_docs = {c.doc_id for c in bundle.chunks}
    depth = min(len(corpus.chunks), count * 3 + 10)
    ranked = corpus.search(list(queries), k=depth)
    chosen: list[str] = []
    seen: set[int] = set()
    refused = 0
    for rank in range(depth):
        for hits in ranked:
            if rank >= len(hits) or len(chosen) >= count:
                continue
            index = hits[rank][0]
            if index in seen:
                continue
            seen.add(index)
            chunk = corpus.chunks[index]
            if chunk.doc_id in gold_docs:
                continue
            if contains_answer_any_form(chunk.text, answer):
                refused += 1
                continue
            chosen.append(chunk.chunk_id)
    return chosen, refused


# --- the loop --------------------------------------------------------------------------------------------------
def task_row(
    *,
    bundle: Bundle,
    proposal: Proposal,
    extraction: Extraction,
    distractors: list[str],
    generator: str,
    corpus_label: str,
    corpus_hash: str,
    seed: int,
) -> dict[str, Any]:
    """The task row the search environment reads (these keys exactly)."""
    gold = bundle.chunk_ids
    return {
        "id": task_id_for(proposal.question, proposal.answer, gold),
        "prompt": proposal.question,
        "answer": proposal.answer,
        "gold_chunk_ids": gold,
        "answer_chunk_ids": answer_chunks(bundle, proposal.answer),
        "distractor_chunk_ids": distractors,
        "clues": list(proposal.clues),
        "hops": bundle.hops,
        "difficulty": "easy" if bundle.hops <= 1 else "hard",
        "provenance": {
            "generator": generator,
            "corpus": corpus_label,
            "corpus_hash": corpus_hash,
            "seed": seed,
            "quotes": {cid: list(qs) for cid, qs in extraction.document_quotes.items()},
        },
    }


@dataclass
class SynthResult:
    tasks: list[dict[str, Any]]
    report: dict[str, Any]


class _Report:
    def __init__(self, *, generator: str, params: SynthParams, corpus_label: str, corpus_hash: str) -> None:
        self.generator = generator
        self.params = params
        self.corpus_label = corpus_label
        self.corpus_hash = corpus_hash
        self.tried = 0
        self.kept = 0
        self.dropped: dict[str, int] = dict.fromkeys(DROP_REASONS, 0)
        self.per_hop: dict[str, dict[str, int]] = {
            str(h): {"tried": 0, "kept": 0} for h in range(1, params.max_hops + 1)
        }
        self.examples: list[dict[str, Any]] = []
        self.distractor_counts: list[int] = []
        self.distractor_hits_with_answer = 0

    def tried_one(self, bundle: Bundle) -> None:
        self.tried += 1
        self.per_hop[str(bundle.hops)]["tried"] += 1

    def kept_one(self, bundle: Bundle, distractors: int) -> None:
        self.kept += 1
        self.per_hop[str(bundle.hops)]["kept"] += 1
        self.distractor_counts.append(distractors)

    def dropped_one(self, bundle: Bundle, proposal: Proposal, verdict: Verdict) -> None:
        assert verdict.reason is not None
        self.dropped[verdict.reason] += 1
        if sum(1 for e in self.examples if e["reason"] == verdict.reason) < EXAMPLES_PER_REASON:
            example: dict[str, Any] = {
                "reason": verdict.reason,
                "detail": verdict.detail,
                "hops": bundle.hops,
                "chunk_ids": bundle.chunk_ids,
                "question": proposal.question[:500],
                "answer": proposal.answer[:200],
                "raw": proposal.raw[:300],
            }
            self.examples.append(example)

    def to_json(self, *, seeds: dict[int, list[int]], chunks: int, seconds: float) -> dict[str, Any]:
        counts = self.distractor_counts
        return {
            "generator": self.generator,
            "corpus": self.corpus_label,
            "corpus_hash": self.corpus_hash,
            "params": self.params.model_dump(mode="json"),
            "target": self.params.num_tasks,
            "corpus_chunks": chunks,
            # Seed chunks whose chains can reach each hop count (an upper bound, see SynthCorpus.chain_depths).
            "seed_chunks": {str(h): len(seeds.get(h, [])) for h in range(1, self.params.max_hops + 1)},
            "candidates": self.tried,
            "kept": self.kept,
            "dropped": dict(self.dropped),
            "dropped_total": sum(self.dropped.values()),
            "per_hop": self.per_hop,
            "distractors": {
                "mean": round(sum(counts) / len(counts), 3) if counts else 0.0,
                "min": min(counts) if counts else 0,
                "hits_refused_for_containing_the_answer": self.distractor_hits_with_answer,
            },
            "examples": self.examples,
            "seconds": round(seconds, 3),
        }


ProgressCallback = Callable[[int, int], None]


def synthesize(
    corpus: SynthCorpus,
    params: SynthParams,
    generator: TaskGenerator,
    *,
    corpus_label: str = "",
    corpus_hash: str = "",
    on_progress: ProgressCallback | None = None,
) -> SynthResult:
    """Generate up to `params.num_tasks` verified tasks, trying at most `params.candidate_limit` candidates, and
    stopping early once the corpus looks exhausted (no task kept in the last `patience` candidates: a lap over
    every seed, and at least 200). The report's `stopped` says which.

    `on_progress(kept, tried)` is called after each generator batch. The same corpus, params and a deterministic
    generator give the same tasks and report (apart from `seconds`)."""
    started = time.monotonic()
    report = _Report(generator=generator.name, params=params, corpus_label=corpus_label, corpus_hash=corpus_hash)
    seeds = seed_chunks(corpus, params)
    state = _LoopState()
    limit = params.candidate_limit if seeds else 0
    patience = max(200, sum(len(pool) for pool in seeds.values()))
    stopped = "target reached"
    index = 0
    while len(state.tasks) < params.num_tasks:
        if index >= limit:
            stopped = "candidate limit" if seeds else "no seed chunks: no name in the corpus bridges two documents"
            break
        if report.tried - state.last_kept_at >= patience:
            stopped = f"corpus exhausted: no task kept in the last {patience} candidates"
            break
        # Answers at their cap are steered away from (`answer_repeated` would drop them anyway).
        full = frozenset(a for a, n in state.answers.items() if n >= params.answer_limit)
        end = min(limit, index + params.batch_size)
        batch = [gather_bundle(corpus, seeds, i, params, full) for i in range(index, end)]
        index = end
        proposals = generator.propose(batch)
        if len(proposals) != len(batch):
            raise RuntimeError(f"generator {generator.name} returned {len(proposals)} proposals for {len(batch)}")
        for bundle, proposal in zip(batch, proposals, strict=True):
            if len(state.tasks) >= params.num_tasks:
                break
            report.tried_one(bundle)
            verdict, extraction, distractors = _judge(corpus, params, generator, bundle, proposal, state, report)
            if verdict.reason is not None:
                report.dropped_one(bundle, proposal, verdict)
                continue
            state.keep(proposal, report.tried)
            state.tasks.append(
                task_row(
                    bundle=bundle,
                    proposal=proposal,
                    extraction=extraction,
                    distractors=distractors,
                    generator=generator.name,
                    corpus_label=corpus_label,
                    corpus_hash=corpus_hash,
                    seed=params.seed,
                )
            )
            report.kept_one(bundle, len(distractors))
        if on_progress is not None:
            on_progress(len(state.tasks), report.tried)
    out = report.to_json(seeds=seeds, chunks=len(corpus.chunks), seconds=time.monotonic() - started)
    out["stopped"] = stopped
    return SynthResult(tasks=state.tasks, report=out)


@dataclass
class _LoopState:
    tasks: list[dict[str, Any]] = field(default_factory=list)
    questions: set[str] = field(default_factory=set)
    answers: Counter[str] = field(default_factory=Counter)
    last_kept_at: int = 0

    def keep(self, proposal: Proposal, tried: int) -> None:
        self.questions.add(normalize(proposal.question))
        self.answers[normalize(proposal.answer)] += 1
        self.last_kept_at = tried


def _judge(
    corpus: SynthCorpus,
    params: SynthParams,
    generator: TaskGenerator,
    bundle: Bundle,
    proposal: Proposal,
    state: _LoopState,
    report: _Report,
) -> tuple[Verdict, Extraction, list[str]]:
    """Extraction, verification, the dataset-level checks (duplicates, repeated answers), then distractors."""
    extraction = generator.extract(bundle, proposal) if not proposal.error else Extraction({}, [], [])
    verdict = verify_candidate(bundle, proposal, extraction)
    if verdict.reason is None and normalize(proposal.question) in state.questions:
        verdict = Verdict("duplicate_question", "an earlier kept task asks the same question")
    if verdict.reason is None and state.answers[normalize(proposal.answer)] >= params.answer_limit:
        verdict = Verdict("answer_repeated", f"{params.answer_limit} kept tasks already answer it")
    if verdict.reason is not None:
        return verdict, extraction, []
    queries = extraction.clue_quotes or proposal.clues
    distractors, refused = find_distractors(corpus, bundle, proposal.answer, queries, params.distractors)
    report.distractor_hits_with_answer += refused
    if len(distractors) < params.min_distractors:
        needed = params.min_distractors
        return Verdict("too_few_distractors", f"{len(distractors)} found, at least {needed} needed"), extraction, []
    return verdict, extraction, distractors


def dump_tasks_jsonl(tasks: Iterable[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(t, ensure_ascii=False, sort_keys=False).encode() + b"\n" for t in tasks)
