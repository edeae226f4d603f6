"""The reward config: a validated, hashable list of weighted terms (docs/methods.md section 3, Context-1 X2-X5).

A `RewardSpec` is plain JSON, e.g.

    {"terms": [{"type": "f_beta", "weight": 0.7, "beta": 4},
               {"type": "trajectory_recall", "weight": 0.3},
               {"type": "final_answer_bonus"},
               {"type": "prune_penalty"},
               {"type": "turn_penalty"}],
     "floor": 0.0, "cap_at_pre_penalty": true}

Every term has a `type`, an optional unique `name` (default: the type) and a finite `weight` (default 1.0).
Terms are gains (added) or penalties (magnitudes >= 0, subtracted); `workers.rewards.score` combines them.

A term type is one class here: its fields, its `value` and what that value `reads`. Everything listed per type
(`TERM_CLASSES`, `TERM_TYPES`, `TERM_INPUTS`, the `TermSpec` union) derives from `TERM_CLASSES`, so adding a term
is adding its class (and its formula in `terms`) and naming it there.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails, PydanticCustomError

from workers.models.registry import model_name_problems
from workers.rewards import terms as formulas
from workers.rewards.judge import DEFAULT_CRITERIA, judge_trajectory
from workers.rewards.swarm_stats import swarm_stats
from workers.rewards.table import table_metrics
from workers.trajectories import Trajectory, Turn

TermKind = Literal["gain", "penalty"]


@dataclass(frozen=True)
class TermInputs:
    """What one reward term reads: any one of `fields` (sets of trajectory fields), and the `tools` whose calls
    it counts.

    Declared beside each term's `value` so the run-creation check (`workers.envs.base.check_reward_compatible`)
    can refuse a reward an environment cannot feed, and a term over a tool the environment never offers (a
    constant, so almost surely a mistake), without this package knowing any environment.
    """

    fields: tuple[frozenset[str], ...]
    tools: frozenset[str] = frozenset()


_ANSWER = frozenset({"answer", "gold_answers"})

# Names become dict keys and metric names ("term/<name>", at most 100 characters on the wire), hence the limits.
_NAME_PATTERN = r"^[A-Za-z0-9_.\-]+$"
_NAME_MAX = 64


class _Term(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: ClassVar[TermKind]
    reads: ClassVar[TermInputs]

    type: str
    name: str = Field(default="", max_length=_NAME_MAX, description="Unique within the spec; defaults to the type")
    weight: float = Field(default=1.0, allow_inf_nan=False, description="Multiplies the term's value")

    @model_validator(mode="before")
    @classmethod
    def _name_defaults_to_type(cls, data: Any) -> Any:
        # Filling the default name at validation time (rather than on read) keeps model_dump, and so
        # spec_hash, identical whether the name was omitted or written out as the type.
        if isinstance(data, dict) and data.get("name") in (None, ""):
            return {**data, "name": cls.model_fields["type"].default}
        return data

    @field_validator("name")
    @classmethod
    def _name_charset(cls, value: str) -> str:
        if not re.fullmatch(_NAME_PATTERN, value):
            raise ValueError(f"use only letters, digits, '_', '.' and '-' (at most {_NAME_MAX} characters)")
        return value

    def value(self, trajectory: Trajectory) -> float:
        """Unweighted value of this term for one trajectory (dimensionless; penalties are magnitudes >= 0)."""
        raise NotImplementedError

    def scale(self, step: int | None) -> float:
        """What the weight is multiplied by at training step `step` (0-based; None outside training): 1, unless the
        term anneals (`Anneal`)."""
        return 1.0

    def drops(self, trajectory: Trajectory) -> bool:
        """Whether this term leaves the trajectory out: it has no reward to train on (a served session without
        feedback under `no_feedback="drop"`). `workers.rewards.score` marks the result `dropped`."""
        return False


class ExactMatchTerm(_Term):
    """1.0 if the stripped answer equals any stripped gold answer."""

    kind: ClassVar[TermKind] = "gain"
    reads: ClassVar[TermInputs] = TermInputs((_ANSWER,))
    type: Literal["exact_match"] = "exact_match"
    case_sensitive: bool = True

    def value(self, trajectory: Trajectory) -> float:
        return formulas.exact_match(trajectory.answer, trajectory.gold_answers, case_sensitive=self.case_sensitive)


class NormalizedMatchTerm(_Term):
    """1.0 if the answer equals any gold answer after SQuAD normalisation."""

    kind: ClassVar[TermKind] = "gain"
    reads: ClassVar[TermInputs] = TermInputs((_ANSWER,))
    type: Literal["normalized_match"] = "normalized_match"

    def value(self, trajectory: Trajectory) -> float:
        return formulas.normalized_match(trajectory.answer, trajectory.gold_answers)


class FBetaTerm(_Term):
    """F-beta of the output doc ids against the gold doc ids (docs/methods.md X3); 0.0 when there are no gold docs."""

    kind: ClassVar[TermKind] = "gain"
    reads: ClassVar[TermInputs] = TermInputs((frozenset({"output_doc_ids", "gold_doc_ids"}),))
    type: Literal["f_beta"] = "f_beta"
    beta: float = Field(
        default=4.0, ge=0, allow_inf_nan=False, description="Recall weighs beta² times precision; 0 is precision"
    )

    def value(self, trajectory: Trajectory) -> float:
        # docs/methods.md X3: F_β over the final output set
        return formulas.set_f_beta(trajectory.output_doc_ids, trajectory.gold_doc_ids, self.beta)


class TrajectoryRecallTerm(_Term):
    """Fraction of gold docs seen anywhere in the full unpruned trajectory (docs/methods.md X2's r_traj)."""

    kind: ClassVar[TermKind] = "gain"
    reads: ClassVar[TermInputs] = TermInputs((frozenset({"seen_doc_ids", "gold_doc_ids"}),))
    type: Literal["trajectory_recall"] = "trajectory_recall"

    def value(self, trajectory: Trajectory) -> float:
        # docs/methods.md X2: r_traj = |seen ∩ gold| / |gold|
        return formulas.set_recall(trajectory.seen_doc_ids, trajectory.gold_doc_ids)


class FinalAnswerBonusTerm(_Term):
    """`bonus` if the output contains a chunk that directly contains the answer (docs/methods.md X2's r_fa)."""

    kind: ClassVar[TermKind] = "gain"
    # formulas.final_answer_found: the answer chunk ids when the task has them, else the answer text
    reads: ClassVar[TermInputs] = TermInputs((frozenset({"output_doc_ids", "answer_doc_ids"}), _ANSWER))
    type: Literal["final_answer_bonus"] = "final_answer_bonus"
    bonus: float = Field(default=1.0, allow_inf_nan=False)

    def value(self, trajectory: Trajectory) -> float:
        found = formulas.final_answer_found(
            trajectory.output_doc_ids, trajectory.answer_doc_ids, trajectory.answer, trajectory.gold_answers
        )
        # docs/methods.md X2: r_fa = +bonus when the final answer is found
        return self.bonus if found else 0.0


class PrunePenaltyTerm(_Term):
    """Penalty for prune_chunks calls beyond `free_calls` in each consecutive run, capped per trajectory (X4)."""

    kind: ClassVar[TermKind] = "penalty"
    reads: ClassVar[TermInputs] = TermInputs((frozenset({"turns"}),), tools=frozenset({formulas.PRUNE_TOOL}))
    type: Literal["prune_penalty"] = "prune_penalty"
    per_call: float = Field(default=0.1, ge=0, allow_inf_nan=False)
    free_calls: int = Field(default=3, ge=0)
    cap: float = Field(default=0.5, ge=0, allow_inf_nan=False, description="Bound on the whole trajectory's total")

    def value(self, trajectory: Trajectory) -> float:
        # docs/methods.md X4: prune penalty
        return formulas.prune_penalty(
            trajectory.tool_calls, per_call=self.per_call, free_calls=self.free_calls, cap=self.cap
        )


class TurnPenaltyTerm(_Term):
    """Penalty rising linearly from 0 at `start` assistant turns to `max_penalty` at `start + ramp` (X5)."""

    kind: ClassVar[TermKind] = "penalty"
    reads: ClassVar[TermInputs] = TermInputs((frozenset({"turns"}),))
    type: Literal["turn_penalty"] = "turn_penalty"
    start: int = Field(default=64, ge=0, description="Turns allowed before the penalty starts")
    ramp: int = Field(default=64, ge=1, description="Turns over which the penalty rises to max_penalty")
    max_penalty: float = Field(default=0.5, ge=0, allow_inf_nan=False)

    def value(self, trajectory: Trajectory) -> float:
        # docs/methods.md X5: turn penalty
        return formulas.turn_penalty(
            trajectory.num_turns, start=self.start, ramp=self.ramp, max_penalty=self.max_penalty
        )


class PassedTestsTerm(_Term):
    """Coding outcome reward: the fraction of the task's tests the final code passed in the sandbox (0 when the
    code never ran, timed out or crashed: a sandbox failure is never a pass)."""

    kind: ClassVar[TermKind] = "gain"
    reads: ClassVar[TermInputs] = TermInputs((frozenset({"tests_passed"}),))
    type: Literal["tests_passed"] = "tests_passed"

    def value(self, trajectory: Trajectory) -> float:
        return trajectory.tests_passed or 0.0


class HiddenTestsTerm(_Term):
    """Coding agent outcome reward: the hidden tests run on the final workspace after `finish` (issue 17). "fraction"
    pays the share of hidden tests that pass; "all_or_nothing" pays 1 only when every one does (SWE-bench's
    "resolved"). Reads the hidden-test report, or `tests_passed` (the same fraction) when a record has no report."""

    kind: ClassVar[TermKind] = "gain"
    reads: ClassVar[TermInputs] = TermInputs((frozenset({"hidden_tests"}), frozenset({"tests_passed"})))
    type: Literal["hidden_tests"] = "hidden_tests"
    mode: Literal["fraction", "all_or_nothing"] = Field(
        default="all_or_nothing",
        description="'all_or_nothing': 1 only when every hidden test passes; 'fraction': the share that pass",
    )

    def value(self, trajectory: Trajectory) -> float:
        report = trajectory.hidden_tests
        if report is not None and report.fraction is not None:
            return formulas.hidden_tests_reward(report.fraction, report.resolved, mode=self.mode)
        return formulas.hidden_tests_reward(trajectory.tests_passed, None, mode=self.mode)


def _is_malformed_turn(turn: Turn) -> bool:
    """A tool message answering a call the environment could not run (the tool-use environments' convention: an
    "error: ..." tool message without a tool name)."""
    return turn.role != "assistant" and not turn.tool and turn.content.lstrip().lower().startswith("error")


def _is_failed_call_turn(turn: Turn) -> bool:
    """A tool message for a well-formed call that failed while running ("error: ..." with the tool's name)."""
    return turn.role != "assistant" and bool(turn.tool) and turn.content.lstrip().lower().startswith("error")


class BrokenToolCallsTerm(_Term):
    """Penalty for broken tool calls (Composer 2 learned to emit them to dodge negative reward): `per_call` per
    malformed call, plus `per_tool_error` per well-formed call that failed while running (0 by default: an honest
    agent hits a few), the total capped at `cap`. Counted from the turns."""

    kind: ClassVar[TermKind] = "penalty"
    reads: ClassVar[TermInputs] = TermInputs((frozenset({"turns"}),))
    type: Literal["broken_tool_calls"] = "broken_tool_calls"
    per_call: float = Field(default=0.1, ge=0, allow_inf_nan=False, description="Per malformed tool call")
    per_tool_error: float = Field(
        default=0.0, ge=0, allow_inf_nan=False, description="Per well-formed call that failed while running"
    )
    cap: float = Field(default=0.5, ge=0, allow_inf_nan=False, description="Bound on the whole trajectory's total")

    def value(self, trajectory: Trajectory) -> float:
        malformed = sum(1 for turn in trajectory.turns if _is_malformed_turn(turn))
        failed = sum(1 for turn in trajectory.turns if _is_failed_call_turn(turn))
        return formulas.broken_tool_call_penalty(
            malformed, failed, per_call=self.per_call, per_tool_error=self.per_tool_error, cap=self.cap
        )


class TodoLeftTerm(_Term):
    """Penalty for unfinished work left in the final diff (Composer 2: "to-dos created then left unfinished"):
    `per_line` for each line the diff adds holding TODO, FIXME or XXX (a marked line the diff only carries over
    does not count), capped at `cap`."""

    kind: ClassVar[TermKind] = "penalty"
    reads: ClassVar[TermInputs] = TermInputs((frozenset({"diff"}),))
    type: Literal["todo_left"] = "todo_left"
    per_line: float = Field(default=0.1, ge=0, allow_inf_nan=False, description="Per added TODO/FIXME/XXX line")
    cap: float = Field(default=0.3, ge=0, allow_inf_nan=False, description="Bound on the whole trajectory's total")

    def value(self, trajectory: Trajectory) -> float:
        return formulas.todo_penalty(formulas.todo_lines_added(trajectory.diff), per_line=self.per_line, cap=self.cap)


class LengthWeights(BaseModel):
    """The weights of C4's x (docs/methods.md C4): x = Σ weight · quantity over an episode's length statistics. Token
    weights are per token, count weights per call or reply. The source gives none; the defaults measure x in
    thousands of tokens of the policy's own writing plus 0.01 per call and per reply, leaving tool output (which
    the policy does not write) out."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    thinking_tokens: float = Field(default=0.001, ge=0, allow_inf_nan=False)
    tool_call_tokens: float = Field(default=0.001, ge=0, allow_inf_nan=False)
    tool_output_tokens: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    final_message_tokens: float = Field(default=0.001, ge=0, allow_inf_nan=False)
    tool_calls: float = Field(default=0.01, ge=0, allow_inf_nan=False)
    turns: float = Field(default=0.01, ge=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _some_weight(self) -> LengthWeights:
        if not any(getattr(self, name) > 0 for name in LengthWeights.model_fields):
            raise ValueError(
                "every weight is 0, so x and the penalty are always 0; give at least one of "
                f"{', '.join(LengthWeights.model_fields)} a weight > 0, or remove the term"
            )
        return self


class LengthPenaltyTerm(_Term):
    """Composer 2's concave length penalty (docs/methods.md C4): C(x) = ((1 + k·x)^(1−q) − 1) / (k·(1−q)), the log limit
    ln(1 + k·x)/k at q = 1, with x the weighted sum of the episode's length statistics (`weights`).

    The source gives no k, q or weights, nor how the penalty meets the reward; ours: subtracted like every penalty,
    q = 2 so the cost saturates at 1/(k·(q−1)) = 1 (a long episode can never cost more than a solved task earns),
    k = 1 so the curve bends at about x = 1 (a thousand written tokens). Scale it with the term's `weight`."""

    kind: ClassVar[TermKind] = "penalty"
    reads: ClassVar[TermInputs] = TermInputs((frozenset({"length_stats"}),))
    type: Literal["length_penalty"] = "length_penalty"
    k: float = Field(default=1.0, allow_inf_nan=False, description="Curvature scale, > 0: the cost bends near x = 1/k")
    q: float = Field(
        default=2.0,
        allow_inf_nan=False,
        description="Flattening, >= 0: 0 is linear, 1 logarithmic, above 1 saturating at 1/(k·(q−1))",
    )
    weights: LengthWeights = Field(default_factory=LengthWeights)

    @field_validator("k")
    @classmethod
    def _k_positive(cls, value: float) -> float:
        if not value > 0:
            raise ValueError(f"k must be > 0 (C4 divides by k; it sets where the cost bends, x ≈ 1/k), got {value}")
        return value

    @field_validator("q")
    @classmethod
    def _q_non_negative(cls, value: float) -> float:
        if not value >= 0:
            raise ValueError(
                f"q must be >= 0 (0 is a linear cost, larger values flatten it; below 0 it is convex), got {value}"
            )
        return value

    def length(self, trajectory: Trajectory) -> float:
        """C4's x for one trajectory (0 without length statistics)."""
        stats = trajectory.length_stats
        if stats is None:
            return 0.0
        return sum(
            float(getattr(self.weights, name)) * float(getattr(stats, name)) for name in LengthWeights.model_fields
        )

    def value(self, trajectory: Trajectory) -> float:
        # docs/methods.md C4: C_length{k,q}(x), x = Σ w · (thinking, tool-call, tool-output, final-message tokens,
        # tool calls, turns)
        return formulas.concave_length_cost(self.length(trajectory), k=self.k, q=self.q)


class SignalWeights(BaseModel):
    """What each user feedback signal is worth (`workers.session_records.Signal`), in reward units per signal.
    The sign says which way it pulls. thumbs is multiplied by the rating (+1 or -1); tests_passed and tests_failed
    by the fraction of tests their value gives (passed, failed; the whole weight without one). Cursor's real-time RL
    names edits kept and dissatisfied follow-ups as its signals (docs/methods.md section 2) but gives no weights: these
    defaults count every clear verdict as +1 or -1 and free text as nothing."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    edit_kept: float = Field(default=1.0, allow_inf_nan=False, description="The user kept the agent's edit")
    edit_reverted: float = Field(default=-1.0, allow_inf_nan=False, description="The user reverted it")
    dissatisfied_followup: float = Field(
        default=-1.0, allow_inf_nan=False, description="The next message showed the user was not satisfied"
    )
    accepted: float = Field(default=1.0, allow_inf_nan=False, description="A proposed change was accepted")
    rejected: float = Field(default=-1.0, allow_inf_nan=False, description="A proposed change was rejected")
    thumbs: float = Field(default=1.0, allow_inf_nan=False, description="Times the rating, +1 or -1")
    tests_passed: float = Field(default=1.0, allow_inf_nan=False, description="Times the fraction that passed")
    tests_failed: float = Field(default=-1.0, allow_inf_nan=False, description="Times the fraction that failed")
    text: float = Field(default=0.0, allow_inf_nan=False, description="Free text: no reward of its own")


class SessionFeedbackTerm(_Term):
    """Real-time RL's reward from what users did with a served session (docs/methods.md section 2, "Real-time RL":
    "distil user responses into rewards"): each feedback signal is worth its weight (`weights`), credited to the
    turn it is about and, times `turn_decay` per turn of distance, to the turns before it; a session-level signal
    is about the last turn. A turn's credit is the `combine` ("sum" or "mean") of the signals that reach it; a turn
    none reaches (a signal of weight 0 does not count) is dropped from training (`no_feedback="drop"`) or credited
    `neutral_value` ("neutral"). See `workers.rewards.terms.session_turn_credits`.

    Trained per turn (`workers.realtime.reward.score_session`); the session's own value, for re-scoring and
    reports, is the mean credit of its kept turns, and a session none of whose turns is kept is dropped (the
    score says `dropped`: it is not trained on and counts in no mean)."""

    kind: ClassVar[TermKind] = "gain"
    reads: ClassVar[TermInputs] = TermInputs((frozenset({"feedback"}),))
    type: Literal["session_feedback"] = "session_feedback"
    weights: SignalWeights = Field(default_factory=SignalWeights)
    no_feedback: Literal["drop", "neutral"] = Field(
        default="drop",
        description="A turn (a session) no signal reaches: 'drop' leaves it out of training, 'neutral' credits it "
        "neutral_value",
    )
    neutral_value: float = Field(
        default=0.0, allow_inf_nan=False, description="The credit of a turn without feedback under 'neutral'"
    )
    turn_decay: float = Field(
        default=1.0,
        gt=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="A signal about turn t credits turn j <= t times turn_decay^(t - j); 1 credits every earlier "
        "turn fully (Composer 2 C3: the final reward for every token of the chain)",
    )
    combine: Literal["sum", "mean"] = Field(
        default="sum", description="How the signals reaching a turn combine: their sum, or their mean"
    )

    def signals(self, trajectory: Trajectory) -> list[tuple[int, float]]:
        """(position of the turn it is about, contribution) of each signal with a non-zero weight."""
        turns = trajectory.session_turns or [0]
        out: list[tuple[int, float]] = []
        for record in trajectory.feedback:
            weight = float(getattr(self.weights, record.signal))
            if weight == 0.0:
                continue
            out.append(
                (
                    formulas.feedback_turn_position(turns, record.turn_index),
                    formulas.feedback_signal_value(record.signal, record.value, weight),
                )
            )
        return out

    def turn_credits(self, trajectory: Trajectory) -> list[float | None]:
        """The unweighted credit of each served turn, in `session_turns` order (one turn when the trajectory
        names none); None for a dropped turn."""
        return formulas.session_turn_credits(
            len(trajectory.session_turns) or 1,
            self.signals(trajectory),
            decay=self.turn_decay,
            combine=self.combine,
            no_feedback=self.no_feedback,
            neutral_value=self.neutral_value,
        )

    def drops(self, trajectory: Trajectory) -> bool:
        return all(credit is None for credit in self.turn_credits(trajectory))

    def value(self, trajectory: Trajectory) -> float:
        kept = [credit for credit in self.turn_credits(trajectory) if credit is not None]
        return math.fsum(kept) / len(kept) if kept else 0.0


# --- Kimi K2.5's PARL (docs/methods.md section 1, K1 and K2) ----------------------------------------------------------


class Anneal(BaseModel):
    """A weight annealed to zero over training (K1: "λ1 and λ2 are annealed to zero over the course of training";
    the source gives no schedule). At 0-based step t the weight is multiplied by 1 − t/steps ("linear") or
    ½(1 + cos(π·t/steps)) ("cosine"), and by 0 from `steps` on. Outside training (evaluation, re-scoring: no step)
    the factor is 1. `steps` left empty anneals over the training run's own steps (`with_anneal_horizon`, applied
    to the reward a training job receives), so the weights reach 0 at the run's last step whatever its length."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schedule: Literal["linear", "cosine"] = Field(default="linear", description="How the weight falls to 0")
    steps: int | None = Field(
        default=None,
        ge=1,
        le=10_000_000,
        description="Training steps until the weight is 0; empty: the run's own steps (a longer horizon than the "
        "run never reaches 0, and the run page warns)",
    )

    def factor(self, step: int | None) -> float:
        if step is None:
            return 1.0
        if self.steps is None:
            raise ValueError(
                "anneal.steps is empty (the run's own steps) but no run filled it in: score training steps with the "
                "spec from with_anneal_horizon(spec, steps)"
            )
        t = min(max(step, 0), self.steps) / self.steps
        if self.schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * t))
        return 1.0 - t


class ItemF1Term(_Term):
    """WideSearch's item-level F1 of the answer table against the task's gold table (docs/methods.md B2,
    `workers.rewards.table.score_table`); `level: row` scores rows instead (a row counts when all its cells are
    right). 0 without a gold table (a deep task: pair the term with an answer term)."""

    kind: ClassVar[TermKind] = "gain"
    reads: ClassVar[TermInputs] = TermInputs((frozenset({"answer", "gold_table"}),))
    type: Literal["item_f1"] = "item_f1"
    level: Literal["item", "row"] = Field(default="item", description="item: cell-level F1; row: row-level F1")

    def value(self, trajectory: Trajectory) -> float:
        scores = table_metrics({"answer": trajectory.answer, "gold_table": trajectory.gold_table})
        return scores.get("item_f1" if self.level == "item" else "row_f1", 0.0)


def _swarm_stats(trajectory: Trajectory) -> dict[str, float]:
    return swarm_stats({"swarm": trajectory.swarm})


class ParallelInstantiationTerm(_Term):
    """PARL's r_parallel, the instantiation reward against serial collapse (K1). Ours (the source gives no form):
    min(1, k / `saturation`), k the sub-agents the episode launched; annealed to 0 by `anneal`."""

    kind: ClassVar[TermKind] = "gain"
    reads: ClassVar[TermInputs] = TermInputs((frozenset({"swarm"}),))
    type: Literal["parallel_instantiation"] = "parallel_instantiation"
    saturation: int = Field(default=4, ge=1, le=1024, description="Sub-agents launched that earn the full reward")
    anneal: Anneal | None = Field(default_factory=Anneal, description="Anneal the weight to 0 (K1); null: constant")

    def scale(self, step: int | None) -> float:
        return self.anneal.factor(step) if self.anneal is not None else 1.0

    def value(self, trajectory: Trajectory) -> float:
        launched = _swarm_stats(trajectory).get("subagents", 0.0)
        # docs/methods.md K1 r_parallel (form ours): min(1, launched / saturation)
        return min(1.0, launched / self.saturation)


class SubagentFinishTerm(_Term):
    """PARL's r_finish, the sub-agent finish rate against spurious parallelism (K1). Ours: finished / launched over
    the episode's sub-agents (0 when none was launched); a sub-agent that failed, ran out of steps or was cut counts
    as unfinished, and with `duplicates_unfinished` so does each task that repeats an earlier one verbatim.
    Annealed to 0 by `anneal`."""

    kind: ClassVar[TermKind] = "gain"
    reads: ClassVar[TermInputs] = TermInputs((frozenset({"swarm"}),))
    type: Literal["subagent_finish"] = "subagent_finish"
    duplicates_unfinished: bool = Field(
        default=True, description="A task repeating an earlier task of the episode counts as unfinished"
    )
    anneal: Anneal | None = Field(default_factory=Anneal, description="Anneal the weight to 0 (K1); null: constant")

    def scale(self, step: int | None) -> float:
        return self.anneal.factor(step) if self.anneal is not None else 1.0

    def value(self, trajectory: Trajectory) -> float:
        stats = _swarm_stats(trajectory)
        launched = stats.get("subagents", 0.0)
        if not launched:
            return 0.0
        finished = stats.get("finish_rate", 0.0) * launched
        if self.duplicates_unfinished:
            finished = stats.get("finished_distinct", finished)
        # docs/methods.md K1 r_finish (form ours): finished / launched
        return finished / launched


class CriticalStepsTerm(_Term):
    """Critical steps (K2) as a penalty: `per_step` for each critical step beyond `free_steps`, capped at `cap`.
    The hard cap is the swarm environment's `max_critical_steps`; the source says only that training is
    constrained by critical steps, not how, so both are offered."""

    kind: ClassVar[TermKind] = "penalty"
    reads: ClassVar[TermInputs] = TermInputs((frozenset({"swarm"}),))
    type: Literal["critical_steps"] = "critical_steps"
    free_steps: int = Field(default=10, ge=0, description="Critical steps that cost nothing")
    per_step: float = Field(default=0.02, ge=0, allow_inf_nan=False, description="Cost of each further step")
    cap: float = Field(default=0.5, ge=0, allow_inf_nan=False, description="Bound on the total")

    def value(self, trajectory: Trajectory) -> float:
        critical = _swarm_stats(trajectory).get("critical_steps", 0.0)
        return min(self.cap, self.per_step * max(0.0, critical - self.free_steps))


# --- generative reward models with rubrics (Kimi K2.5, docs/methods.md section 1) -------------------------------------


class Criterion(BaseModel):
    """One line of a rubric: what the judge scores, and how much it weighs in the term's value."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_]{0,39}$", description="A word (letters, digits, '_')")
    description: str = Field(min_length=1, max_length=500, description="What the judge looks for")
    weight: float = Field(default=1.0, ge=0, le=100, allow_inf_nan=False)


def _default_criteria() -> list[Criterion]:
    return [Criterion(name=name, description=description) for name, description in DEFAULT_CRITERIA]


class RubricJudgeTerm(_Term):
    """A generative reward model (Kimi K2.5's GRMs, `workers.rewards.judge`): the `judge` model scores the
    trajectory on each of the rubric's `criteria` from 0 to `max_score`; the value is their weighted mean divided by
    max_score, in [0, 1]. Judgements (per-criterion scores and the judge's text) are cached by content hash and
    stored with the trajectory. Put it beside a verified reward, as Kimi does ("on top of verified reward signals")."""

    kind: ClassVar[TermKind] = "gain"
    reads: ClassVar[TermInputs] = TermInputs((frozenset({"turns"}),))
    type: Literal["rubric_judge"] = "rubric_judge"
    judge: str = Field(
        default="smollm2-135m-instruct", min_length=1, description="A built-in model name or a model directory"
    )
    criteria: list[Criterion] = Field(default_factory=_default_criteria, min_length=1, max_length=16)
    max_score: int = Field(default=10, ge=1, le=100, description="The best score of a criterion (0 is the worst)")
    max_new_tokens: int = Field(default=96, ge=8, le=2048, description="Length of the judge's reply")
    max_chars: int = Field(default=4000, ge=200, le=100_000, description="How much of the trajectory the judge reads")

    @field_validator("judge")
    @classmethod
    def _judge_is_a_model(cls, value: str) -> str:
        problems = model_name_problems(value)
        if problems:
            raise ValueError(problems[0])
        return value

    @field_validator("criteria")
    @classmethod
    def _unique_criteria(cls, value: list[Criterion]) -> list[Criterion]:
        names = [c.name for c in value]
        if len(set(names)) != len(names):
            raise ValueError(f"criterion names must be unique, got {names}")
        if not any(c.weight > 0 for c in value):
            raise ValueError("every criterion weighs 0: give at least one a weight > 0")
        return value

    def judgement(self, trajectory: Trajectory) -> Any:
        return judge_trajectory(
            trajectory.model_dump(mode="json"),
            term_name=self.name,
            judge=self.judge,
            criteria=[(c.name, c.description, c.weight) for c in self.criteria],
            scale=self.max_score,
            max_new_tokens=self.max_new_tokens,
            max_chars=self.max_chars,
        )

    def value(self, trajectory: Trajectory) -> float:
        return float(self.judgement(trajectory).score)


TERM_CLASSES: tuple[type[_Term], ...] = (
    ExactMatchTerm,
    NormalizedMatchTerm,
    FBetaTerm,
    TrajectoryRecallTerm,
    FinalAnswerBonusTerm,
    PrunePenaltyTerm,
    TurnPenaltyTerm,
    PassedTestsTerm,
    HiddenTestsTerm,
    BrokenToolCallsTerm,
    TodoLeftTerm,
    LengthPenaltyTerm,
    SessionFeedbackTerm,
    ItemF1Term,
    ParallelInstantiationTerm,
    SubagentFinishTerm,
    CriticalStepsTerm,
    RubricJudgeTerm,
)
"""Every term type, in the order UIs list them: the one place a new term class is named."""
TERM_TYPES: tuple[str, ...] = tuple(str(cls.model_fields["type"].default) for cls in TERM_CLASSES)
_CLASS_BY_TYPE: dict[str, type[_Term]] = dict(zip(TERM_TYPES, TERM_CLASSES, strict=True))
ANNEALED_TERM_TYPES: frozenset[str] = frozenset(t for t, cls in _CLASS_BY_TYPE.items() if "anneal" in cls.model_fields)
"""Term types whose weight anneals over training (`Anneal`): PARL's r_parallel and r_finish."""

TERM_INPUTS: dict[str, TermInputs] = {term_type: cls.reads for term_type, cls in _CLASS_BY_TYPE.items()}
"""What each term type reads, by type (see `TermInputs`)."""

if TYPE_CHECKING:
    TermSpec = _Term
else:
    # The discriminated union pydantic validates a term with. A union built from a tuple is no static type, so
    # mypy sees the base class instead, which declares everything callers read.
    TermSpec = Annotated[Union[TERM_CLASSES], Field(discriminator="type")]  # noqa: UP007


class RewardSpec(BaseModel):
    """A reward config: weighted terms combined as in docs/methods.md X2 (see `workers.rewards.score`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    terms: list[TermSpec] = Field(min_length=1)
    floor: float | None = Field(
        default=None,
        allow_inf_nan=False,
        description="X2's epsilon: lower bound on the reward of trajectories that completed without error",
    )
    cap_at_pre_penalty: bool = Field(
        default=False, description="X2's upper clamp: the reward never exceeds the sum of the gain terms"
    )

    @field_validator("terms")
    @classmethod
    def _unique_names(cls, terms: list[_Term]) -> list[_Term]:
        first_index: dict[str, int] = {}
        for index, term in enumerate(terms):
            if term.name in first_index:
                first = first_index[term.name]
                raise PydanticCustomError(
                    "duplicate_term_name",
                    f"terms[{index}] ({term.type}).name: name '{term.name}' is already used by terms[{first}]; "
                    f"give one of them a distinct 'name'",
                    {"index": index, "first": first, "term": term.type, "name": term.name},
                )
            first_index[term.name] = index
        return terms

    @property
    def term_names(self) -> list[str]:
        """Names of the terms, in spec order (the keys of `RewardResult.terms`)."""
        return [term.name for term in self.terms]


class RewardSpecError(ValueError):
    """A reward config failed validation.

    `errors` is a list of {"field": "terms[2].beta", "term": "f_beta" | None, "message": "..."}; each message
    names the term and field and says how to fix it.
    """

    def __init__(self, errors: list[dict[str, str | None]]) -> None:
        self.errors = errors
        super().__init__("; ".join(str(err["message"]) for err in errors) or "invalid reward spec")


def _path(parts: tuple[int | str, ...]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _allowed_fields(term: str | None, nested: tuple[int | str, ...] = ()) -> str:
    """The fields of the object an unknown key was found in: a term's, or a nested model's (length_penalty's
    `weights`) when `nested` walks into one."""
    model: type[BaseModel] = _CLASS_BY_TYPE[term] if term else RewardSpec
    for part in nested:
        info = model.model_fields.get(str(part))
        annotation = info.annotation if info is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            break
        model = annotation
    return ", ".join(model.model_fields)


def _translate(err: ErrorDetails) -> dict[str, str | None]:
    loc = tuple(err["loc"])
    kind = err["type"]
    ctx = err.get("ctx") or {}
    valid = ", ".join(TERM_TYPES)

    if kind == "duplicate_term_name":
        return {"field": f"terms[{ctx['index']}].name", "term": str(ctx["term"]), "message": err["msg"]}

    term: str | None = None
    nested: tuple[int | str, ...] = ()
    if len(loc) >= 2 and loc[0] == "terms" and isinstance(loc[1], int):
        head = f"terms[{loc[1]}]"
        rest = loc[2:]
        if rest and rest[0] in _CLASS_BY_TYPE:
            term = str(rest[0])
            rest = rest[1:]
        if kind == "union_tag_invalid":
            return {
                "field": f"{head}.type",
                "term": None,
                "message": f"{head}.type: unknown term type {ctx.get('tag')!r}; use one of: {valid}",
            }
        if kind == "union_tag_not_found":
            return {
                "field": f"{head}.type",
                "term": None,
                "message": f'{head}.type: Field required; add "type" set to one of: {valid}',
            }
        nested = tuple(rest[:-1])
        field = head + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in rest)
        label = f"{head} ({term})" + field[len(head) :] if term else field
    else:
        field = _path(loc)
        label = field or "reward spec"

    hint = ""
    if kind == "missing":
        hint = "; add it"
    elif kind == "extra_forbidden":
        hint = f"; remove it (allowed fields: {_allowed_fields(term, nested)})"
    elif kind == "too_short" and field == "terms":
        hint = f"; add at least one term (valid types: {valid})"
    elif kind == "model_attributes_type" and term is None and field.startswith("terms["):
        hint = f'; write each term as an object, e.g. {{"type": "f_beta", "weight": 0.7}} (valid types: {valid})'
    elif kind in ("model_type", "model_attributes_type") and not field:
        hint = '; send a JSON object such as {"terms": [{"type": "f_beta"}]}'
    message = str(err["msg"])
    if kind == "value_error":
        # Our own validators already phrase the fix; pydantic's "Value error, " prefix only adds noise.
        message = message.removeprefix("Value error, ")
    return {"field": field, "term": term, "message": f"{label}: {message}{hint}"}


def validate_reward_spec(data: object) -> RewardSpec:
    """Validate a reward config given as a dict (or JSON text/bytes, or an existing `RewardSpec`).

    Raises `RewardSpecError` listing every problem, each with the field path, the term type and a fix.
    """
    if isinstance(data, RewardSpec):
        return data
    try:
        if isinstance(data, str | bytes | bytearray):
            return RewardSpec.model_validate_json(data)
        return RewardSpec.model_validate(data)
    except ValidationError as exc:
        raise RewardSpecError([_translate(err) for err in exc.errors(include_url=False)]) from None


def spec_hash(spec: RewardSpec) -> str:
    """SHA-256 hex digest of the spec's canonical JSON (sorted keys, no whitespace).

    Defaults are filled in and numbers coerced before hashing, so specs that differ only in key order, omitted
    defaults or 4 vs 4.0 hash the same.
    """
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def context1_spec(beta: float = 4.0, floor: float = 0.0) -> RewardSpec:
    """The Context-1 reward (docs/methods.md X2): clamp(0.7·F_β + 0.3·r_traj + r_fa − p_prune − p_turn, ε, r_pre).

    `beta` is X3's beta (4 at initialisation, annealed towards 2); `floor` is X2's epsilon, whose value the
    source leaves open (docs/methods.md section 7), so 0.0 by default.
    """
    return RewardSpec(
        terms=[
            FBetaTerm(weight=0.7, beta=beta),
            TrajectoryRecallTerm(weight=0.3),
            FinalAnswerBonusTerm(weight=1.0, bonus=1.0),
            PrunePenaltyTerm(weight=1.0),
            TurnPenaltyTerm(weight=1.0),
        ],
        floor=floor,
        cap_at_pre_penalty=True,
    )


def coding_agent_spec(length_weight: float = 0.1) -> RewardSpec:
    """Composer 2's coding reward as Crucible builds it (docs/methods.md section 2): the hidden tests all-or-nothing,
    minus broken tool calls, TODOs left in the diff and C4's length cost (weighted `length_weight`: the source gives
    no scale; at 0.1 a long episode costs at most 0.1 of a solved task's reward)."""
    return RewardSpec(
        terms=[
            HiddenTestsTerm(mode="all_or_nothing"),
            BrokenToolCallsTerm(),
            TodoLeftTerm(),
            LengthPenaltyTerm(weight=length_weight),
        ]
    )


def parl_spec(
    lambda_parallel: float = 0.1,
    lambda_finish: float = 0.1,
    anneal_steps: int | None = None,
    schedule: Literal["linear", "cosine"] = "linear",
    critical_penalty: float = 0.0,
) -> RewardSpec:
    """Kimi K2.5's PARL reward (docs/methods.md K1): r_perf + λ1·r_parallel + λ2·r_finish, λ1 and λ2 annealed to 0
    over `anneal_steps` steps (None: over the training run's own steps). r_perf is the task's own metric: item-F1
    of the table for a wide task, the answer (normalised match) for a deep one (each is 0 on the other kind). With
    `critical_penalty` > 0 the critical steps penalty (K2) is added with that weight. λ values and schedule are
    ours: the source gives none."""
    anneal = Anneal(schedule=schedule, steps=anneal_steps)
    terms: list[Any] = [
        ItemF1Term(),
        NormalizedMatchTerm(),
        ParallelInstantiationTerm(weight=lambda_parallel, anneal=anneal),
        SubagentFinishTerm(weight=lambda_finish, anneal=anneal),
    ]
    if critical_penalty > 0:
        terms.append(CriticalStepsTerm(weight=critical_penalty))
    return RewardSpec(terms=terms)


def with_anneal_horizon(spec: dict[str, Any], steps: int) -> dict[str, Any]:
    """The reward spec (JSON) `spec` with every annealed term whose `anneal.steps` is empty (or left out) annealed
    over a training run of `steps` steps: full weight at step 0, weight 0 at the run's last step (0-based step
    `steps` − 1, the horizon it gets; 1 for a one-step run). What a training job scores with. An explicit horizon is
    kept; anything that is not a spec's shape is returned as it is (the spec's own validation names it)."""
    terms = spec.get("terms") if isinstance(spec, dict) else None
    if not isinstance(terms, list):
        return spec
    horizon = max(1, steps - 1)
    resolved = []
    for term in terms:
        anneal = term.get("anneal") if isinstance(term, dict) else None
        if isinstance(term, dict) and "anneal" not in term and term.get("type") in ANNEALED_TERM_TYPES:
            anneal = {}  # left out: the term's default, Anneal() with an empty horizon
        if isinstance(anneal, dict) and anneal.get("steps") is None:
            term = {**term, "anneal": {**anneal, "steps": horizon}}
        resolved.append(term)
    return {**spec, "terms": resolved}


def anneal_horizons(spec: RewardSpec) -> dict[str, int | None]:
    """The anneal horizon of each annealed term of `spec`, by term name (None: the run's own steps)."""
    horizons: dict[str, int | None] = {}
    for term in spec.terms:
        anneal = getattr(term, "anneal", None)
        if isinstance(anneal, Anneal):
            horizons[term.name] = anneal.steps
    return horizons


def with_f_beta(spec: RewardSpec, beta: float) -> RewardSpec:
    """`spec` with every f_beta term's beta set to `beta` (the X3 schedule anneals it between epochs)."""
    terms = [term.model_copy(update={"beta": beta}) if isinstance(term, FBetaTerm) else term for term in spec.terms]
    return spec.model_copy(update={"terms": terms})
