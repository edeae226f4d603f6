"""Real-time RL's reward term (docs/methods.md section 2, "Real-time RL", R1-R3): `SessionFeedbackTerm`, which
distils what users did with a served session into per-turn credits, and `SignalWeights`, what each feedback signal
is worth. The other term types are in `workers.rewards.term_types` and `workers.rewards.term_judge`; the formulas
are `workers.rewards.terms`, and `workers.rewards.schema` names every term in `TERM_CLASSES`."""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from workers.rewards import terms as formulas
from workers.rewards.term_base import TermBase, TermInputs, TermKind
from workers.trajectories import Trajectory


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


class SessionFeedbackTerm(TermBase):
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
