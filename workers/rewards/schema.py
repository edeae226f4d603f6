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

A term type is one class in `workers.rewards.term_types` (the session-feedback and rubric-judge terms in
`term_feedback` and `term_judge`), on `workers.rewards.term_base.TermBase`: its fields,
its `value` and what that value `reads`. Everything listed per type (`TERM_CLASSES`, `TERM_TYPES`, `TERM_INPUTS`,
the `TermSpec` union) derives from `TERM_CLASSES` here, so adding a term is adding its class (and its formula in
`terms`) and naming it there.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import ErrorDetails, PydanticCustomError

from workers.rewards.term_base import Anneal, TermBase, TermInputs
from workers.rewards.term_feedback import SessionFeedbackTerm
from workers.rewards.term_judge import RubricJudgeTerm
from workers.rewards.term_types import (
    BrokenToolCallsTerm,
    CriticalStepsTerm,
    ExactMatchTerm,
    FBetaTerm,
    FinalAnswerBonusTerm,
    HiddenTestsTerm,
    ItemF1Term,
    LengthPenaltyTerm,
    NormalizedMatchTerm,
    ParallelInstantiationTerm,
    PassedTestsTerm,
    PrunePenaltyTerm,
    SubagentFinishTerm,
    TodoLeftTerm,
    TrajectoryRecallTerm,
    TurnPenaltyTerm,
)

TERM_CLASSES: tuple[type[TermBase], ...] = (
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
_CLASS_BY_TYPE: dict[str, type[TermBase]] = dict(zip(TERM_TYPES, TERM_CLASSES, strict=True))
ANNEALED_TERM_TYPES: frozenset[str] = frozenset(t for t, cls in _CLASS_BY_TYPE.items() if "anneal" in cls.model_fields)
"""Term types whose weight anneals over training (`Anneal`): PARL's r_parallel and r_finish."""

TERM_INPUTS: dict[str, TermInputs] = {term_type: cls.reads for term_type, cls in _CLASS_BY_TYPE.items()}
"""What each term type reads, by type (see `TermInputs`)."""

if TYPE_CHECKING:
    TermSpec = TermBase
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
    def _unique_names(cls, terms: list[TermBase]) -> list[TermBase]:
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
