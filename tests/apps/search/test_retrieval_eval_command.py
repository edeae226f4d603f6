"""`manage.py retrieval_eval`: a corpus version's retrieval metrics, and the errors that name what to fix."""

from __future__ import annotations

import io
import json
import random

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from apps.datasets.models import DatasetKind
from apps.datasets.services import dataset_create, dataset_version_create
from workers.search.corpus import Document, build_corpus
from workers.search.types import dump_chunks_jsonl

pytestmark = pytest.mark.django_db

WORDS = "river mountain lantern copper violet harbor meadow silver thunder orchard falcon granite ember willow".split()


def _documents() -> list[Document]:
    """Twelve small modules that call each other by name: enough bridges for two-hop tasks."""
    rng = random.Random(0)
    docs = []
    for i in range(12):
        other = (i + 1) % 12
        sentence = " ".join(rng.choice(WORDS) for _ in range(12))
        text = (
            f"# tool.mod{i}\n\nThe module {i} handles {sentence} with care and patience every day.\n\n"
            f"It calls tool.mod{other}.run_{other}() when the {rng.choice(WORDS)} {rng.choice(WORDS)} arrives late."
            f"\n\n## tool.mod{i}.run_{i}(x)\n\nRun number {i} walks the {rng.choice(WORDS)} and "
            f"{rng.choice(WORDS)} path slowly before dawn."
        )
        docs.append(Document(f"mod{i}", text, title=f"tool.mod{i}"))
    return docs


def test_the_command_prints_every_retriever_per_hop_and_writes_json(users, tmp_path) -> None:  # type: ignore[no-untyped-def]
    owner = users["operator"]
    chunks, _ = build_corpus(_documents())
    dataset = dataset_create(name="tools", kind=DatasetKind.CORPUS, owner=owner)
    version = dataset_version_create(
        dataset=dataset, data=dump_chunks_jsonl(chunks), filename="c.jsonl", created_by=owner
    )
    out = io.StringIO()
    report = tmp_path / "r.json"
    call_command(
        "retrieval_eval", str(version.pk), "--tasks", "6", "--config", '{"stemmer": "english"}', "--json", str(report),
        stdout=out,
    )  # fmt: skip
    text = out.getvalue()
    assert "first hop" in text and "later hop" in text
    for row in ("bm25", "default hybrid", "dense", '{"stemmer": "english"}'):
        assert row in text
    stored = json.loads(report.read_text())
    first = stored["metrics"]["default hybrid"]["first"]
    assert first["queries"] == 6 and 0.0 <= first["recall@10"]["mean"] <= 1.0

    with pytest.raises(CommandError, match=r"--config .*bm25_k1"):
        call_command("retrieval_eval", str(version.pk), "--config", '{"bm25_k1": -1}', stdout=io.StringIO())
    with pytest.raises(CommandError, match="no such dataset version"):
        call_command("retrieval_eval", "999999", stdout=io.StringIO())


def test_the_command_stops_on_a_task_whose_evidence_the_corpus_lost(users, tmp_path) -> None:  # type: ignore[no-untyped-def]
    owner = users["operator"]
    chunks, _ = build_corpus(_documents())
    corpus = dataset_create(name="tools-lost", kind=DatasetKind.CORPUS, owner=owner)
    version = dataset_version_create(
        dataset=corpus, data=dump_chunks_jsonl(chunks), filename="c.jsonl", created_by=owner
    )
    first = chunks[0]
    quote = " ".join(first.text.split()[3:11])
    rows = [
        {"id": "kept", "prompt": "q", "gold_chunk_ids": [first.chunk_id],
         "provenance": {"quotes": {first.chunk_id: [quote]}}},
        # A quote of mod0 filed under mod1's chunk: a chunker that deleted mod1's copy of it leaves this.
        {"id": "lost", "prompt": "q", "gold_chunk_ids": ["mod1#0"], "provenance": {"quotes": {"mod1#0": [quote]}}},
    ]  # fmt: skip
    tasks = dataset_create(name="tools-lost-tasks", kind=DatasetKind.TASKS, owner=owner)
    tasks_version = dataset_version_create(
        dataset=tasks, data=b"".join(json.dumps(r).encode() + b"\n" for r in rows), filename="t.jsonl", created_by=owner
    )
    err = io.StringIO()
    with pytest.raises(CommandError, match=r"lost the evidence of 1 task\(s\) \(lost\)"):
        call_command("retrieval_eval", str(version.pk), "--tasks-version", str(tasks_version.pk), stderr=err)
    assert "lost: quote" in err.getvalue() and "no chunk of document mod1" in err.getvalue()
    report = tmp_path / "r.json"
    out = io.StringIO()
    call_command(
        "retrieval_eval", str(version.pk), "--tasks-version", str(tasks_version.pk), "--allow-lost-evidence",
        "--json", str(report), stdout=out, stderr=io.StringIO(),
    )  # fmt: skip
    assert "evidence lost: 1 task(s), lost" in out.getvalue()
    assert list(json.loads(report.read_text())["evidence_lost"]) == ["lost"]
