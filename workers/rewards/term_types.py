"""The reward term types (docs/methods.md: Context-1 X2-X5, coding outcomes and Composer C4, PARL K1-K2, WideSearch
B2): each class's fields, its `value` and what that value `reads`. Real-time RL's session-feedback term is in
`workers.rewards.term_feedback`, Kimi's rubric judge term in `workers.rewards.term_judge`. `workers.rewards.schema`
names them all in `TERM_CLASSES`; the formulas are `workers.rewards.terms`."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from workers.rewards import terms as formulas
from workers.rewards.swarm_stats import swarm_stats
from workers.rewards.table_score import table_metrics
from workers.rewards.term_base import ANSWER_FIELDS, Anneal, TermBase, TermInputs, TermKind
from workers.trajectories import Trajectory, Turn


class ExactMatchTerm(TermBase):
    """1.0 if the stripped answer equals any stripped gold answer."""

    kind: ClassVar[TermKind] = "gain"
    reads: ClassVar[TermInputs] = TermInputs((ANSWER_FIELDS,))
    type: Literal["exact_match"] = "exact_match"
    case_sensitive: bool = True

    def value(self, trajectory: Trajectory) -> float:
        return formulas.exact_match(trajectory.answer, trajectory.gold_answers, case_sensitive=self.case_sensitive)


class NormalizedMatchTerm(TermBase):
    """1.0 if the answer equals any gold answer after SQuAD normalisation."""

    kind: ClassVar[TermKind] = "gain"
    reads: ClassVar[TermInputs] = TermInputs((ANSWER_FIELDS,))
    type: Literal["normalized_match"] = "normalized_match"

    def value(self, trajectory: Trajectory) -> float:
        return formulas.normalized_match(trajectory.answer, trajectory.gold_answers)


class FBetaTerm(TermBase):
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


class TrajectoryRecallTerm(TermBase):
    """Fraction of gold docs seen anywhere in the full unpruned trajectory (docs/methods.md X2's r_traj)."""

    kind: ClassVar[TermKind] = "gain"
    reads: ClassVar[TermInputs] = TermInputs((frozenset({"seen_doc_ids", "gold_doc_ids"}),))
    type: Literal["trajectory_recall"] = "trajectory_recall"

    def value(self, trajectory: Trajectory) -> float:
        # docs/methods.md X2: r_traj = |seen ∩ gold| / |gold|
        return formulas.set_recall(trajectory.seen_doc_ids, trajectory.gold_doc_ids)


class FinalAnswerBonusTerm(TermBase):
    """`bonus` if the output contains a chunk that directly contains the answer (docs/methods.md X2's r_fa)."""

    kind: ClassVar[TermKind] = "gain"
    # formulas.final_answer_found: the answer chunk ids when the task has them, else the answer text
    reads: ClassVar[TermInputs] = TermInputs((frozenset({"output_doc_ids", "answer_doc_ids"}), ANSWER_FIELDS))
    type: Literal["final_answer_bonus"] = "final_answer_bonus"
    bonus: float = Field(default=1.0, allow_inf_nan=False)

    def value(self, trajectory: Trajectory) -> float:
        found = formulas.final_answer_found(
            trajectory.output_doc_ids, trajectory.answer_doc_ids, trajectory.answer, trajectory.gold_answers
        )
        # docs/methods.md X2: r_fa = +bonus when the final answer is found
        return self.bonus if found else 0.0


class PrunePenaltyTerm(TermBase):
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


class TurnPenaltyTerm(TermBase):
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


class PassedTestsTerm(TermBase):
    """Coding outcome reward: the fraction of the task's tests the final code passed in the sandbox (0 when the
    code never ran, timed out or crashed: a sandbox failure is never a pass)."""

    kind: ClassVar[TermKind] = "gain"
    reads: ClassVar[TermInputs] = TermInputs((frozenset({"tests_passed"}),))
    type: Literal["tests_passed"] = "tests_passed"

    def value(self, trajectory: Trajectory) -> float:
        return trajectory.tests_passed or 0.0


class HiddenTestsTerm(TermBase):
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


class BrokenToolCallsTerm(TermBase):
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


class TodoLeftTerm(TermBase):
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


class LengthPenaltyTerm(TermBase):
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


# --- Kimi K2.5's PARL (docs/methods.md section 1, K1 and K2) ----------------------------------------------------------


class ItemF1Term(TermBase):
    """WideSearch's item-level F1 of the answer table against the task's gold table (docs/methods.md B2,
    `workers.rewards.table_score.score_table`); `level: row` scores rows instead (a row counts when all its cells are
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


class ParallelInstantiationTerm(TermBase):
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


class SubagentFinishTerm(TermBase):
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


class CriticalStepsTerm(TermBase):
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
