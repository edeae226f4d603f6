"""What a stored trajectory record carries for the trajectory page's token-level view and its group view.

`token_view` turns an episode's completion regions (each segment's `ids[start:]`: the policy's sampled tokens and,
between them, the environment's observation tokens) into text pieces with, for each sampled token, the rollout
engine's log-prob and the policy version that sampled it. The page shows the sampled tokens coloured by log-prob
and the observation tokens greyed, so a reader sees what the learner trains on and how sure the policy was.

`full_record` is what a training step writes for each stored trajectory: the environment's record plus the step,
the group, the reward and its terms, the advantage in its group, the policy version and the detector flags.

`stored_indices` decides which of a step's trajectories are written in full: every one by default
(`trajectory_sample_rate` 1.0); below 1.0 a fixed share of the step's groups, whole groups so the group view
stays complete, plus every flagged trajectory.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

# Above this many completion tokens an episode's token view is cut (the record says so): a page renders one span a
# token, and a stored record should stay a few hundred kilobytes.
TOKEN_VIEW_LIMIT = 16_384


def token_view(
    tokenizer: Any,
    segments: Sequence[tuple[list[int], int]],
    loss_mask: Sequence[int],
    logprobs: Sequence[float],
    versions: Sequence[int],
    *,
    limit: int = TOKEN_VIEW_LIMIT,
) -> dict[str, Any]:
    """The completion regions of `segments` as `{"segments": [{"text", "sampled", "logprob", "version"}], ...}`.

    `loss_mask`, `logprobs` and `versions` are aligned with the concatenated completion regions (as a `Sample`
    holds them). `text[i]` is token i decoded on its own (a multi-byte character split over tokens shows as a
    replacement character on each piece). `logprob[i]` and `version[i]` are None for tokens the policy did not
    sample. At most `limit` tokens in all; `truncated` says whether some were left out."""
    out: list[dict[str, Any]] = []
    position = 0
    kept = 0
    truncated = False
    for ids, start in segments:
        region = list(ids[start:])
        room = max(limit - kept, 0)
        if len(region) > room:
            truncated = True
        shown = region[:room]
        masks = list(loss_mask[position : position + len(shown)])
        lps = list(logprobs[position : position + len(shown)])
        vers = list(versions[position : position + len(shown)])
        position += len(region)
        kept += len(shown)
        pieces = tokenizer.batch_decode([[t] for t in shown], skip_special_tokens=False) if shown else []
        sampled = [int(masks[i]) if i < len(masks) else 0 for i in range(len(shown))]
        out.append(
            {
                "offset": position - len(region),  # where this region starts in the Sample's per-token arrays
                "text": pieces,
                "sampled": sampled,
                "logprob": [
                    round(float(lps[i]), 4) if sampled[i] and i < len(lps) else None for i in range(len(shown))
                ],
                "version": [int(vers[i]) if sampled[i] and i < len(vers) else None for i in range(len(shown))],
            }
        )
    return {"segments": out, "sampled": int(sum(loss_mask)), "truncated": truncated, "limit": limit}


def stored_indices(flagged: Sequence[bool], group_size: int, rate: float, fixed_count: int | None = None) -> list[int]:
    """Indices of a step's samples whose full record is written, in order.

    `fixed_count` (a run's `trajectory_samples_per_step`, set by runs created before the rate existed) keeps the
    first that many. Otherwise `rate` of the step's groups, rounded up (at least one group when `rate` > 0), whole
    groups from the first. Every flagged sample is kept either way: the review queue opens those."""
    count = len(flagged)
    if fixed_count is not None:
        chosen = set(range(min(fixed_count, count)))
    elif rate >= 1.0:
        chosen = set(range(count))
    else:
        size = max(group_size, 1)
        groups = math.ceil(count / size)
        keep_groups = math.ceil(groups * rate) if rate > 0 else 0
        chosen = set(range(min(keep_groups * size, count)))
    chosen.update(i for i, f in enumerate(flagged) if f)
    return sorted(chosen)


def with_learner_logprobs(view: dict[str, Any], learner: Sequence[float], cap: float = 2.0) -> dict[str, Any]:
    """`view` with the learner's log-prob of each sampled token beside the engine's (`learner_logprob`, None for the
    environment's tokens) and the sample's gap: mean and max |δ| (δ = learner − engine, nats) and how many tokens
    have a ratio exp(δ) outside [1/cap, cap] (docs/methods.md P7; C = 2 as the mismatch metrics). `learner` is
    aligned with the Sample's per-token arrays; a view stored before segment offsets existed is returned as is."""
    segments = view.get("segments") or []
    if any("offset" not in seg for seg in segments):
        return view
    deltas: list[float] = []
    shown = []
    for seg in segments:
        scored = []
        for i, lp in enumerate(seg["logprob"]):
            at = seg["offset"] + i
            mine = learner[at] if lp is not None and at < len(learner) else None
            scored.append(mine)
            if mine is not None:
                deltas.append(mine - lp)
        shown.append({**seg, "learner_logprob": scored})
    bound = math.log(cap)
    gap = {
        "tokens": len(deltas),
        "mean_abs_delta": round(sum(abs(d) for d in deltas) / len(deltas), 5) if deltas else None,
        "max_abs_delta": round(max(abs(d) for d in deltas), 5) if deltas else None,
        "outside_cap": sum(1 for d in deltas if abs(d) > bound),
        "cap": cap,
    }
    return {**view, "segments": shown, "learner": gap}


def full_record(
    trajectory: dict[str, Any],
    *,
    step: int,
    group: int,
    reward: float,
    terms: dict[str, float],
    advantage: float | None,
    policy_version: int,
    sampled_tokens: int,
    flags: Sequence[dict[str, Any]],
    learner_logprobs: Sequence[float] | None = None,
    mismatch_cap: float = 2.0,
) -> dict[str, Any]:
    """The record a training step writes: the environment's trajectory plus what the trajectory and group views
    show beside it (`workers.trajectories` ignores these extra keys); with `learner_logprobs`, its token view also
    carries the learner's log-prob of each sampled token and the sample's train-inference gap."""
    extra: dict[str, Any] = {}
    if learner_logprobs is not None and isinstance(trajectory.get("tokens"), dict):
        extra["tokens"] = with_learner_logprobs(trajectory["tokens"], learner_logprobs, mismatch_cap)
    return {
        **trajectory,
        **extra,
        "step": step,
        "group": group,
        "reward": reward,
        "terms": terms,
        "advantage": advantage,
        "policy_version": policy_version,
        "sampled_tokens": sampled_tokens,
        "flags": list(flags),
    }
