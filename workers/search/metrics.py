"""Context-1's evaluation metrics (docs/methods.md section 3, "Metrics") and the "4x" ensemble of rollouts.

Per episode, from a search trajectory record (workers.search.environment):
- `final_answer_found`: 1 if the output holds a chunk that contains the answer (the task's `answer_chunk_ids`;
  without them, the answer text matching a gold answer after normalisation);
- `output_recall`, `output_precision`, `output_f1`: the output ids against the gold chunk ids;
- `trajectory_recall`: the share of gold chunks shown at any point (pruned ones included);
- `turns`, `prune_calls`;
- per fact, for tasks whose row lists `gold_facts` (docs/methods.md section 3: "some datasets are scored per fact: a
  fact counts as found if any of its chunks was retrieved"; each fact is the list of chunk ids that hold it):
  `fact_recall` (facts with a chunk in the output) and `trajectory_fact_recall` (facts with a chunk shown at any
  point). Tasks without facts report neither.

`ensemble_outputs` fuses several rollouts' output lists of one task with reciprocal rank fusion (docs/methods.md R1,
1-based ranks, k = 60): Context-1 (4x) is four rollouts fused this way.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from workers.rewards.terms import f_beta, normalize_answer, set_precision_recall, set_recall

EPISODE_METRICS = (
    "final_answer_found",
    "output_recall",
    "output_precision",
    "output_f1",
    "trajectory_recall",
    "turns",
    "prune_calls",
)


def _ids(record: Mapping[str, Any], key: str) -> list[str]:
    return [str(item) for item in record.get(key) or []]


def final_answer_found(output: Sequence[str], record: Mapping[str, Any]) -> float:
    answer_chunks = set(_ids(record, "answer_doc_ids"))
    if answer_chunks:
        return 1.0 if answer_chunks & set(output) else 0.0
    answer = record.get("answer")
    gold = {normalize_answer(g) for g in record.get("gold_answers") or []}
    return 1.0 if answer and gold and normalize_answer(str(answer)) in gold else 0.0


def output_metrics(output: Sequence[str], record: Mapping[str, Any]) -> dict[str, float]:
    gold = _ids(record, "gold_doc_ids")
    precision, recall = set_precision_recall(output, gold) if gold else (0.0, 0.0)
    return {
        "final_answer_found": final_answer_found(output, record),
        "output_recall": recall,
        "output_precision": precision,
        "output_f1": f_beta(precision, recall, 1.0),
    }


def episode_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """Every metric of one search trajectory record."""
    out = output_metrics(_ids(record, "output_doc_ids"), record)
    gold = _ids(record, "gold_doc_ids")
    counts = record.get("counts") or {}
    out["trajectory_recall"] = set_recall(_ids(record, "seen_doc_ids"), gold) if gold else 0.0
    out["turns"] = float(counts.get("turns", 0))
    out["prune_calls"] = float(counts.get("prune_chunks_calls", 0))
    facts = [{str(c) for c in fact} for fact in record.get("gold_facts") or [] if fact]
    if facts:
        output, seen = set(_ids(record, "output_doc_ids")), set(_ids(record, "seen_doc_ids"))
        out["fact_recall"] = sum(1 for fact in facts if fact & output) / len(facts)
        out["trajectory_fact_recall"] = sum(1 for fact in facts if fact & seen) / len(facts)
    return out


def mean_metrics(rows: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Mean of each metric over rows (metrics absent from a row are skipped for that row)."""
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for row in rows:
        for key, value in row.items():
            sums[key] += float(value)
            counts[key] += 1
    return {key: sums[key] / counts[key] for key in sorted(sums)}


def ensemble_outputs(outputs: Sequence[Sequence[str]], *, k: int = 60, top_n: int | None = None) -> list[str]:
    """Fuse rollouts' ranked output ids with RRF (docs/methods.md R1: sum over lists of 1/(k + rank), 1-based ranks;
    a list without the id adds 0). Ties keep first-seen order. `top_n` defaults to the longest input list."""
    scores: dict[str, float] = defaultdict(float)
    first_seen: dict[str, int] = {}
    for ranked in outputs:
        for rank, item in enumerate(dict.fromkeys(ranked), start=1):
            scores[item] += 1.0 / (k + rank)
            first_seen.setdefault(item, len(first_seen))
    fused = sorted(scores, key=lambda item: (-scores[item], first_seen[item]))
    limit = top_n if top_n is not None else max((len(o) for o in outputs), default=0)
    return fused[:limit]


def ensemble_metrics(records: Sequence[Mapping[str, Any]], *, k: int = 60) -> dict[str, float]:
    """Output metrics of the RRF-fused outputs of several rollouts of the same task (trajectory recall: the union
    of what they saw)."""
    if not records:
        raise ValueError("ensemble_metrics needs at least one rollout")
    fused = ensemble_outputs([_ids(r, "output_doc_ids") for r in records], k=k)
    out = output_metrics(fused, records[0])
    gold = _ids(records[0], "gold_doc_ids")
    seen = {chunk for r in records for chunk in _ids(r, "seen_doc_ids")}
    out["trajectory_recall"] = set_recall(seen, gold) if gold else 0.0
    return out
