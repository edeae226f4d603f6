"""`manage.py retrieval_eval CORPUS_VERSION [--tasks-version ID] [--tasks N] [--config JSON]... [--json PATH]`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from pydantic import ValidationError

from apps.datasets.models import DatasetKind, DatasetVersion
from workers.search.beir import RELEVANT
from workers.search.index import IndexConfig
from workers.search.retrieval_docs import (
    ALL_QUERIES,
    DOC_KS,
    doc_queries,
    evaluate_documents,
    has_document_gold,
    report_documents,
)
from workers.search.retrieval_eval import (
    KS,
    IndexViews,
    evaluate,
    hop_queries,
    lost_evidence,
    ranked_ids,
    report,
    with_stored_ids,
)
from workers.search.synth import synthesize
from workers.search.synth_corpus import SynthCorpus
from workers.search.synth_params import SynthParams
from workers.search.synth_steps import TemplateGenerator
from workers.search.types import Chunk, also_in, chunk_doc_ids, iter_chunks_jsonl

METRICS = (*(f"recall@{k}" for k in KS), "mrr", "ndcg@10")
CHUNK_DEPTH = 300  # chunks ranked per query before folding to documents (document-level gold)


class Command(BaseCommand):
    help = (
        "Retrieval metrics of a corpus version: recall@1/5/10, MRR and nDCG@10 with bootstrap 95% intervals for "
        "BM25, dense, the default hybrid and any --config, on the first and later hops of multi-hop tasks (a tasks "
        "dataset version, or tasks generated here from the corpus). Tasks whose gold is documents (a BEIR import) "
        "are scored on the rankings folded to documents: recall@1/5/10/100, MRR and graded nDCG@10 per query set. "
        "Builds nothing that is stored."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("corpus_version", type=int, help="id of a corpus dataset version")
        parser.add_argument("--tasks-version", type=int, help="id of a tasks dataset version over this corpus")
        parser.add_argument("--tasks", type=int, default=60, help="without --tasks-version: tasks to generate")
        parser.add_argument(
            "--config",
            action="append",
            default=[],
            help='an IndexConfig to compare, as JSON (e.g. \'{"stemmer": "english"}\'); repeatable',
        )
        parser.add_argument("--json", type=Path, help="also write the full report here")
        parser.add_argument(
            "--allow-lost-evidence",
            action="store_true",
            help="evaluate even when the corpus lost some task's evidence (the tasks are listed on stderr, after the "
            "tables and under evidence_lost in --json); without it the command stops with the list",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        version = self._version(options["corpus_version"], DatasetKind.CORPUS, "corpus_version")
        with version.file.open("rb") as handle:
            chunks = list(iter_chunks_jsonl(handle.read()))
        synth = SynthCorpus(chunks)
        if options["tasks_version"] is not None:
            tasks_version = self._version(options["tasks_version"], None, "--tasks-version")
            with tasks_version.file.open("rb") as handle:
                tasks = [json.loads(line) for line in handle.read().splitlines() if line.strip()]
            if tasks and all(has_document_gold(t) for t in tasks):
                self._documents(options, version, chunks, tasks)
                return
            known = {ident for chunk in chunks for ident in (chunk.chunk_id, *also_in(chunk))}
            missing = sorted({c for t in tasks for c in t.get("gold_chunk_ids", []) if c not in known})
            if missing:
                raise CommandError(
                    f"--tasks-version {tasks_version.pk} names {len(missing)} chunk(s) this corpus lacks "
                    f"(e.g. {missing[0]}): pass the tasks generated from corpus version {version.pk}"
                )
        else:
            params = SynthParams(num_tasks=options["tasks"], max_hops=2, seed=0)
            tasks = synthesize(synth, params, TemplateGenerator(synth)).tasks
        lost = lost_evidence(tasks, chunks)
        if lost:
            self.stderr.write(f"{len(lost)} of {len(tasks)} task(s) lost evidence in this corpus:")
            for task_id, problems in sorted(lost.items()):
                self.stderr.write(f"  {task_id}: {'; '.join(problems)}")
            if not options["allow_lost_evidence"]:
                named = ", ".join(sorted(lost)[:5]) + (", ..." if len(lost) > 5 else "")
                raise CommandError(
                    f"corpus version {version.pk} lost the evidence of {len(lost)} task(s) ({named}): "
                    "no retriever can find it. Re-import the documents (a chunk "
                    "several documents share is now kept for each), or pass --allow-lost-evidence to evaluate anyway"
                )
        tasks = with_stored_ids(tasks, chunks)
        queries = hop_queries(tasks, synth)
        if not queries:
            raise CommandError("no task gave a query (the tasks hold no quotes): use tasks from the generator")
        configs = self._configs(options)
        self.stdout.write(f"{len(chunks)} chunks, {len(tasks)} tasks, {len(queries)} queries; building views ...")
        views = IndexViews(chunks)
        retrievers = {name: ranked_ids(views.index(config)) for name, config in configs.items()}
        retrievers["dense"] = ranked_ids(views.index(IndexConfig()), dense_only=True)
        result = report(evaluate(retrievers, queries), queries)
        for part in ("first", "later"):
            self.stdout.write(f"\n{part} hop")
            self.stdout.write(f"  {'retriever':28}" + "".join(f"{m:>20}" for m in METRICS))
            for name, parts in result.items():
                summary = parts[part]
                cells = [
                    f"{summary[m]['mean']:.3f} [{summary[m]['low']:.2f},{summary[m]['high']:.2f}]"
                    if m in summary
                    else "-"
                    for m in METRICS
                ]
                self.stdout.write(f"  {name[:28]:28}" + "".join(f"{c:>20}" for c in cells))
        if lost:
            self.stdout.write(f"\nevidence lost: {len(lost)} task(s), {', '.join(sorted(lost))}")
        if options["json"]:
            options["json"].write_text(
                json.dumps({"corpus_version": version.pk, "metrics": result, "evidence_lost": lost}, indent=1)
            )

    def _configs(self, options: dict[str, Any]) -> dict[str, IndexConfig]:
        configs: dict[str, IndexConfig] = {"bm25": IndexConfig(dense=False), "default hybrid": IndexConfig()}
        for text in options["config"]:
            try:
                configs[text] = IndexConfig.model_validate(json.loads(text))
            except (ValueError, ValidationError) as exc:
                raise CommandError(f"--config {text}: {exc}") from None
        return configs

    def _documents(
        self, options: dict[str, Any], version: DatasetVersion, chunks: list[Chunk], tasks: list[dict[str, Any]]
    ) -> None:
        """Tasks whose gold is documents (a BEIR import): rankings folded to documents, per query set."""
        queries = doc_queries(tasks)
        if not queries:
            raise CommandError("no task row has a text prompt and document gold (relevance or gold_doc_ids)")
        stored = {doc for chunk in chunks for doc in chunk_doc_ids(chunk)}
        judged = {doc for q in queries for doc, score in q.relevance.items() if score >= RELEVANT}
        absent = sorted(judged - stored)
        if absent:
            self.stderr.write(
                f"{len(absent)} relevant document(s) have no chunk in corpus version {version.pk} (e.g. "
                f"{absent[0]}): no retriever can rank them"
            )
        configs = self._configs(options)
        self.stdout.write(
            f"{len(chunks)} chunks, {len(queries)} queries with document gold "
            f"({', '.join(sorted({q.query_set for q in queries}))}); building views ..."
        )
        views = IndexViews(chunks)
        depth = CHUNK_DEPTH
        retrievers = {name: ranked_ids(views.index(config), depth=depth) for name, config in configs.items()}
        retrievers["dense"] = ranked_ids(views.index(IndexConfig()), dense_only=True, depth=depth)
        result = report_documents(evaluate_documents(retrievers, queries, chunks, chunk_depth=depth), queries)
        metrics = (*(f"recall@{k}" for k in DOC_KS), "mrr", "ndcg@10")
        for part in [*dict.fromkeys(q.query_set for q in queries), ALL_QUERIES]:
            self.stdout.write(f"\n{part} (documents)")
            self.stdout.write(f"  {'retriever':28}" + "".join(f"{m:>20}" for m in metrics))
            for name, parts in result.items():
                summary = parts[part]
                cells = [
                    f"{summary[m]['mean']:.3f} [{summary[m]['low']:.2f},{summary[m]['high']:.2f}]" for m in metrics
                ]
                self.stdout.write(f"  {name[:28]:28}" + "".join(f"{c:>20}" for c in cells))
        if options["json"]:
            options["json"].write_text(
                json.dumps(
                    {"corpus_version": version.pk, "level": "document", "metrics": result, "absent_documents": absent},
                    indent=1,
                )
            )

    def _version(self, pk: int, kind: str | None, flag: str) -> DatasetVersion:
        version = DatasetVersion.objects.select_related("dataset").filter(pk=pk).first()
        if version is None:
            raise CommandError(f"{flag} {pk}: no such dataset version")
        if kind is not None and version.dataset.kind != kind:
            raise CommandError(f"{flag} {pk} is a {version.dataset.kind} dataset, not a {kind}")
        return version
