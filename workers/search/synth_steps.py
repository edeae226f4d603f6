"""Task synthesis step by step (docs/methods.md section 3; `workers.search.synth` runs the loop): gather a candidate's
supporting chunks, generate clues, a question and an answer (`TemplateGenerator`, or any `TaskGenerator`), verify
the quotes by code, and find distractors that never contain the answer."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

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
)
from workers.search.synth_params import LABELS, DropReason, SynthParams
from workers.search.types import Chunk

_QUOTED = re.compile(f"{OPEN_QUOTE}([^{CLOSE_QUOTE}]+){CLOSE_QUOTE}")
TEMPLATE_GENERATOR = "template/v1"


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
