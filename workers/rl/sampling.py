"""DAPO's dynamic sampling (methods.md P3): over-sample, leave out the groups whose rewards are all equal, refill
the batch to its size.

P3 trains on groups with 0 < |{correct}| < G; for a general reward, a group has signal when its task rewards are
not all equal (an all-equal group has advantage 0 whatever the normalisation). The filter reads the task reward
the environment and reward config gave (`Sample.reward`), before the learner's shaping (the overlong penalty, a
KL reward penalty): DAPO filters on accuracy, not on the length-shaped score.

Pure Python over samples: the trainer passes a function that generates one more round of groups. The batch holds
exactly `target_groups` groups once filled: groups past the target are discarded (DAPO trims to the batch size).
After `max_rounds` generation rounds (the first included) a batch still short trains as it is, and the result
says by how much, so the run's metrics show it (`dynamic_sampling/short_groups`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from workers.rl.rollout import Sample


def refill_order(num_rows: int, seed: int, step: int, round_: int, count: int, used: Sequence[int] = ()) -> list[int]:
    """Row indices for refill round `round_` of `step`: `count` rows drawn at random (seeded by seed, step and
    round, so a resumed run draws the same), preferring rows this step has not used yet. The regular data order
    (`workers.jobs.train.data_order`) is left alone, so checkpoints' data positions stay valid."""
    rng = random.Random(f"dynamic-sampling:{seed}:{step}:{round_}")
    seen = set(used)
    fresh = [i for i in range(num_rows) if i not in seen]
    rng.shuffle(fresh)
    out = fresh[:count]
    while len(out) < count:  # fewer fresh rows than asked: repeat rows, still at random
        out.append(rng.randrange(num_rows))
    return out


def groups_with_signal(rewards: Sequence[float], group_size: int) -> list[bool]:
    """For each contiguous group of `group_size` rewards: True when they are not all exactly equal."""
    if group_size < 1 or len(rewards) % group_size:
        raise ValueError(f"group_size={group_size} must be >= 1 and divide the {len(rewards)} rewards")
    return [
        any(r != rewards[start] for r in rewards[start : start + group_size])
        for start in range(0, len(rewards), group_size)
    ]


@dataclass
class FilledBatch:
    """The batch dynamic sampling hands the learner, and what it took.

    Attributes:
        samples: the kept groups' samples, contiguous, at most `target_groups` groups.
        generated: every sample generated this step (every round), for reporting trajectories.
        rounds: generation rounds used, the first included.
        generated_groups: groups generated over all rounds.
        filtered_groups: groups left out because their rewards were all equal.
        surplus_groups: groups with signal past the batch size, discarded.
        short_groups: groups the batch still lacks after `max_rounds` rounds (0 when full).
    """

    samples: list[Sample]
    generated: list[Sample]
    rounds: int
    generated_groups: int
    filtered_groups: int
    surplus_groups: int
    short_groups: int

    def metrics(self) -> dict[str, float]:
        return {
            "dynamic_sampling/rounds": float(self.rounds),
            "dynamic_sampling/generated_groups": float(self.generated_groups),
            "dynamic_sampling/filtered_groups": float(self.filtered_groups),
            "dynamic_sampling/surplus_groups": float(self.surplus_groups),
            "dynamic_sampling/short_groups": float(self.short_groups),
        }


def fill_batch(
    first: Sequence[Sample],
    more: Callable[[int], Sequence[Sample]],
    *,
    target_groups: int,
    group_size: int,
    max_rounds: int,
) -> FilledBatch:
    """Keep the groups of `first` that have signal; while fewer than `target_groups` are kept and fewer than
    `max_rounds` rounds ran, call `more(round)` (round = 1, 2, ...) for another round of groups and keep theirs.

    Args:
        first: the step's first round, contiguous groups of `group_size`.
        more: generates the next round (the trainer draws fresh prompts for it).
        target_groups: the batch size in groups (`prompts_per_step`).
        group_size: G.
        max_rounds: the most generation rounds, the first included; >= 1.
    """
    if max_rounds < 1:
        raise ValueError(f"max_rounds must be >= 1, got {max_rounds}")
    kept: list[list[Sample]] = []
    generated: list[Sample] = []
    generated_groups = filtered = 0
    rounds = 0
    batch: Sequence[Sample] = first
    while True:
        rounds += 1
        generated += batch
        signal = groups_with_signal([s.reward for s in batch], group_size)
        generated_groups += len(signal)
        filtered += signal.count(False)
        kept += [list(batch[g * group_size : (g + 1) * group_size]) for g, ok in enumerate(signal) if ok]
        if len(kept) >= target_groups or rounds >= max_rounds:
            break
        batch = more(rounds)
    surplus = max(len(kept) - target_groups, 0)
    chosen = kept[:target_groups]
    return FilledBatch(
        samples=[s for group in chosen for s in group],
        generated=generated,
        rounds=rounds,
        generated_groups=generated_groups,
        filtered_groups=filtered,
        surplus_groups=surplus,
        short_groups=target_groups - len(chosen),
    )


def dynamic_sampling_batch(
    first: Sequence[Sample],
    generate: Callable[[list[int], int], Sequence[Sample]],
    *,
    num_rows: int,
    seed: int,
    step: int,
    first_rows: Sequence[int],
    target_groups: int,
    group_size: int,
    max_rounds: int,
) -> FilledBatch:
    """DAPO's dynamic sampling for one training step (what the trainer runs): `first` is the step's regular
    rollout of `first_rows`; each refill round draws `target_groups` fresh rows (`refill_order`) and calls
    `generate(rows, round)` for their groups, until the batch is full or `max_rounds` rounds ran.

    Each refill round over-samples a whole batch of prompts, as DAPO's generation batches do, rather than just
    the missing groups: the share of groups with signal is unknown until they are scored."""
    used = list(first_rows)

    def more(round_: int) -> Sequence[Sample]:
        rows = refill_order(num_rows, seed, step, round_, target_groups, used)
        used.extend(rows)
        return generate(rows, round_)

    return fill_batch(first, more, target_groups=target_groups, group_size=group_size, max_rounds=max_rounds)
