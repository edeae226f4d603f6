"""The trajectory page: one stored trajectory, turn by turn, with its reward re-scored by the run's reward config.

For a search trajectory (workers.envs.search) it shows each tool call and its arguments, the passages returned
(chunk id, score, which retrievers found them), pruned chunks struck through, the token usage across turns, the
final output items against the gold chunks, the reward broken down by term, and the detector flags. Live runs
keep the full record of the first `trajectory_samples_per_step` trajectories of each step; re-scoring runs point
at the uploaded dataset file, so every re-scored trajectory opens.
"""

from __future__ import annotations

import json
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from apps.accounts.models import Capability
from apps.common.pages import needs
from apps.runs.models import Run, TrajectorySummary
from apps.runs.selectors import find_record
from workers.rewards.schema import validate_reward_spec
from workers.rewards.score import score_trajectory
from workers.trajectories import Trajectory


def _turn_views(record: dict[str, Any]) -> list[dict[str, Any]]:
    pruned = set(record.get("pruned_chunk_ids") or [])
    gold = set(record.get("gold_doc_ids") or [])
    views: list[dict[str, Any]] = []
    for turn in record.get("turns") or []:
        if not isinstance(turn, dict):
            continue
        results = [
            {
                **r,
                "pruned": r.get("chunk_id") in pruned,
                "gold": r.get("chunk_id") in gold,
                "retrievers": ", ".join(f"{k} #{v}" for k, v in sorted((r.get("ranks") or {}).items())),
            }
            for r in turn.get("results") or []
            if isinstance(r, dict)
        ]
        views.append(
            {
                "role": turn.get("role", ""),
                "tool": turn.get("tool"),
                "args": json.dumps(turn.get("args"), ensure_ascii=False) if turn.get("args") else "",
                "content": turn.get("content", ""),
                "results": results,
                "pruned": turn.get("pruned") or [],
                "error": turn.get("error"),
            }
        )
    return views


@needs(Capability.READ)
def trajectory_detail(request: HttpRequest, run_id: int, trajectory_id: str) -> HttpResponse:
    run = get_object_or_404(Run.objects.select_related("reward_version"), pk=run_id)
    summary = TrajectorySummary.objects.filter(run=run, trajectory_id=trajectory_id).first()
    if summary is None:
        raise Http404(f"run {run.pk} has no trajectory {trajectory_id!r}")
    record = find_record(summary.storage_uri, trajectory_id) if summary.storage_uri else None
    context: dict[str, Any] = {"run": run, "summary": summary, "record": record, "flags": summary.flags.all()}
    if record is not None:
        breakdown: list[dict[str, Any]] = []
        reward = None
        if run.reward_version is not None:
            spec = validate_reward_spec(run.reward_version.spec)
            result = score_trajectory(spec, Trajectory.model_validate(record))
            reward = result
            for term in spec.terms:
                value = result.terms[term.name]
                breakdown.append(
                    {
                        "name": term.name,
                        "kind": term.kind,
                        "value": value,
                        "weight": term.weight,
                        "contribution": term.weight * value * (1 if term.kind == "gain" else -1),
                    }
                )
        gold = set(record.get("gold_doc_ids") or [])
        answer_chunks = set(record.get("answer_doc_ids") or [])
        items = record.get("output_items") or [
            {"id": i, "justification": ""} for i in record.get("output_doc_ids") or []
        ]
        context.update(
            {
                "turns": _turn_views(record),
                "breakdown": breakdown,
                "rescored": reward,
                "outputs": [
                    {**item, "gold": item.get("id") in gold, "answer": item.get("id") in answer_chunks}
                    for item in items
                    if isinstance(item, dict)
                ],
                "missed": sorted(gold - {str(i.get("id")) for i in items if isinstance(i, dict)}),
                "usage": record.get("token_usage") or [],
                "budget": record.get("token_budget"),
            }
        )
    return render(request, "runs/trajectory.html", context)
