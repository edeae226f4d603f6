"""The trajectory pages (namespace "runs"): one stored trajectory turn by turn, its token-level view, and the
group it was sampled in, side by side.

A training step stores every trajectory's full record by default (`trajectory_sample_rate`,
`workers.rl.token_view`): the environment's turns and tool calls, the sampled tokens with the engine's log-probs and
policy versions, the reward by term, the advantage in its group and the detector flags. The group view is how
people debug GRPO: a step's samples of one prompt, their rewards and advantages, their final answers.
"""

from __future__ import annotations

import json
import math
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from apps.accounts.decorators import needs
from apps.accounts.models import Capability
from apps.runs.models import Run, TrajectorySummary
from apps.runs.selectors import find_record, step_records
from workers.rewards.judge import JudgeUnavailable, stored_judgements_only
from workers.rewards.schema import validate_reward_spec
from workers.rewards.score import score_trajectory
from workers.trajectories import Trajectory

# Token colours by the sampled token's probability (exp of its log-prob): the less sure the policy was, the
# warmer. Bounds are probabilities, from the top.
PROBABILITY_BANDS = ((0.9, "p-high"), (0.5, "p-mid"), (0.1, "p-low"), (0.0, "p-rare"))


def _terms_table(terms: Any) -> list[tuple[str, Any]]:
    """(term, value) rows of a reward's terms, in the stored order; empty for anything but a mapping."""
    return [(str(k), v) for k, v in terms.items()] if isinstance(terms, dict) else []


def token_summary(record: dict[str, Any]) -> dict[str, Any] | None:
    """Counts for the token view's heading: sampled tokens, their mean log-prob, how many the policy sampled at
    probability under 0.1, and the policy versions seen. None when the record has no token view (stored before
    token views, or by an environment outside a rollout)."""
    view = record.get("tokens")
    if not isinstance(view, dict) or not isinstance(view.get("segments"), list):
        return None
    logprobs = [
        lp
        for seg in view["segments"]
        if isinstance(seg, dict)
        for lp in seg.get("logprob") or []
        if isinstance(lp, int | float)
    ]
    versions = sorted(
        {v for seg in view["segments"] if isinstance(seg, dict) for v in seg.get("version") or [] if v is not None}
    )
    return {
        "sampled": int(view.get("sampled") or len(logprobs)),
        "shown": sum(len(seg.get("text") or []) for seg in view["segments"] if isinstance(seg, dict)),
        "mean_logprob": sum(logprobs) / len(logprobs) if logprobs else None,
        "unlikely": sum(1 for lp in logprobs if lp < math.log(0.1)),
        "versions": versions,
        "truncated": bool(view.get("truncated")),
        "limit": view.get("limit"),
        # The learner's side (workers.rl.token_view.with_learner_logprobs): None where it did not score the sample.
        "learner": view.get("learner") if isinstance(view.get("learner"), dict) else None,
    }


def _band(logprob: float) -> str:
    probability = math.exp(logprob)
    return next(name for bound, name in PROBABILITY_BANDS if probability >= bound)


def token_spans(view: dict[str, Any]) -> list[SafeString]:
    """One HTML string per segment: each token a span, sampled ones coloured by probability with the log-prob,
    probability and policy version in its title, the environment's tokens greyed. Built here rather than in a
    template loop: a long episode has thousands of tokens."""
    out: list[SafeString] = []
    for seg in view.get("segments") or []:
        if not isinstance(seg, dict):
            continue
        texts, sampled = seg.get("text") or [], seg.get("sampled") or []
        logprobs, versions = seg.get("logprob") or [], seg.get("version") or []
        learner = seg.get("learner_logprob") or []
        bound = math.log(float((view.get("learner") or {}).get("cap") or 2.0))
        parts: list[str] = []
        for i, text in enumerate(texts):
            piece = escape(str(text))
            lp = logprobs[i] if i < len(logprobs) else None
            if i < len(sampled) and sampled[i] and isinstance(lp, int | float):
                version = versions[i] if i < len(versions) else None
                title = f"log-prob {lp:.3f} · p {math.exp(lp):.3f}"
                if version is not None:
                    title += f" · policy v{version}"
                scored = learner[i] if i < len(learner) else None
                flag = ""
                if isinstance(scored, int | float):
                    delta = scored - lp
                    title += f" · learner log-prob {scored:.3f} · δ {delta:+.3f}"
                    flag = " mismatch" if abs(delta) > bound else ""
                parts.append(f'<span class="tok {_band(lp)}{flag}" title="{title}">{piece}</span>')
            else:
                parts.append(f'<span class="tok env" title="environment (not trained)">{piece}</span>')
        out.append(mark_safe("".join(parts)))  # noqa: S308 - every piece is escaped above
    return out


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
    context: dict[str, Any] = {
        "run": run,
        "summary": summary,
        "record": record,
        "flags": summary.flags.all(),
        "terms_table": _terms_table(summary.terms),
        "tokens": token_summary(record) if record is not None else None,
    }
    if record is not None:
        breakdown: list[dict[str, Any]] = []
        reward = None
        result = None
        if run.reward_version is not None:
            spec = validate_reward_spec(run.reward_version.spec)
            try:
                with stored_judgements_only():  # a web request never loads a judge model
                    result = score_trajectory(spec, Trajectory.model_validate(record))
            except JudgeUnavailable as exc:
                context["rescore_problem"] = str(exc)
        if result is not None:
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


@needs(Capability.READ)
def trajectory_tokens(request: HttpRequest, run_id: int, trajectory_id: str) -> HttpResponse:
    """The token-level view of one stored trajectory (an htmx fragment on the trajectory page; a page of its own
    when opened directly)."""
    run = get_object_or_404(Run, pk=run_id)
    summary = TrajectorySummary.objects.filter(run=run, trajectory_id=trajectory_id).first()
    if summary is None:
        raise Http404(f"run {run.pk} has no trajectory {trajectory_id!r}")
    record = find_record(summary.storage_uri, trajectory_id) if summary.storage_uri else None
    if record is None or token_summary(record) is None:
        raise Http404(f"trajectory {trajectory_id!r} of run {run.pk} has no stored token view")
    context = {
        "run": run,
        "summary": summary,
        "tokens": token_summary(record),
        "segments": token_spans(record["tokens"]),
        "fragment": request.headers.get("HX-Request") == "true",
    }
    return render(request, "runs/_tokens.html" if context["fragment"] else "runs/tokens.html", context)


def _final_text(record: dict[str, Any]) -> str:
    """What the sample ended with: its answer, else its last assistant message."""
    if record.get("answer"):
        return str(record["answer"])
    for turn in reversed(record.get("turns") or []):
        if isinstance(turn, dict) and turn.get("role") == "assistant":
            return str(turn.get("content") or "")
    return ""


@needs(Capability.READ)
def group_detail(request: HttpRequest, run_id: int, step: int, group: int) -> HttpResponse:
    """A step's group side by side: the samples of one prompt, their rewards, advantages, terms, lengths, flags and
    final answers."""
    run = get_object_or_404(Run, pk=run_id)
    stored = step_records(run, step)
    records = [r for r in stored if r.get("group") == group]
    if not records:
        raise Http404(f"run {run.pk} stored no trajectory of group {group} at step {step}")
    summaries = {
        s.trajectory_id: s
        for s in TrajectorySummary.objects.filter(run=run, trajectory_id__in=[str(r.get("id")) for r in records])
    }
    rewards: list[float] = [float(r["reward"]) for r in records if isinstance(r.get("reward"), int | float)]
    samples: list[dict[str, Any]] = []
    for record in records:
        tokens = token_summary(record)
        samples.append(
            {
                "id": str(record.get("id")),
                "summary": summaries.get(str(record.get("id"))),
                "reward": record.get("reward"),
                "advantage": record.get("advantage"),
                "terms": _terms_table(record.get("terms")),
                "turns": (record.get("counts") or {}).get("turns"),
                "tool_calls": (record.get("counts") or {}).get("tool_calls"),
                "sampled_tokens": record.get("sampled_tokens"),
                "mean_logprob": tokens["mean_logprob"] if tokens else None,
                "policy_version": record.get("policy_version"),
                "flags": record.get("flags") or [],
                "error": record.get("error"),
                "final": _final_text(record),
            }
        )
    term_names = list(dict.fromkeys(name for s in samples for name, _ in s["terms"]))
    term_rows = [(name, [dict(s["terms"]).get(name) for s in samples]) for name in term_names]
    context = {
        "run": run,
        "step": step,
        "group": group,
        "task_id": records[0].get("task_id"),
        "samples": samples,
        "term_rows": term_rows,
        "reward_spread": (max(rewards) - min(rewards)) if rewards else None,
        "signal": len(set(rewards)) > 1,
        "other_groups": sorted({int(r["group"]) for r in stored if isinstance(r.get("group"), int)}),
    }
    return render(request, "runs/group.html", context)
