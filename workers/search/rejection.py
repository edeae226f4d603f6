"""Rejection sampling for the SFT warm-up (docs/methods.md section 3, "SFT warm-up"): which generated search
trajectories to fine-tune on, and a count of why each of the others was dropped.

The report's rules, in the order they apply:
1. drop malformed trajectories: an error (no final answer, context overflow), a malformed tool call, or a final
   reply with no `<Document>` item;
2. drop trajectories whose trajectory recall far exceeds their output recall (the agent found the targets and
   did not report them): `trajectory_recall - output_recall > max_recall_gap`;
3. keep in full when trajectory recall > 0.5 and output recall > 0.4, but only one rollout per query when several
   reach that (the best output recall, then the fewest turns);
4. keep lower (non-zero) output recall "at a diminishing rate": with probability (output_recall / 0.4)^2 (the
   report gives no formula; this one halves the chance well before the bar and is seeded, so it is repeatable);
5. keep zero-recall trajectories, at most one per query, up to 5% of what is kept.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from workers.search.metrics import episode_metrics


class FilterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    trajectory_recall_min: float = Field(default=0.5, ge=0, le=1, description="Context-1: keep in full above 0.5")
    output_recall_min: float = Field(default=0.4, ge=0, le=1, description="Context-1: and output recall above 0.4")
    low_recall_exponent: float = Field(
        default=2.0, ge=0, description="Keep chance (recall / output_recall_min) ** this"
    )
    zero_recall_share: float = Field(default=0.05, ge=0, le=1, description="Context-1: at most 5% zero-recall")
    max_recall_gap: float = Field(
        default=0.5, ge=0, le=1, description="Drop when trajectory recall exceeds output by this"
    )
    seed: int = Field(default=0, ge=0)


DROP_REASONS = ("malformed", "recall_gap", "duplicate_high", "low_recall_sampled_out", "zero_recall_cap")


@dataclass
class FilterResult:
    kept: list[int] = field(default_factory=list)  # indices into the input, in input order
    buckets: Counter[str] = field(default_factory=Counter)  # kept by bucket: high, low, zero
    dropped: Counter[str] = field(default_factory=Counter)  # dropped by reason (DROP_REASONS)

    def report(self, total: int) -> dict[str, Any]:
        return {
            "generated": total,
            "kept": len(self.kept),
            "kept_by_bucket": {name: self.buckets.get(name, 0) for name in ("high", "low", "zero")},
            "dropped": {reason: self.dropped.get(reason, 0) for reason in DROP_REASONS},
        }


def _malformed(record: Mapping[str, Any]) -> bool:
    counts = record.get("counts") or {}
    return (
        bool(record.get("error")) or int(counts.get("malformed_tool_calls", 0)) > 0 or not record.get("output_doc_ids")
    )


def select_trajectories(records: Sequence[Mapping[str, Any]], config: FilterConfig | None = None) -> FilterResult:
    """Apply the rules above to search trajectory records (workers.search.environment); the query is the task id."""
    config = config or FilterConfig()
    rng = random.Random(f"rejection-{config.seed}")
    result = FilterResult()
    high: dict[str, list[tuple[float, int, int]]] = {}
    low: list[int] = []
    zero: dict[str, int] = {}
    for index, record in enumerate(records):
        if _malformed(record):
            result.dropped["malformed"] += 1
            continue
        metrics = episode_metrics(record)
        output, seen = metrics["output_recall"], metrics["trajectory_recall"]
        if seen - output > config.max_recall_gap:
            result.dropped["recall_gap"] += 1
            continue
        task = str(record.get("task_id", ""))
        if seen > config.trajectory_recall_min and output > config.output_recall_min:
            high.setdefault(task, []).append((-output, int(metrics["turns"]), index))
        elif output > 0:
            chance = min(1.0, output / max(config.output_recall_min, 1e-9)) ** config.low_recall_exponent
            if rng.random() < chance:
                low.append(index)
            else:
                result.dropped["low_recall_sampled_out"] += 1
        elif task in zero:
            result.dropped["zero_recall_cap"] += 1  # one zero-recall rollout per query
        else:
            zero[task] = index
    chosen: list[int] = []
    for candidates in high.values():
        candidates.sort()
        chosen.append(candidates[0][2])
        result.dropped["duplicate_high"] += len(candidates) - 1
    result.buckets["high"], result.buckets["low"] = len(chosen), len(low)
    # Zero-recall examples may make up at most `zero_recall_share` of the final set: z <= share * (n + z).
    others = len(chosen) + len(low)
    share = config.zero_recall_share
    allowed = int(share * others / (1 - share)) if share < 1 else len(zero)
    zeros = sorted(zero.values())
    rng.shuffle(zeros)
    result.buckets["zero"] = min(allowed, len(zeros))
    result.dropped["zero_recall_cap"] += max(0, len(zeros) - allowed)
    result.kept = sorted(chosen + low + zeros[:allowed])
    return result
