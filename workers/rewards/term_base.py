"""What every reward term is (`workers.rewards.schema` lists them): `TermBase`, the fields and checks all terms
share, `TermInputs`, what a term reads, and `Anneal`, a weight annealed to zero over training (PARL's K1)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from workers.trajectories import Trajectory

TermKind = Literal["gain", "penalty"]


@dataclass(frozen=True)
class TermInputs:
    """What one reward term reads: any one of `fields` (sets of trajectory fields), and the `tools` whose calls
    it counts.

    Declared beside each term's `value` so the run-creation check (`workers.envs.checks.check_reward_compatible`)
    can refuse a reward an environment cannot feed, and a term over a tool the environment never offers (a
    constant, so almost surely a mistake), without this package knowing any environment.
    """

    fields: tuple[frozenset[str], ...]
    tools: frozenset[str] = frozenset()


ANSWER_FIELDS = frozenset({"answer", "gold_answers"})

# Names become dict keys and metric names ("term/<name>", at most 100 characters on the wire), hence the limits.
NAME_PATTERN = r"^[A-Za-z0-9_.\-]+$"
NAME_MAX = 64


class TermBase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: ClassVar[TermKind]
    reads: ClassVar[TermInputs]

    type: str
    name: str = Field(default="", max_length=NAME_MAX, description="Unique within the spec; defaults to the type")
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
        if not re.fullmatch(NAME_PATTERN, value):
            raise ValueError(f"use only letters, digits, '_', '.' and '-' (at most {NAME_MAX} characters)")
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
