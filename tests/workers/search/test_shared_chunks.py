"""Near-duplicate filtering never deletes a document's own text (issue 36, section 4; docs/corpus-chunking.md).

Text several documents hold word for word (an option block common to a family of documents, a closing section
they repeat) is stored once and attributed to each document; a copy within one document is dropped; a near copy in
another document that differs is kept. The retrieval harness reports any task whose evidence a corpus lost.
"""

from __future__ import annotations

from typing import Any

import pytest

from workers.envs.registry import make_env
from workers.envs.toolcalls import format_tool_call
from workers.search.corpus import ChunkerConfig, CorpusError, Document, build_corpus
from workers.search.corpus_jsonl import validate_canonical
from workers.search.dedup import merge_copies
from workers.search.environment import SearchEnv
from workers.search.index import IndexConfig, SearchIndex
from workers.search.retrieval_eval import lost_evidence, with_stored_ids
from workers.search.synth_corpus import normalize
from workers.search.types import Chunk, also_in, chunk_doc_ids, dump_chunks_jsonl

OPTIONS = (
    "## Options\n\n"
    "The --retry-budget flag caps how many times a failed upload is attempted again before the command gives up. "
    "The --chunk-window flag sets how many parts are sent at once, and the --quiet flag hides the progress bar "
    "while the transfer runs, which keeps the terminal readable when many transfers run side by side in scripts."
)
CLOSING = (
    "## Support\n\n"
    "Report a defect through the tracker with the full command line, the version printed by the about command, "
    "and the last forty lines of the log file; maintainers answer within two working days and publish every fix "
    "in the release notes of the next minor version, along with the name of whoever found the defect first."
)
OPTION_QUOTE = "caps how many times a failed upload is attempted again"
CLOSING_QUOTE = "maintainers answer within two working days"


def _family() -> list[Document]:
    """Three related command pages: own text first, then the same option block and closing section."""
    return [
        Document(
            f"cmd-{name}",
            f"# {name}\n\nThe {name} command {what} and prints one line per file it handles.\n\n{OPTIONS}\n\n{CLOSING}",
            title=name,
        )
        for name, what in (
            ("upload", "copies local files to the bucket"),
            ("sync", "mirrors a folder to the bucket"),
            ("restore", "brings archived files back"),
        )
    ]


CONFIG = ChunkerConfig(max_words=60)


def test_text_shared_by_several_documents_stays_in_every_one_of_them() -> None:
    chunks, report = build_corpus(_family(), CONFIG)
    index = SearchIndex.build(chunks, IndexConfig(dense=False))
    for doc_id in ("cmd-upload", "cmd-sync", "cmd-restore"):
        texts = [normalize(c.text) for c in index.document(doc_id)]
        assert any(OPTION_QUOTE in t for t in texts), doc_id
        assert any(CLOSING_QUOTE in t for t in texts), doc_id
        # The document's own text comes first, in position order.
        assert index.document(doc_id)[0].text.startswith(f"# {doc_id.removeprefix('cmd-')}")
    # Stored once each, attributed to the two later documents under the ids their copies would have had.
    shared = [c for c in chunks if also_in(c)]
    assert [c.chunk_id for c in shared] == ["cmd-upload#1", "cmd-upload#2"]
    assert also_in(shared[0]) == ["cmd-sync#1", "cmd-restore#1"]
    assert chunk_doc_ids(shared[1]) == ["cmd-upload", "cmd-sync", "cmd-restore"]
    assert index.chunk("cmd-restore#2") is shared[1] and index.canonical_id("cmd-restore#2") == "cmd-upload#2"
    assert report["shared_chunks"] == 2 and report["shared_chunk_copies_merged"] == 4
    assert report["near_duplicate_chunks_dropped"] == 0 and report["chunks"] == 5
    assert index.document_count == 3 and index.manifest["documents"] == 3


def test_a_search_returns_the_shared_chunk_once_for_every_document_that_holds_it() -> None:
    chunks, _ = build_corpus(_family(), CONFIG)
    index = SearchIndex.build(chunks, IndexConfig(dense=False))
    hits = index.search("failed upload attempted again retry budget", k=3)
    assert hits[0].chunk.chunk_id == "cmd-upload#1"
    assert sum(1 for h in hits if OPTION_QUOTE in normalize(h.chunk.text)) == 1
    assert chunk_doc_ids(hits[0].chunk) == ["cmd-upload", "cmd-sync", "cmd-restore"]
    # A search that excludes the chunk by a copy's id excludes it too (the harness's seen-chunk dedup).
    assert all(h.chunk.chunk_id != "cmd-upload#1" for h in index.search(OPTION_QUOTE, k=5, exclude={"cmd-sync#1"}))
    assert [h.chunk.chunk_id for h in index.grep("two working days")] == ["cmd-upload#2"]


def _env(index: SearchIndex, gold: list[str]) -> SearchEnv:
    env = make_env("search", index_uri="memory://shared")
    assert isinstance(env, SearchEnv)
    env.bind_index(index)
    task = {"id": "t", "prompt": "How often is a failed sync retried?", "gold_chunk_ids": gold}
    env.reset(env.validate_task_row(task))
    return env


def test_reading_any_document_shows_the_shared_chunk_and_either_id_scores_as_the_same_chunk() -> None:
    chunks, _ = build_corpus(_family(), CONFIG)
    index = SearchIndex.build(chunks, IndexConfig(dense=False))
    env = _env(index, ["cmd-sync#1"])
    result = env.step(format_tool_call("read_document", {"doc_id": "cmd-sync"}))
    assert result.observation is not None
    text = result.observation.messages[-1]["content"]
    assert "[chunk cmd-upload#1 | doc cmd-upload | upload | also in cmd-sync, cmd-restore]" in text
    assert "failed upload is attempted again" in text
    env.step("<Document id=cmd-upload#1><Justification>the retry flag</Justification></Document>")
    fields = env.trajectory_fields()
    assert fields["gold_doc_ids"] == ["cmd-upload#1"] and fields["output_doc_ids"] == ["cmd-upload#1"]
    assert env.episode_metrics(fields)["output_recall"] == 1.0


def test_a_copy_within_one_document_is_dropped_and_a_near_copy_elsewhere_is_kept() -> None:
    block = " ".join(f"Step {n} checks the queue and wakes an idle worker when work arrives." for n in range(8))
    docs = [
        Document("guide", f"# Guide\n\n{block}\n\n# Again\n\n{block}"),
        Document("other", block.replace("arrives.", "arrives!", 1)),  # the same words, one character apart
    ]
    chunks, report = build_corpus(docs, ChunkerConfig(max_words=200, drop_boilerplate=False))
    assert report["near_duplicate_chunks_dropped"] == 1 and report["near_duplicates_kept_across_documents"] == 1
    assert report["shared_chunks"] == 0
    assert [c.chunk_id for c in chunks] == ["guide#0", "other#0"]
    assert "arrives!" in chunks[-1].text


def test_merge_copies_matches_a_later_copy_to_a_near_copy_kept_earlier() -> None:
    base = " ".join(f"Item {n} is read from the spool and written to the journal." for n in range(10))
    variant = base.replace("journal.", "journal!", 1)
    merge = merge_copies([base, variant, variant, base, variant], ["a", "b", "c", "c", "c"])
    assert merge.kept_near == {1: 0}
    # Identical to the kept near copy, not to the first text; then c's copy of the first text is c's too.
    assert merge.shared == {2: 1, 3: 0}
    assert merge.dropped == {4: 1}  # document c already holds that text
    with pytest.raises(ValueError, match="one group per text"):
        merge_copies(["x"], [])


def test_stored_corpora_round_trip_and_bad_also_in_is_refused_by_line() -> None:
    chunks, _ = build_corpus(_family(), CONFIG)
    assert validate_canonical(dump_chunks_jsonl(chunks)) == chunks

    def corpus(*rows: tuple[str, Any]) -> bytes:
        return dump_chunks_jsonl(
            Chunk(chunk_id=f"{doc}#0", doc_id=doc, position=0, text="words here", metadata={"also_in": value})
            for doc, value in rows
        )

    cases = [
        (corpus(("a", "b#1")), "line 1: metadata.also_in must be a list of chunk ids"),
        (corpus(("a", ["b 1#x"])), "line 1: metadata.also_in: 'b 1#x' is not a chunk id"),
        (corpus(("a", ["a#4"])), "line 1: metadata.also_in: 'a#4' is in this chunk's own document"),
        (corpus(("a", ["b#0"]), ("b", [])), "line 1: metadata.also_in: 'b#0' is a stored chunk (line 2)"),
        (corpus(("a", ["c#2"]), ("b", ["c#2"])), "line 2: metadata.also_in: 'c#2' is already listed on line 1"),
    ]
    for data, message in cases:
        with pytest.raises(CorpusError) as caught:
            validate_canonical(data)
        assert any(message in error for error in caught.value.errors), (message, caught.value.errors)


def _task(task_id: str, chunk_id: str, quote: str) -> dict[str, Any]:
    return {"id": task_id, "gold_chunk_ids": [chunk_id], "provenance": {"quotes": {chunk_id: [f"\u201c{quote}\u201d"]}}}


def test_the_harness_names_every_task_whose_evidence_the_corpus_lost() -> None:
    chunks, _ = build_corpus(_family(), CONFIG)
    tasks = [
        _task("kept-own", "cmd-sync#0", "mirrors a folder to the bucket"),
        _task("kept-shared", "cmd-restore#1", OPTION_QUOTE),  # a copy's id and its quote: both still there
        _task("gone-chunk", "cmd-sync#9", "mirrors a folder"),
        _task("gone-quote", "cmd-upload#0", "this sentence was never in any document"),
    ]
    assert lost_evidence(tasks, chunks) == {
        "gone-chunk": ["gold chunk cmd-sync#9 is not in the corpus"],
        "gone-quote": [
            "quote '\u201cthis sentence was never in any document\u201d' of cmd-upload#0 is in no chunk of "
            "document cmd-upload"
        ],
    }
    # What today's filter did before this fix: the later documents' copies deleted outright.
    deleted = [c for c in chunks if c.doc_id == "cmd-upload" or c.position == 0]
    deleted = [Chunk(c.chunk_id, c.doc_id, c.position, c.text, c.title) for c in deleted]
    assert set(lost_evidence(tasks[:2], deleted)) == {"kept-shared"}
    [shared] = with_stored_ids([tasks[1]], chunks)
    assert shared["gold_chunk_ids"] == ["cmd-upload#1"] and list(shared["provenance"]["quotes"]) == ["cmd-upload#1"]


def test_an_option_block_a_family_of_documents_shares_is_boilerplate_but_stays_findable_in_each() -> None:
    """Issue 36 §4: the boilerplate filter deleted short paragraphs repeated across documents (an option block of a
    family of commands, a closing line), so a quote of them was in no chunk. They are set apart, never deleted."""
    options = "-v, --verbose  print each file as it is copied"
    closing = "See also: the sync family of commands."
    docs = [
        Document(f"cmd-{name}", f"# {name}\n\nThe {name} command {what}.\n\n{options}\n\n{closing}")
        for name, what in [("push", "sends files"), ("pull", "fetches files"), ("mirror", "copies trees")]
    ]
    chunks, report = build_corpus(docs, ChunkerConfig(max_words=200))
    assert report["boilerplate_paragraphs_removed"] == 6 and report["boilerplate_chunks"] == 2
    for doc in docs:
        held = [c.text for c in chunks if doc.doc_id in chunk_doc_ids(c)]
        for quote in (options, closing, doc.text.split("\n\n")[1]):
            assert any(quote in text for text in held), (doc.doc_id, quote)
    index = SearchIndex.build(chunks, IndexConfig(dense=False))
    for doc in docs:
        assert any(options in c.text for c in index.document(doc.doc_id))
    task = {"id": "t", "gold_chunk_ids": ["cmd-mirror#1"], "provenance": {"quotes": {"cmd-mirror#1": [options]}}}
    assert lost_evidence([task], chunks) == {}
