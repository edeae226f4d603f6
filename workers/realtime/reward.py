"""The reward of a served session, per turn (docs/methods.md section 2, "Real-time RL": "distil user responses into
rewards").

A session reward is an ordinary `RewardSpec` holding a `session_feedback` term (the users' signals, credited to
turns with a decay) beside any trajectory terms, such as C4's `length_penalty` and `broken_tool_calls`. It is
versioned and content-hashed like every reward config (`workers.rewards.schema.spec_hash`), and
`workers.rewards.score.score_trajectory` scores a session as a whole (the re-scoring job does).

Training needs one reward per served turn (`score_session`): turn t gets

    gains_t = Σ w·credit_t over session_feedback terms + Σ w·v over the other gain terms
    r_t     = combine(gains_t, penalty)      (floor and cap as in `workers.rewards.score`)

where every term other than session_feedback is scored once on the whole session and counts in full on every
turn, as Composer 2 gives the chain's final reward to every token it produced (C3): a session that emitted broken
tool calls or ran long costs each of its turns. A turn that any session_feedback term drops has no reward (None).
Without a floor or cap that binds, the session's reward is the mean of its kept turns' rewards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from workers.rewards.schema import RewardSpec
from workers.rewards.score import RewardResult, combine_reward, score_trajectory
from workers.rewards.term_feedback import SessionFeedbackTerm, SignalWeights
from workers.rewards.term_types import BrokenToolCallsTerm, LengthPenaltyTerm
from workers.trajectories import Trajectory


@dataclass(frozen=True)
class SessionScore:
    """A session's reward: `result` for the session as a whole (as the re-scoring job reports it) and
    `turn_rewards`, one per served turn in order (reward units; None for a turn left out of training)."""

    result: RewardResult
    turn_rewards: list[float | None]

    @property
    def dropped(self) -> bool:
        """No turn has a reward: the session is not trained on."""
        return all(reward is None for reward in self.turn_rewards)


def score_session(spec: RewardSpec, trajectory: Trajectory) -> SessionScore:
    """Score a served session (a trajectory from `workers.realtime.samples.session_to_trajectory`) per turn; see
    the module docstring for how the terms combine."""
    result = score_trajectory(spec, trajectory)
    turns = len(trajectory.session_turns) or 1
    feedback_terms = [term for term in spec.terms if isinstance(term, SessionFeedbackTerm)]
    other_gains = math.fsum(
        term.weight * result.terms[term.name]
        for term in spec.terms
        if term.kind == "gain" and not isinstance(term, SessionFeedbackTerm)
    )
    gains = [other_gains] * turns
    dropped = [False] * turns
    for term in feedback_terms:
        for position, credit in enumerate(term.turn_credits(trajectory)):
            if credit is None:
                dropped[position] = True
            else:
                gains[position] += term.weight * credit
    completed = trajectory.error is None
    rewards: list[float | None] = [
        None if dropped[t] else combine_reward(spec, gains[t], result.penalty, completed=completed)
        for t in range(turns)
    ]
    return SessionScore(result=result, turn_rewards=rewards)


DEFAULT_LENGTH_WEIGHT = 0.1
"""The weight of C4's length cost in the default session reward: at most 0.1, a tenth of one kept edit (the same
scale as `workers.rewards.schema.coding_agent_spec`)."""


def default_session_reward_spec(
    *,
    no_feedback: str = "drop",
    turn_decay: float = 1.0,
    length_weight: float = DEFAULT_LENGTH_WEIGHT,
    weights: dict[str, float] | None = None,
) -> RewardSpec:
    """The default session reward: the users' signals (`session_feedback` with its default weights: edit kept,
    accepted +1; edit reverted, rejected, dissatisfied follow-up -1; thumbs ±1; tests by the fraction passed /
    failed; text 0), minus broken tool calls (0.1 each, at most 0.5) and C4's length cost times `length_weight`.
    A session without feedback is dropped; `turn_decay` 1 credits a session's verdict to all its turns."""
    feedback = SessionFeedbackTerm.model_validate(
        {
            "type": "session_feedback",
            "weights": SignalWeights.model_validate(weights or {}).model_dump(),
            "no_feedback": no_feedback,
            "turn_decay": turn_decay,
        }
    )
    return RewardSpec(terms=[feedback, BrokenToolCallsTerm(), LengthPenaltyTerm(weight=length_weight)])


def default_session_reward_config() -> dict[str, Any]:
    """`default_session_reward_spec()` as the JSON a reward config version stores (every default written out)."""
    return default_session_reward_spec().model_dump(mode="json")
