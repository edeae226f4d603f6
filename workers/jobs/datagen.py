"""Synthetic search tasks from a corpus version, as a Ray job (`python -m workers.jobs.datagen`).

Reads the corpus's canonical chunk JSONL, runs the pipeline of `workers.search.synth` with the chosen generator
(template: deterministic, no model; llm: a policy backend), reports progress as tasks kept out of the target, and
writes the task rows (JSONL) and the verification report (JSON). The control plane's success hook
(`apps.search.services.datagen.datagen_finalize`) turns them into a tasks dataset version.

Everything runs in the job's driver: the template generator costs milliseconds per candidate, and a model generator
batches its candidates into one `generate` call, so Ray tasks would add transfers without adding speed; one process
also keeps the output a pure function of corpus, parameters and seed.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from workers.jobs.common import load_spec, reporter_for
from workers.jobs.preflight import preflight_models
from workers.reporting import Reporter, configure_logging
from workers.search.synth import SynthResult, dump_tasks_jsonl, synthesize
from workers.search.synth_corpus import SynthCorpus
from workers.search.synth_llm import make_llm_generator
from workers.search.synth_params import SynthParams
from workers.search.synth_steps import TaskGenerator, TemplateGenerator
from workers.search.types import iter_chunks_jsonl
from workers.search.wide import synthesize_wide
from workers.specs import DatagenSpec
from workers.storage import read_bytes, write_bytes

log = logging.getLogger("crucible.datagen")


def make_generator(params: SynthParams, corpus: SynthCorpus) -> TaskGenerator:
    if params.generator == "llm":
        return make_llm_generator(params.model, backend=params.backend, max_new_tokens=params.max_new_tokens)
    return TemplateGenerator(corpus)


def generate(spec: DatagenSpec, reporter: Reporter | None = None) -> SynthResult:
    """Read the corpus, generate, write both outputs; `reporter` (if any) gets progress, metrics and logs."""
    params = spec.params()
    started = time.monotonic()

    def say(line: str) -> None:
        log.info(line)
        if reporter is not None:
            reporter.log(line)

    say(f"reading corpus {spec.corpus_label} from {spec.corpus_uri}")
    chunks = list(iter_chunks_jsonl(read_bytes(spec.corpus_uri, spec.storage_options)))
    if params.shape == "wide":
        say(f"generating up to {params.num_tasks} wide tasks (columns {', '.join(params.wide_columns)})")
        wide = synthesize_wide(chunks, params.wide_params(), corpus_label=spec.corpus_label)
        result = SynthResult(tasks=wide.tasks, report=wide.report)
        if reporter is not None:
            reporter.progress(len(result.tasks), params.num_tasks)
        return _write(spec, result, reporter, say, started)
    corpus = SynthCorpus(chunks)
    say(f"{len(chunks)} chunks, {len(corpus.doc_chunks)} documents, {len(corpus.names)} names")
    generator = make_generator(params, corpus)
    say(f"generating up to {params.num_tasks} tasks with {generator.name} (at most {params.candidate_limit} tries)")

    def on_progress(kept: int, tried: int) -> None:
        if reporter is not None:
            reporter.progress(kept, params.num_tasks)
            reporter.metric(tried, {"kept": float(kept), "dropped": float(tried - kept)})

    if reporter is not None:
        reporter.progress(0, params.num_tasks)
    result = synthesize(
        corpus,
        params,
        generator,
        corpus_label=spec.corpus_label,
        corpus_hash=spec.corpus_hash,
        on_progress=on_progress,
    )
    return _write(spec, result, reporter, say, started)


def _write(spec: DatagenSpec, result: SynthResult, reporter: Reporter | None, say: Any, started: float) -> SynthResult:
    tasks = dump_tasks_jsonl(result.tasks)
    report = json.dumps(result.report, indent=2, ensure_ascii=False).encode()
    write_bytes(spec.output_uri, tasks, spec.storage_options)
    write_bytes(spec.report_uri, report, spec.storage_options)
    if reporter is not None:
        reporter.artifact("tasks.jsonl", spec.output_uri, size_bytes=len(tasks), meta={"rows": len(result.tasks)})
        reporter.artifact("report.json", spec.report_uri, size_bytes=len(report))
    dropped = {k: v for k, v in result.report["dropped"].items() if v}
    say(
        f"kept {result.report['kept']} of {result.report['candidates']} candidates in "
        f"{time.monotonic() - started:.1f}s ({result.report['stopped']}); dropped {dropped or 'none'}"
    )
    return result


def report_summary(report: dict[str, Any]) -> dict[str, Any]:
    """The counts of a report, small enough for the run's summary (the examples stay in report.json)."""
    return {
        "generator": report["generator"],
        "target": report["target"],
        "candidates": report["candidates"],
        "kept": report["kept"],
        "dropped": {k: v for k, v in report["dropped"].items() if v},
        "per_hop": report["per_hop"],
        "stopped": report["stopped"],
        "seconds": report["seconds"],
    }


def run(spec: DatagenSpec) -> dict[str, Any]:
    with reporter_for(spec) as reporter:
        preflight_models(spec, reporter)  # the models it names are here, or the run fails now
        result = generate(spec, reporter)
        summary = report_summary(result.report)
        reporter.summary(summary)
    return summary


def main() -> None:
    configure_logging()
    run(load_spec(DatagenSpec))


if __name__ == "__main__":
    main()
