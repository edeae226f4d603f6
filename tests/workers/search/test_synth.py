"""The synthetic task pipeline (workers.search.synth): gathering, the template and LLM generators, verification by
extraction, distractors, chaining, the report, and the datagen job's file outputs."""

from __future__ import annotations

import functools
import importlib
import inspect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from workers.search.synth import synthesize
from workers.search.synth_corpus import SynthCorpus, contains_answer_any_form, mentions_name, normalize
from workers.search.synth_llm import REPLY_START, LLMGenerator, bundle_prompt, parse_reply
from workers.search.synth_params import DROP_REASONS, SynthParams
from workers.search.synth_steps import (
    Bundle,
    Extraction,
    Proposal,
    TemplateGenerator,
    extract_quotes_by_code,
    find_distractors,
    gather_bundle,
    seed_chunks,
    verify_candidate,
)
from workers.search.types import Chunk, chunk_id_for, dump_chunks_jsonl

ROW_KEYS = {
    "id",
    "prompt",
    "answer",
    "gold_chunk_ids",
    "answer_chunk_ids",
    "distractor_chunk_ids",
    "clues",
    "hops",
    "difficulty",
    "provenance",
}


# --- corpora built from real text ------------------------------------------------------------------------------
def _doc(obj: object) -> str:
    raw = getattr(obj, "__doc__", None)
    return inspect.cleandoc(raw) if isinstance(raw, str) and raw.strip() else ""


@functools.cache
def stdlib_chunks() -> tuple[Chunk, ...]:
    """The demo corpus (Python's own documentation, chunked with the default chunker): thousands of chunks."""
    from workers.search.corpus import build_corpus
    from workers.search.stdlib_corpus import stdlib_documents

    chunks, _ = build_corpus(stdlib_documents())
    return tuple(chunks)


def doc(doc_id: str, *texts: str, title: str = "Notes") -> list[Chunk]:
    return [
        Chunk(chunk_id=chunk_id_for(doc_id, i), doc_id=doc_id, position=i, text=t, title=title)
        for i, t in enumerate(texts)
    ]


# Prose from real module docstrings (no headings, a title that names nothing): background for the crafted corpora.
FILLER = [
    chunk
    for name in ("heapq", "statistics", "difflib")
    for chunk in doc(f"filler:{name}", *[p for p in _doc(importlib.import_module(name)).split("\n\n") if p.strip()])
]


@pytest.fixture(scope="module")
def corpus() -> SynthCorpus:
    return SynthCorpus(stdlib_chunks())


def _without_timing(report: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in report.items() if k != "seconds"}


# --- the template generator ------------------------------------------------------------------------------------
def test_the_template_generator_gives_the_same_tasks_for_the_same_corpus_and_seed(corpus: SynthCorpus) -> None:
    params = SynthParams(num_tasks=25, max_hops=2, seed=7)
    first = synthesize(corpus, params, TemplateGenerator(corpus), corpus_label="stdlib@v1", corpus_hash="abc")
    rebuilt = SynthCorpus(stdlib_chunks())
    again = synthesize(rebuilt, params, TemplateGenerator(rebuilt), corpus_label="stdlib@v1", corpus_hash="abc")
    assert len(first.tasks) == 25
    assert first.tasks == again.tasks
    assert _without_timing(first.report) == _without_timing(again.report)
    other = synthesize(corpus, params.model_copy(update={"seed": 8}), TemplateGenerator(corpus))
    assert [t["id"] for t in other.tasks] != [t["id"] for t in first.tasks]


def test_every_kept_task_passes_verification(corpus: SynthCorpus) -> None:
    params = SynthParams(num_tasks=40, max_hops=3, distractors=10, seed=1)
    result = synthesize(corpus, params, TemplateGenerator(corpus), corpus_label="stdlib@v1", corpus_hash="abc")
    assert len(result.tasks) == 40
    for task in result.tasks:
        assert set(task) == ROW_KEYS
        gold = [corpus.chunk(cid) for cid in task["gold_chunk_ids"]]
        assert task["hops"] == len(gold) - 1 >= 1
        assert len({c.doc_id for c in gold}) == len(gold), "every hop crosses to another document"
        assert task["difficulty"] == ("easy" if task["hops"] == 1 else "hard")
        assert task["id"].startswith("synth-")
        provenance = task["provenance"]
        assert provenance["generator"] == "template/v1" and provenance["corpus"] == "stdlib@v1"
        assert provenance["seed"] == 1 and provenance["corpus_hash"] == "abc"
        # Every supporting chunk has a quote, and every quote is verbatim (normalised) in its chunk and the prompt.
        assert set(provenance["quotes"]) == set(task["gold_chunk_ids"])
        for chunk in gold:
            quotes = provenance["quotes"][chunk.chunk_id]
            assert quotes
            for quote in quotes:
                assert normalize(quote) in normalize(chunk.text)
                assert normalize(quote) in normalize(task["prompt"])
        # The answer is in every answer chunk, they are supporting chunks, and the prompt does not give it away.
        assert task["answer_chunk_ids"] and set(task["answer_chunk_ids"]) <= set(task["gold_chunk_ids"])
        for cid in task["answer_chunk_ids"]:
            assert normalize(task["answer"]) in normalize(corpus.chunk(cid).text)
        assert task["gold_chunk_ids"][-2] in task["answer_chunk_ids"], "the chunk before the last writes the answer"
        assert not mentions_name(task["prompt"], task["answer"])
        # Distractors: real chunks outside the supporting documents that never hold the answer in any form.
        assert 1 <= len(task["distractor_chunk_ids"]) <= 10
        for cid in task["distractor_chunk_ids"]:
            chunk = corpus.chunk(cid)
            assert chunk.doc_id not in {c.doc_id for c in gold}
            assert not contains_answer_any_form(chunk.text, task["answer"])
    report = result.report
    assert report["kept"] == 40 and report["candidates"] == 40 + report["dropped_total"]
    assert set(report["dropped"]) == set(DROP_REASONS)
    assert sum(h["tried"] for h in report["per_hop"].values()) == report["candidates"]
    assert sum(h["kept"] for h in report["per_hop"].values()) == 40
    assert len({t["prompt"] for t in result.tasks}) == 40


FINANCE = (
    "At quarter end the accountants run merge_ledgers(). The auditors arrive on site the following Monday morning."
)
LEDGER = "## merge_ledgers()\nCombines the branch books into one consolidated statement per currency."


def test_a_supporting_chunk_without_a_quotable_sentence_is_dropped_and_counted() -> None:
    # Two bridges: `relay_snapshot` is documented by a chunk whose only sentence names it (quoting it would give
    # the answer away), `merge_ledgers` by a chunk with a proper sentence.
    chunks = [
        *doc("kb:ops", "Nightly the operator calls relay_snapshot(). It copies the state of every regional cluster."),
        *doc("kb:finance", FINANCE),
        *doc(
            "kb:relay", "## relay_snapshot()\nThe relay_snapshot routine sends relay_snapshot data to relay_snapshot."
        ),
        *doc("kb:ledger", LEDGER),
        *FILLER,
    ]
    corpus = SynthCorpus(chunks)
    params = SynthParams(num_tasks=5, max_hops=1, max_candidates=2, distractors=3, min_distractors=0)
    result = synthesize(corpus, params, TemplateGenerator(corpus))
    assert result.report["candidates"] == 2 and result.report["kept"] == 1
    assert result.report["dropped"]["no_quote_in_supporting_chunk"] == 1
    assert sum(result.report["dropped"].values()) == 1
    (example,) = result.report["examples"]
    assert example["reason"] == "no_quote_in_supporting_chunk" and "kb:relay#0" in example["detail"]
    (task,) = result.tasks
    assert task["answer"] == "merge_ledgers" and task["gold_chunk_ids"] == ["kb:finance#0", "kb:ledger#0"]


@dataclass
class Scripted:
    """A generator that rewrites the template's proposals: the pluggable interface, used to craft bad candidates."""

    inner: TemplateGenerator
    edit: Any
    name: str = "scripted/v1"

    def propose(self, bundles: Sequence[Bundle]) -> list[Proposal]:
        return [self.edit(b, p) for b, p in zip(bundles, self.inner.propose(bundles), strict=True)]

    def extract(self, bundle: Bundle, proposal: Proposal) -> Extraction:
        if proposal.quotes:
            return Extraction(dict(proposal.quotes), [], [])
        return extract_quotes_by_code(bundle, proposal)


def _with(**changes: Any) -> Any:
    def edit(bundle: Bundle, proposal: Proposal) -> Proposal:
        values = {k: (v(bundle, proposal) if callable(v) else v) for k, v in changes.items()}
        return Proposal(**{**proposal.__dict__, **values})

    return edit


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (_with(answer="an answer that no passage holds"), "answer_in_no_chunk"),
        (_with(error="not JSON", question="", answer=""), "generator_output_unparsable"),
        (
            _with(quotes=lambda b, p: {c.chunk_id: ["words that are not there at all"] for c in b.chunks}),
            "quote_not_verbatim",
        ),
        (_with(quotes=lambda b, p: {"py:nowhere#0": ["x"]}), "quote_for_unknown_chunk"),
        (_with(quotes=lambda b, p: {b.chunks[0].chunk_id: [b.chunks[0].text[:60]]}), "no_quote_in_supporting_chunk"),
        (_with(question=lambda b, p: p.question + " Hint: " + p.answer), "answer_in_question"),
        (_with(question="What is it?"), "clue_quote_not_in_question"),
    ],
)
def test_each_failed_check_drops_the_candidate_under_its_reason(corpus: SynthCorpus, edit: Any, reason: str) -> None:
    params = SynthParams(num_tasks=3, max_hops=1, max_candidates=3)
    result = synthesize(corpus, params, Scripted(TemplateGenerator(corpus), edit))
    assert result.tasks == []
    # Whatever else the template would have dropped, every candidate that reached this check fails it.
    assert result.report["dropped"][reason] >= 1
    assert result.report["candidates"] == 3 == result.report["dropped_total"]
    assert any(e["reason"] == reason for e in result.report["examples"])


def test_a_task_whose_distractors_are_too_few_is_dropped() -> None:
    chunks = [
        *doc("kb:finance", FINANCE),
        *doc("kb:ledger", LEDGER),
        *doc("kb:other", "Auditors arrive on site with their own consolidated statement templates and currency rates."),
    ]
    corpus = SynthCorpus(chunks)
    result = synthesize(
        corpus,
        SynthParams(num_tasks=1, max_hops=1, max_candidates=1, distractors=5, min_distractors=2),
        TemplateGenerator(corpus),
    )
    assert result.tasks == [] and result.report["dropped"]["too_few_distractors"] == 1
    kept = synthesize(
        corpus,
        SynthParams(num_tasks=1, max_hops=1, max_candidates=1, distractors=5, min_distractors=1),
        TemplateGenerator(corpus),
    )
    assert kept.tasks[0]["distractor_chunk_ids"] == ["kb:other#0"]


def test_distractors_match_a_clue_but_never_hold_the_answer_in_any_form() -> None:
    chunks = [
        *doc("kb:finance", FINANCE),
        *doc("kb:ledger", LEDGER),
        *doc("kb:a", "Auditors arrive at quarter end; they never call merge ledgers themselves."),
        *doc("kb:b", "Auditors arrive at quarter end and read the MERGE_LEDGERS output."),
        *doc("kb:c", "Auditors arrive at quarter end with coffee."),
        *doc("kb:d", "Nothing about the topic here at all."),
    ]
    corpus = SynthCorpus(chunks)
    bundle = gather_bundle(corpus, seed_chunks(corpus, SynthParams(max_hops=1)), 0, SynthParams(max_hops=1))
    ids, refused = find_distractors(corpus, bundle, "merge_ledgers", ["auditors arrive on site quarter end"], 10)
    assert ids == ["kb:c#0"] and refused == 2


def test_chaining_bridges_each_answer_into_the_next_hop_up_to_max_hops() -> None:
    # alpha -> beta -> gamma -> delta: each document documents one name and mentions the next.
    chunks = [
        *doc(
            "kb:start", "The deployment guide covers every maintenance window in detail. Operators call alpha_step()."
        ),
        *doc(
            "kb:alpha",
            "## alpha_step()\nPrepares the cluster for scheduled maintenance windows. Then beta_step() runs.",
        ),
        *doc(
            "kb:beta", "## beta_step()\nDrains the message queues of every region one by one. Then gamma_step() runs."
        ),
        *doc(
            "kb:gamma",
            "## gamma_step()\nRotates the encryption keys of all storage volumes at once. Then delta_step().",
        ),
        *doc("kb:delta", "## delta_step()\nReboots the remaining worker machines one rack at a time overnight."),
        *FILLER,
    ]
    corpus = SynthCorpus(chunks)
    for max_hops in (1, 2, 3):
        params = SynthParams(num_tasks=10, max_hops=max_hops, max_candidates=30, distractors=2, min_distractors=0)
        result = synthesize(corpus, params, TemplateGenerator(corpus))
        hops = {t["hops"] for t in result.tasks}
        assert max(hops) == max_hops and hops <= set(range(1, max_hops + 1))
        deepest = next(t for t in result.tasks if t["hops"] == max_hops and t["gold_chunk_ids"][0] == "kb:start#0")
        expected = ["kb:start#0", "kb:alpha#0", "kb:beta#0", "kb:gamma#0"][: max_hops + 1]
        assert deepest["gold_chunk_ids"] == expected
        assert deepest["answer"] == ["alpha_step", "beta_step", "gamma_step"][max_hops - 1]
        assert deepest["difficulty"] == ("easy" if max_hops == 1 else "hard")
        for name in ("alpha_step", "beta_step", "gamma_step"):
            assert name not in deepest["prompt"], "no bridge name is given away"
        assert result.report["per_hop"][str(max_hops)]["kept"] >= 1


def test_a_corpus_without_names_that_bridge_documents_gives_no_candidates() -> None:
    corpus = SynthCorpus(FILLER)
    result = synthesize(corpus, SynthParams(num_tasks=3), TemplateGenerator(corpus))
    assert result.tasks == [] and result.report["candidates"] == 0 and result.report["kept"] == 0
    assert result.report["stopped"].startswith("no seed chunks")


def test_an_empty_corpus_is_refused_with_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no chunks"):
        SynthCorpus([])


def test_mentions_need_code_like_names_and_cross_documents() -> None:
    corpus = SynthCorpus(
        [
            *doc("py:shutil", "## shutil.copy2(src, dst)\nCopies data and metadata between two files."),
            *doc("py:string", "A string of text.", title="string: common string operations"),
            *doc("py:user", "Use shutil.copy2 to copy a string; the string module helps too; see copy2 and string()."),
        ]
    )
    mentions = {(m.surface, m.doc_id) for m in corpus.mentions[corpus.index_of["py:user#0"]]}
    # `shutil.copy2` and `copy2` name the heading's chunk; `string` counts only when written as a call.
    assert mentions == {("shutil.copy2", "py:shutil"), ("copy2", "py:shutil"), ("string", "py:string")}
    assert corpus.mentions[corpus.index_of["py:shutil#0"]] == ()


def test_verification_recomputes_which_chunks_hold_the_answer() -> None:
    chunks = tuple(doc("kb:a", "The quick brown fox jumps over the lazy dog today.") + doc("kb:b", "Nothing here."))
    bundle = Bundle(index=0, chunks=chunks, bridges=())
    proposal = Proposal(question="Which animal jumps?", answer="Brown  FOX", clues=[])
    quotes = {"kb:a#0": ["quick brown fox"], "kb:b#0": ["nothing here"]}
    verdict = verify_candidate(bundle, proposal, Extraction(quotes, [], contains_truth=["kb:b#0"]))
    assert verdict.reason is None
    missing = Proposal(question="Which animal jumps?", answer="zebra", clues=[])
    assert verify_candidate(bundle, missing, Extraction(quotes, [], ["kb:a#0"])).reason == "answer_in_no_chunk"


# --- the LLM generator -----------------------------------------------------------------------------------------
def test_a_reply_is_parsed_into_a_proposal_or_an_error() -> None:
    good = parse_reply('Sure! {"question": "Q?", "answer": "A", "clues": ["c"], "quotes": {"x#0": ["q"]}} done')
    assert good.error == "" and good.question == "Q?" and good.quotes == {"x#0": ["q"]}
    assert "no JSON object" in parse_reply("no braces here").error
    assert "not valid JSON" in parse_reply('{"question": ').error
    assert "answer must be" in parse_reply('{"question": "Q", "answer": 3, "clues": [], "quotes": {}}').error
    assert "quotes must map" in parse_reply('{"question": "Q", "answer": "A", "clues": [], "quotes": []}').error


@dataclass
class _Gen:
    text: str


class EchoBackend:
    """A stand-in model that answers every prompt with one fixed reply (what a careful model would write after
    the reply's start, which the generator puts in the prompt)."""

    class tokenizer:  # noqa: N801 (stands in for the backend's tokenizer attribute)
        @staticmethod
        def encode(text: str, add_special_tokens: bool = True) -> list[int]:
            return [ord(ch) for ch in text]

    def __init__(self, reply: str) -> None:
        self.reply = reply

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> list[int]:
        return [1]

    def generate(self, prompts: Sequence[Sequence[int]], params: Any) -> list[_Gen]:
        return [_Gen(self.reply) for _ in prompts]


def test_the_llm_generator_keeps_verified_replies_from_a_model(corpus: SynthCorpus) -> None:
    seeds = seed_chunks(corpus, SynthParams(max_hops=1))
    bundle = gather_bundle(corpus, seeds, 0, SynthParams(max_hops=1))
    prompt = bundle_prompt(bundle)
    assert all(c.chunk_id in prompt for c in bundle.chunks) and bundle.answer_name in prompt
    quotes = {c.chunk_id: [" ".join(c.text.split()[:6])] for c in bundle.chunks}
    reply = {
        "question": "Which name links these passages?",
        "answer": bundle.answer_name,
        "clues": [],
        "quotes": quotes,
    }
    text = json.dumps(reply)
    assert text.startswith(REPLY_START)
    generator = LLMGenerator(EchoBackend(text[len(REPLY_START) :]), model_name="echo")  # type: ignore[arg-type]
    (proposal,) = generator.propose([bundle])
    extraction = generator.extract(bundle, proposal)
    assert verify_candidate(bundle, proposal, extraction).reason is None
    assert generator.name == "llm/v1:echo"


def test_the_llm_generator_on_the_tiny_model_runs_and_counts_its_unparsable_output(corpus: SynthCorpus) -> None:
    from workers.models import TINY_LLAMA
    from workers.search.synth_llm import make_llm_generator

    # Short passages and replies: the point is the path (prompt, generate, parse, count), not the text.
    generator = make_llm_generator(TINY_LLAMA, max_new_tokens=12, passage_chars=120)
    params = SynthParams(generator="llm", num_tasks=2, max_candidates=3, batch_size=3)
    result = synthesize(corpus, params, generator)
    # A random 3M-parameter model writes noise: nothing verifies, and every candidate is counted with its reason.
    assert result.tasks == [] and result.report["kept"] == 0
    assert result.report["candidates"] == 3 == result.report["dropped_total"]
    assert result.report["dropped"]["generator_output_unparsable"] >= 1
    example = result.report["examples"][0]
    assert example["reason"] == "generator_output_unparsable" and example["raw"]


# --- the job's outputs -----------------------------------------------------------------------------------------
class RecordingReporter:
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def __getattr__(self, kind: str) -> Any:
        return lambda *args, **kwargs: self.events.append((kind, args or kwargs))


def test_the_datagen_job_writes_tasks_and_report_and_reports_progress(tmp_path: Path) -> None:
    from workers.jobs.datagen import DatagenSpec, generate, report_summary

    corpus_file = tmp_path / "corpus.jsonl"
    corpus_file.write_bytes(dump_chunks_jsonl(stdlib_chunks()))
    spec = DatagenSpec(
        run_id=1,
        kind="datagen",
        ingest_url="http://127.0.0.1/ingest",
        corpus_uri=f"file://{corpus_file}",
        corpus_label="stdlib@v1",
        corpus_hash="abc",
        output_uri=f"file://{tmp_path}/out/tasks.jsonl",
        report_uri=f"file://{tmp_path}/out/report.json",
        num_tasks=6,
        max_hops=2,
    )
    reporter = RecordingReporter()
    result = generate(spec, reporter)  # type: ignore[arg-type]
    rows = [json.loads(line) for line in (tmp_path / "out/tasks.jsonl").read_text().splitlines()]
    assert rows == result.tasks and len(rows) == 6
    assert json.loads((tmp_path / "out/report.json").read_text()) == result.report
    kinds = [kind for kind, _ in reporter.events]
    assert {"progress", "metric", "artifact", "log"} <= set(kinds)
    assert [args for kind, args in reporter.events if kind == "progress"][-1] == (6, 6)
    summary = report_summary(result.report)
    assert summary["kept"] == 6 and "examples" not in summary
