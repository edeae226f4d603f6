"""The rubric judge term: a generative reward model with a rubric (Kimi K2.5's GRMs, docs/methods.md section 1):
`RubricJudgeTerm` and its rubric lines, `Criterion`; the judge itself is `workers.rewards.judge`. The other term
types are in `workers.rewards.term_types` and `workers.rewards.term_feedback`, and `workers.rewards.schema`
names every term in `TERM_CLASSES`."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from workers.models.registry import model_name_problems
from workers.rewards.judge import DEFAULT_CRITERIA, judge_trajectory
from workers.rewards.term_base import TermBase, TermInputs, TermKind
from workers.trajectories import Trajectory


class Criterion(BaseModel):
    """One line of a rubric: what the judge scores, and how much it weighs in the term's value."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_]{0,39}$", description="A word (letters, digits, '_')")
    description: str = Field(min_length=1, max_length=500, description="What the judge looks for")
    weight: float = Field(default=1.0, ge=0, le=100, allow_inf_nan=False)


def _default_criteria() -> list[Criterion]:
    return [Criterion(name=name, description=description) for name, description in DEFAULT_CRITERIA]


class RubricJudgeTerm(TermBase):
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
