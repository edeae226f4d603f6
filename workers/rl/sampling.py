"""Which prompts a training step rolls out: DAPO's dynamic sampling (docs/methods.md P3) and Composer 2's hard-data
upsampling (docs/methods.md section 2).

Dynamic sampling: over-sample, leave out the groups whose rewards are all equal, refill the batch to its size.

P3 trains on groups with 0 < |{correct}| < G; for a general reward, a group has signal when its task rewards are
not all equal (an all-equal group has advantage 0 whatever the normalisation). The filter reads the task reward
the environment and reward config gave (`Sample.reward`), before the learner's shaping (the overlong penalty, a
KL reward penalty): DAPO filters on accuracy, not on the length-shaped score.

Pure Python over samples: the trainer passes a function that generates one more round of groups. The batch holds
exactly `target_groups` groups once filled: groups past the target are discarded (DAPO trims to the batch size).
After `max_rounds` generation rounds (the first included) a batch still short trains as it is, and the result
says by how much, so the run's metrics show it (`dynamic_sampling/short_groups`).

Hard-data upsampling (`TrainConfig.upsample_hard`, off by default): a task's weight grows with the mean *need*
(turns or sampled tokens) of its past rollouts relative to the mean over every task rolled out so far
(`upsample_weight`), and each step draws its prompts without replacement with probabilities proportional to the
weights (`weighted_order`). `HardUpsampler` keeps the running means and draws for the trainer.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from workers.rl.rollout import Sample

Need = Literal["turns", "tokens"]
"""What a rollout of a task needed: its turns (`Sample.num_turns`) or its sampled tokens (`Sample.sampled_tokens`)."""


def refill_order(
    num_rows: int,
    seed: int,
    step: int,
    round_: int,
    count: int,
    used: Sequence[int] = (),
    weights: Sequence[float] | None = None,
) -> list[int]:
    """Row indices for refill round `round_` of `step`: `count` rows drawn at random (seeded by seed, step and
    round, so a resumed run draws the same), preferring rows this step has not used yet. The regular data order
    (`workers.rl.trainer.data_order`) is left alone, so checkpoints' data positions stay valid.

    With `weights` (one per row, hard-data upsampling) the rows are drawn with those weights (`weighted_order`);
    without, uniformly as before."""
    if weights is not None:
        if len(weights) != num_rows:
            raise ValueError(f"{len(weights)} weights for {num_rows} rows")
        return weighted_order(
            weights, seed=seed, step=step, count=count, stream=f"dynamic-sampling:{round_}", used=used
        )
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
    weights: Sequence[float] | None = None,
) -> FilledBatch:
    """DAPO's dynamic sampling for one training step (what the trainer runs): `first` is the step's regular
    rollout of `first_rows`; each refill round draws `target_groups` fresh rows (`refill_order`, with the rows'
    `weights` when hard-data upsampling is on) and calls `generate(rows, round)` for their groups, until the batch
    is full or `max_rounds` rounds ran.

    Each refill round over-samples a whole batch of prompts, as DAPO's generation batches do, rather than just
    the missing groups: the share of groups with signal is unknown until they are scored."""
    used = list(first_rows)

    def more(round_: int) -> Sequence[Sample]:
        rows = refill_order(num_rows, seed, step, round_, target_groups, used, weights)
        used.extend(rows)
        return generate(rows, round_)

    return fill_batch(first, more, target_groups=target_groups, group_size=group_size, max_rounds=max_rounds)


# --- hard-data upsampling (Composer 2, docs/methods.md section 2) -----------------------------------------------------


def upsample_weight(need: float | None, mean_need: float, *, strength: float, max_weight: float) -> float:
    """A task's sampling weight: min(max_weight, 1 + strength * max(0, need / mean_need - 1)).

    Args:
        need: the mean need of the task's past rollouts (turns or sampled tokens); None for a task never rolled
            out, whose weight is 1.
        mean_need: the mean of `need` over every task rolled out so far; <= 0 gives weight 1 (nothing to compare).
        strength: >= 0, the weight's slope above the mean (0: every weight is 1).
        max_weight: >= 1, the cap.
    """
    if need is None or mean_need <= 0:
        return 1.0
    return min(max_weight, 1.0 + strength * max(0.0, need / mean_need - 1.0))


def sample_need(sample: Sample, by: Need) -> float:
    """What one rollout needed: its turns, or the tokens the policy sampled in it (summaries included)."""
    return float(sample.num_turns if by == "turns" else sample.sampled_tokens)


def weighted_order(
    weights: Sequence[float], *, seed: int, step: int, count: int, stream: str = "upsample", used: Sequence[int] = ()
) -> list[int]:
    """`count` row indices for `step`, drawn without replacement with probabilities proportional to `weights`.

    Efraimidis & Spirakis' one-pass form (Inf. Process. Lett. 97(5), 2006): row i gets the key log(u_i) / w_i with
    u_i ~ U(0, 1] (seeded by `seed`, `step` and `stream`, so a resumed run draws the same) and the rows with the
    largest keys win, in key order; this is the same as drawing one row at a time with probability proportional
    to its weight among the rows left. Rows in `used` (already drawn this step) are drawn only once every other
    row is; past all rows, another such pass over every row continues (a step asks for more prompts than there
    are tasks), so a row repeats only then. Weights must be > 0.
    """
    num_rows = len(weights)
    if num_rows == 0:
        raise ValueError("no rows to draw from")
    if any(not (w > 0 and math.isfinite(w)) for w in weights):
        raise ValueError("every weight must be a finite number > 0")
    seen = set(used)
    out: list[int] = []
    passes = 0
    while len(out) < count:
        rng = random.Random(f"{stream}:{seed}:{step}:{passes}")
        keys = [math.log(1.0 - rng.random()) / weights[i] for i in range(num_rows)]  # 1 - U[0,1) is in (0, 1]
        ranked = sorted(range(num_rows), key=lambda i: keys[i], reverse=True)
        if passes == 0 and seen:
            ranked = [i for i in ranked if i not in seen] + [i for i in ranked if i in seen]
        out += ranked[: count - len(out)]
        passes += 1
    return out


@dataclass
class TaskNeeds:
    """The running mean need of each task id over its rollouts (turns or sampled tokens, `sample_need`)."""

    by: Need
    totals: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def record(self, task_id: str, need: float) -> None:
        self.totals[task_id] = self.totals.get(task_id, 0.0) + need
        self.counts[task_id] = self.counts.get(task_id, 0) + 1

    def mean(self, task_id: str) -> float | None:
        count = self.counts.get(task_id, 0)
        return self.totals[task_id] / count if count else None

    def mean_over_tasks(self) -> float:
        """M: the mean over tasks rolled out so far of each task's mean need (each task counts once, however often
        it was drawn); 0.0 before any rollout."""
        means = [self.totals[t] / n for t, n in self.counts.items() if n]
        return sum(means) / len(means) if means else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"by": self.by, "totals": dict(self.totals), "counts": dict(self.counts)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TaskNeeds:
        """The needs `to_json` wrote; ValueError when they are malformed."""
        by = data.get("by")
        if by not in ("turns", "tokens"):
            raise ValueError(f"stored needs are by {by!r}, not turns or tokens")
        totals, counts = data.get("totals"), data.get("counts")
        if not isinstance(totals, dict) or not isinstance(counts, dict) or set(totals) != set(counts):
            raise ValueError("stored needs must hold totals and counts for the same task ids")
        return cls(
            by="turns" if by == "turns" else "tokens",
            totals={str(k): float(v) for k, v in totals.items()},
            counts={str(k): int(v) for k, v in counts.items()},
        )


class HardUpsampler:
    """Composer 2's hard-data upsampling for one run: the running needs of its tasks and each step's weighted draw.

    The weights change only through `record`, which the trainer calls once per step with every episode it
    generated (refill rounds included), so a step's refill rounds draw with the same weights as its first round.
    """

    def __init__(self, task_ids: Sequence[str], *, by: Need, strength: float, max_weight: float, seed: int) -> None:
        self.task_ids = [str(t) for t in task_ids]
        self.strength = strength
        self.max_weight = max_weight
        self.seed = seed
        self.needs = TaskNeeds(by=by)

    def record(self, samples: Iterable[Sample]) -> None:
        for sample in samples:
            self.needs.record(sample.task_id, sample_need(sample, self.needs.by))

    def weights(self) -> list[float]:
        """One weight per row (`upsample_weight`), in row order."""
        mean = self.needs.mean_over_tasks()
        return [
            upsample_weight(self.needs.mean(t), mean, strength=self.strength, max_weight=self.max_weight)
            for t in self.task_ids
        ]

    def draw(self, step: int, count: int) -> tuple[list[int], list[float]]:
        """`step`'s `count` rows (`weighted_order`) and their weights."""
        weights = self.weights()
        rows = weighted_order(weights, seed=self.seed, step=step, count=count)
        return rows, [weights[i] for i in rows]

    def metrics(self, drawn: Sequence[float]) -> dict[str, float]:
        """The step's sampling metrics from the weights of the rows it drew: their mean, the share drawn with a
        weight above 1 (tasks harder than the mean), the tasks rolled out so far and M, their mean need."""
        return {
            "sampling/upsample_weight_mean": sum(drawn) / len(drawn) if drawn else 1.0,
            "sampling/hard_share": sum(1 for w in drawn if w > 1.0) / len(drawn) if drawn else 0.0,
            "sampling/tasks_seen": float(len(self.needs.counts)),
            "sampling/need_mean": self.needs.mean_over_tasks(),
        }

    def state(self) -> dict[str, Any]:
        return self.needs.to_json()

    def load(self, state: Mapping[str, Any]) -> None:
        needs = TaskNeeds.from_json(state)
        if needs.by != self.needs.by:
            raise ValueError(f"stored needs are by {needs.by}, this run upsamples by {self.needs.by}")
        self.needs = needs


class Curriculum:
    """Context-1's easy -> hard curriculum (`workers.rl.config.CurriculumConfig`): each step's prompts are drawn
    with `weighted_order`, easy tasks weighing `skew` before the switch step and hard ones after. It answers as
    `HardUpsampler` does (`draw`, `weights`, `metrics`), so the trainer uses either the same way; it keeps no state
    (a resumed run draws the same rows: the draw is seeded by the step)."""

    def __init__(self, hops: Sequence[int], *, easy_at_most: int, switch_step: int, skew: float, seed: int) -> None:
        if not hops:
            raise ValueError("no rows to draw from")
        self.easy = [h <= easy_at_most for h in hops]
        self.switch_step = switch_step
        self.skew = skew
        self.seed = seed
        self._step = 0

    @classmethod
    def from_rows(cls, rows: Sequence[Mapping[str, Any]], config: Any, steps: int, seed: int) -> Curriculum:
        """From task rows and a `CurriculumConfig`; ValueError naming the first row without an integer `hops`."""
        hops: list[int] = []
        for number, row in enumerate(rows, start=1):
            value = row.get("hops")
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(
                    f"curriculum.by 'hops': task row {number} ({row.get('id', '?')}) has no integer 'hops'; "
                    "use tasks from the multi-hop generator, or set curriculum.by to 'off'"
                )
            hops.append(value)
        switch = round(config.switch_at * steps)
        return cls(hops, easy_at_most=config.easy_at_most, switch_step=switch, skew=config.skew, seed=seed)

    def weights(self) -> list[float]:
        """The row weights of the step last drawn."""
        favour_easy = self._step < self.switch_step
        return [self.skew if easy == favour_easy else 1.0 for easy in self.easy]

    def draw(self, step: int, count: int) -> tuple[list[int], list[float]]:
        """`step`'s `count` rows and their weights."""
        self._step = step
        weights = self.weights()
        rows = weighted_order(weights, seed=self.seed, step=step, count=count, stream="curriculum")
        return rows, [weights[i] for i in rows]

    def metrics(self, drawn: Sequence[float]) -> dict[str, float]:
        """The step's share of hard tasks, from the weights its rows were drawn with (skew > 1 tells them apart:
        hard rows weigh 1 in the easy phase and `skew` in the hard one)."""
        hard_weight = 1.0 if self._step < self.switch_step else self.skew
        return {
            "sampling/hard_share": sum(1 for w in drawn if w == hard_weight) / len(drawn) if drawn else 0.0,
            "sampling/curriculum_phase": 0.0 if self._step < self.switch_step else 1.0,
        }

    def record(self, samples: Sequence[Any]) -> None:
        """Nothing to learn from the episodes: the curriculum depends on the step only."""

    def state(self) -> dict[str, Any]:
        return {}
