"""Per-token policy versions: how old each trained token is, the staleness bound applied token by token, and the
per-step histogram of token versions the run page charts.

A token's lag is the learner's version minus the version of the weights that sampled it. In sync mode every lag
is 0; in async mode a rollout generated while the previous step trained is one version old; with partial rollouts
(`config.partial_rollout`, AReaL's interruptible generation, verl's partial rollout) an engine takes new weights
between the turns of a running episode, so one episode mixes lags. The loss always uses each token's recorded
behaviour log-probability (`Sample.old_logprobs`, from the weights that sampled it); tokens whose lag is over
`max_staleness` are taken out of the loss (their loss-mask entry set to 0) and counted, never trained silently.

Metrics, every step (`versions/`):
- `versions/lag_<k>_share` for k = 0 .. max_staleness: share of the step's sampled tokens k versions old;
  `versions/over_bound_share` the share older than the bound (those are masked). Together: the histogram.
- `versions/masked_tokens`: sampled tokens taken out of the loss for being over the bound.
- `versions/mixed_samples`: episodes whose sampled tokens come from more than one version (partial rollouts).
- `versions/max_lag`: the oldest sampled token's lag (the `staleness` metric).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from workers.rl.rollout import Sample


def sampled_versions(sample: Sample) -> list[int]:
    """The policy version of each loss-masked token of `sample`, in order."""
    if not sample.token_versions:
        return [sample.policy_version] * sample.sampled_tokens
    return [v for v, m in zip(sample.token_versions, sample.loss_mask, strict=True) if m]


def bound_staleness(samples: Sequence[Sample], version: int, max_staleness: int) -> dict[str, float]:
    """Take the tokens more than `max_staleness` versions older than `version` (the learner's) out of the loss,
    in place, and return the step's `versions/` metrics (module docstring)."""
    lags: Counter[int] = Counter()
    masked = mixed = 0
    for sample in samples:
        versions = sampled_versions(sample)
        if len(set(versions)) > 1:
            mixed += 1
        lags.update(version - v for v in versions)
        if not versions or version - min(versions) <= max_staleness:
            continue
        if not sample.token_versions:  # one version for the whole episode: all of it is over the bound
            sample.loss_mask = [0] * len(sample.loss_mask)
            masked += len(versions)
            continue
        mask = list(sample.loss_mask)
        for i, (v, m) in enumerate(zip(sample.token_versions, mask, strict=True)):
            if m and version - v > max_staleness:
                mask[i] = 0
                masked += 1
        sample.loss_mask = mask
    total = sum(lags.values())
    metrics = {f"versions/lag_{k}_share": lags.get(k, 0) / total if total else 0.0 for k in range(max_staleness + 1)}
    over = sum(n for lag, n in lags.items() if lag > max_staleness)
    metrics["versions/over_bound_share"] = over / total if total else 0.0
    metrics["versions/masked_tokens"] = float(masked)
    metrics["versions/mixed_samples"] = float(mixed)
    metrics["versions/max_lag"] = float(max(lags, default=0))
    return metrics
