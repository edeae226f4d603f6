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
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from workers.search.synth_corpus import (
    SynthCorpus,
    normalize,
    task_id_for,
)
from workers.search.synth_params import DROP_REASONS, SynthParams
from workers.search.synth_steps import (
    Bundle,
    Extraction,
    Proposal,
    TaskGenerator,
    Verdict,
    answer_chunks,
    find_distractors,
    gather_bundle,
    seed_chunks,
    verify_candidate,
)

EXAMPLES_PER_REASON = 3


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
    # One function on purpose: the generator's loop: candidates, verification, the stopping rule and the report share
    # its counters.
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
