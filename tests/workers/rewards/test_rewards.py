"""Reward terms, the reward config schema and the X2 combination (docs/methods.md section 3, Context-1)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from sklearn.metrics import fbeta_score

from workers.rewards import terms as t
from workers.rewards.schema import (
    TERM_TYPES,
    RewardSpec,
    RewardSpecError,
    context1_spec,
    spec_hash,
    validate_reward_spec,
)
from workers.rewards.score import RewardResult, histogram, score_many, score_trajectory
from workers.rewards.term_types import FBetaTerm, FinalAnswerBonusTerm, PrunePenaltyTerm, TurnPenaltyTerm
from workers.trajectories import Trajectory, Turn

# --- helpers -----------------------------------------------------------------------------------------------------


def _assistant_turns(n: int, tools: list[str] | None = None) -> list[Turn]:
    """n assistant turns; the first len(tools) call those tools, the rest are text."""
    tools = tools or []
    return [Turn(role="assistant", tool=tools[i] if i < len(tools) else None) for i in range(n)]


def _tool_turns(tools: list[str]) -> list[Turn]:
    """Assistant tool calls interleaved with their tool results, as a harness would log them."""
    out: list[Turn] = []
    for name in tools:
        out.append(Turn(role="assistant", tool=name))
        out.append(Turn(role="tool", tool=name, content="ok"))
    return out


def _sklearn_fbeta(predicted: set[str], gold: set[str], beta: float) -> float:
    universe = sorted(predicted | gold)
    y_true = [1 if i in gold else 0 for i in universe]
    y_pred = [1 if i in predicted else 0 for i in universe]
    return float(fbeta_score(y_true, y_pred, beta=beta, zero_division=0))


def _spec_errors(data: object) -> list[dict[str, Any]]:
    with pytest.raises(RewardSpecError) as info:
        validate_reward_spec(data)
    return info.value.errors


# --- F-beta (X3) ---------------------------------------------------------------------------------------------------


def test_f_beta_of_equal_precision_and_recall_is_that_value() -> None:
    assert t.f_beta(0.5, 0.5, 4.0) == pytest.approx(0.5)


def test_f_beta_hand_computed_with_beta_4() -> None:
    # (1 + 16)·0.25·1 / (16·0.25 + 1) = 4.25 / 5
    assert t.f_beta(0.25, 1.0, 4.0) == pytest.approx(0.85)


def test_f_beta_with_beta_1_is_f1() -> None:
    assert t.f_beta(0.5, 1.0, 1.0) == pytest.approx(2 * 0.5 * 1.0 / 1.5)


def test_f_beta_is_zero_when_precision_and_recall_are_zero() -> None:
    assert t.f_beta(0.0, 0.0, 4.0) == 0.0


@pytest.mark.parametrize("bad", [(-0.1, 0.5, 1.0), (0.5, 1.1, 1.0), (0.5, 0.5, -0.5), (0.5, 0.5, math.inf)])
def test_f_beta_rejects_out_of_range_inputs(bad: tuple[float, float, float]) -> None:
    with pytest.raises(ValueError):
        t.f_beta(*bad)


@pytest.mark.parametrize(("precision", "recall"), [(0.3, 0.7), (1.0, 0.1), (0.25, 1.0), (0.0, 0.5), (0.1, 1e-9)])
def test_f_beta_with_beta_0_is_precision(precision: float, recall: float) -> None:
    # docs/methods.md X3: (1 + 0)·P·R / (0·P + R) = P, exactly, whatever the recall (as long as something was found)
    assert t.f_beta(precision, recall, 0.0) == precision


def test_f_beta_with_beta_0_is_zero_when_nothing_relevant_was_found() -> None:
    assert t.f_beta(0.0, 0.0, 0.0) == 0.0
    assert t.set_f_beta(["x", "y"], ["a"], 0.0) == 0.0
    assert t.set_f_beta(["a", "x", "y", "z"], ["a", "b"], 0.0) == 0.25  # precision 1/4, recall 1/2


def test_an_f_beta_term_with_beta_0_scores_precision() -> None:
    spec = validate_reward_spec({"terms": [{"type": "f_beta", "beta": 0}]})
    assert isinstance(spec.terms[0], FBetaTerm) and spec.terms[0].beta == 0.0


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0, 2.0, 4.0, 10.0])
@pytest.mark.parametrize(
    ("predicted", "gold"),
    [
        ({"a", "b"}, {"a", "c"}),
        ({"a"}, {"a", "b", "c", "d"}),
        ({"a", "b", "c", "d", "e"}, {"a"}),
        ({"a", "b", "c"}, {"a", "b", "c"}),
        ({"x", "y"}, {"a", "b"}),
        (set(), {"a", "b"}),
        ({"a", "b", "c", "d"}, {"c", "d", "e", "f", "g", "h"}),
    ],
)
def test_f_beta_matches_sklearn_fbeta_score(predicted: set[str], gold: set[str], beta: float) -> None:
    assert t.set_f_beta(predicted, gold, beta) == pytest.approx(_sklearn_fbeta(predicted, gold, beta), abs=1e-12)


def test_set_f_beta_is_zero_without_gold_docs_even_for_an_empty_output() -> None:
    assert t.set_f_beta([], [], 4.0) == 0.0
    assert t.set_f_beta(["a"], [], 4.0) == 0.0


def test_set_f_beta_counts_repeated_ids_once() -> None:
    assert t.set_f_beta(["a", "a", "a", "b"], ["a", "c"], 1.0) == pytest.approx(0.5)


def test_set_precision_recall_hand_computed() -> None:
    assert t.set_precision_recall(["a", "b", "c", "d"], ["a", "e"]) == (0.25, 0.5)
    assert t.set_precision_recall([], ["a"]) == (0.0, 0.0)


# --- trajectory recall, answers -------------------------------------------------------------------------------------


def test_set_recall_is_the_fraction_of_gold_seen() -> None:
    assert t.set_recall(["a", "x", "y", "c"], ["a", "b", "c", "d"]) == 0.5
    assert t.set_recall(["a"], []) == 0.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The  Eiffel Tower!", "eiffel tower"),
        ("  an apple, a pear ", "apple pear"),
        ("Theatre", "theatre"),
        ("U.S.A.", "usa"),
        ("the", ""),
    ],
)
def test_normalize_answer_follows_squad(text: str, expected: str) -> None:
    assert t.normalize_answer(text) == expected


def test_exact_match_strips_whitespace_and_is_case_sensitive_by_default() -> None:
    assert t.exact_match("  Paris ", ["Paris"]) == 1.0
    assert t.exact_match("paris", ["Paris"]) == 0.0
    assert t.exact_match("paris", ["London", "Paris"], case_sensitive=False) == 1.0


def test_exact_match_never_matches_a_missing_or_blank_answer() -> None:
    assert t.exact_match(None, ["Paris"]) == 0.0
    assert t.exact_match("  ", ["", " "]) == 0.0


def test_normalized_match_ignores_case_punctuation_and_articles() -> None:
    assert t.normalized_match("the Eiffel tower.", ["Eiffel Tower"]) == 1.0
    assert t.normalized_match("Eiffel", ["Eiffel Tower"]) == 0.0
    assert t.normalized_match("The", ["a"]) == 0.0
    assert t.normalized_match(None, ["x"]) == 0.0


def test_final_answer_found_uses_answer_chunks_when_labelled() -> None:
    assert t.final_answer_found(["c1", "c2"], ["c2"], None, []) is True
    # With chunk labels the answer text is not consulted.
    assert t.final_answer_found(["c1"], ["c2"], "Paris", ["Paris"]) is False


def test_final_answer_found_falls_back_to_normalized_text_without_answer_chunks() -> None:
    assert t.final_answer_found([], [], "paris!", ["Paris"]) is True
    assert t.final_answer_found(["c1"], [], "", ["Paris"]) is False


# --- prune penalty (X4) ---------------------------------------------------------------------------------------------

P = t.PRUNE_TOOL


@pytest.mark.parametrize(
    ("sequence", "expected"),
    [
        ([], 0.0),
        ([P, P, P], 0.0),
        ([P] * 4, 0.1),
        ([P] * 5, 0.2),
        ([P] * 4 + ["search_corpus"] + [P] * 4, 0.2),
        ([P] * 10, 0.5),
        ([P] * 8, 0.5),
        ([P, "read_document", P, "grep_corpus", P, "search_corpus", P], 0.0),
        ([P] * 6 + ["search_corpus"] + [P] * 6, 0.5),
    ],
)
def test_prune_penalty_charges_calls_beyond_three_per_run_capped_per_trajectory(
    sequence: list[str], expected: float
) -> None:
    assert t.prune_penalty(sequence) == pytest.approx(expected)


def test_consecutive_runs_lists_maximal_runs_in_order() -> None:
    assert t.consecutive_runs([P, P, "x", P, "y", "z", P, P, P]) == [2, 1, 3]


def test_prune_penalty_honours_custom_parameters() -> None:
    assert t.prune_penalty([P] * 5, per_call=0.25, free_calls=0, cap=10.0) == pytest.approx(1.25)


# --- turn penalty (X5) ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("turns", "expected"), [(0, 0.0), (64, 0.0), (80, 0.125), (96, 0.25), (128, 0.5), (200, 0.5)])
def test_turn_penalty_ramps_from_64_to_128_turns(turns: int, expected: float) -> None:
    assert t.turn_penalty(turns) == pytest.approx(expected)


def test_turn_penalty_rejects_a_zero_ramp() -> None:
    with pytest.raises(ValueError):
        t.turn_penalty(10, ramp=0)


# --- combination (X2) -----------------------------------------------------------------------------------------------


def _good_trajectory(**overrides: Any) -> Trajectory:
    fields: dict[str, Any] = {
        "id": "t1",
        "answer": "Ada Lovelace",
        "gold_answers": ["Ada Lovelace"],
        "output_doc_ids": ["d1", "d2"],
        "gold_doc_ids": ["d1", "d3"],
        "seen_doc_ids": ["d1", "d2", "d3", "d4"],
        "answer_doc_ids": ["d1"],
    }
    fields.update(overrides)
    return Trajectory(**fields)


def test_context1_reward_combines_terms_with_their_weights() -> None:
    result = score_trajectory(context1_spec(), _good_trajectory())
    # F_4 with P = R = 0.5 is 0.5; trajectory recall 1; answer chunk in output -> r_fa = 1.
    assert result.terms == {
        "f_beta": pytest.approx(0.5),
        "trajectory_recall": 1.0,
        "final_answer_bonus": 1.0,
        "prune_penalty": 0.0,
        "turn_penalty": 0.0,
    }
    assert result.pre_penalty == pytest.approx(0.7 * 0.5 + 0.3 * 1.0 + 1.0)
    assert result.reward == pytest.approx(1.65)
    assert result.penalty == 0.0


def test_context1_reward_subtracts_prune_and_turn_penalties() -> None:
    turns = _tool_turns([P] * 5) + _assistant_turns(91)  # 96 assistant turns, one run of 5 prunes
    result = score_trajectory(context1_spec(), _good_trajectory(turns=turns))
    assert result.terms["prune_penalty"] == pytest.approx(0.2)
    assert result.terms["turn_penalty"] == pytest.approx(0.25)
    assert result.penalty == pytest.approx(0.45)
    assert result.reward == pytest.approx(1.65 - 0.45)


def test_context1_floor_applies_only_to_trajectories_without_error() -> None:
    spec = context1_spec(floor=0.05)
    # Nothing found and 200 turns: raw = 0 - 0.5 = -0.5.
    bare = {"output_doc_ids": [], "seen_doc_ids": [], "answer_doc_ids": ["d1"], "turns": _assistant_turns(200)}
    completed = score_trajectory(spec, _good_trajectory(**bare))
    failed = score_trajectory(spec, _good_trajectory(**bare, error="tool crashed"))
    assert completed.pre_penalty == 0.0
    # The floor lifts to 0.05, then the cap at r_pre = 0 wins (X2: min outside max).
    assert completed.reward == 0.0
    assert failed.reward == pytest.approx(-0.5)


def test_floor_without_cap_lifts_completed_trajectories() -> None:
    spec = validate_reward_spec({"terms": [{"type": "turn_penalty"}], "floor": 0.1})
    completed = score_trajectory(spec, Trajectory(id="a", turns=_assistant_turns(200)))
    failed = score_trajectory(spec, Trajectory(id="b", turns=_assistant_turns(200), error="timeout"))
    assert completed.reward == pytest.approx(0.1)
    assert failed.reward == pytest.approx(-0.5)


def test_floor_is_a_lower_bound_and_keeps_higher_rewards() -> None:
    spec = context1_spec(floor=0.0)
    turns = _tool_turns([P] * 10) + _assistant_turns(190)  # penalties 0.5 + 0.5
    result = score_trajectory(spec, _good_trajectory(turns=turns))
    assert result.penalty == pytest.approx(1.0)
    assert result.reward == pytest.approx(0.65)


def test_cap_at_pre_penalty_bounds_the_reward_by_the_gains() -> None:
    spec = validate_reward_spec(
        {"terms": [{"type": "f_beta", "beta": 1}, {"type": "turn_penalty"}], "floor": 0.9, "cap_at_pre_penalty": True}
    )
    traj = Trajectory(id="a", output_doc_ids=["d1", "x"], gold_doc_ids=["d1", "y"])  # F1 = 0.5
    result = score_trajectory(spec, traj)
    assert result.pre_penalty == pytest.approx(0.5)
    assert result.reward == pytest.approx(0.5)
    uncapped = score_trajectory(spec.model_copy(update={"cap_at_pre_penalty": False}), traj)
    assert uncapped.reward == pytest.approx(0.9)


def test_negative_weights_and_custom_names_are_respected() -> None:
    spec = validate_reward_spec(
        {
            "terms": [
                {"type": "exact_match", "name": "em_cs", "weight": 2.0},
                {"type": "exact_match", "name": "em_ci", "case_sensitive": False, "weight": -1.0},
            ]
        }
    )
    result = score_trajectory(spec, Trajectory(id="a", answer="paris", gold_answers=["Paris"]))
    assert result.terms == {"em_cs": 0.0, "em_ci": 1.0}
    assert result.reward == pytest.approx(-1.0)


def test_score_many_keeps_input_order() -> None:
    trajs = [_good_trajectory(id="a"), _good_trajectory(id="b", output_doc_ids=[], answer_doc_ids=["zz"])]
    results = score_many(context1_spec(), trajs)
    assert [type(r) for r in results] == [RewardResult, RewardResult]
    assert results[0].reward > results[1].reward


def test_context1_spec_has_the_methods_weights() -> None:
    spec = context1_spec(beta=2.0, floor=0.01)
    weights = {term.name: term.weight for term in spec.terms}
    assert weights == {
        "f_beta": 0.7,
        "trajectory_recall": 0.3,
        "final_answer_bonus": 1.0,
        "prune_penalty": 1.0,
        "turn_penalty": 1.0,
    }
    assert isinstance(spec.terms[0], FBetaTerm) and spec.terms[0].beta == 2.0
    assert spec.floor == 0.01 and spec.cap_at_pre_penalty is True
    assert [term.kind for term in spec.terms] == ["gain", "gain", "gain", "penalty", "penalty"]


# --- schema validation ----------------------------------------------------------------------------------------------


def test_validate_reward_spec_accepts_json_text_and_fills_defaults() -> None:
    spec = validate_reward_spec('{"terms": [{"type": "prune_penalty"}, {"type": "final_answer_bonus", "bonus": 2}]}')
    prune, bonus = spec.terms
    assert isinstance(prune, PrunePenaltyTerm) and (prune.per_call, prune.free_calls, prune.cap) == (0.1, 3, 0.5)
    assert isinstance(bonus, FinalAnswerBonusTerm) and bonus.bonus == 2.0 and bonus.weight == 1.0
    assert spec.term_names == ["prune_penalty", "final_answer_bonus"]
    assert spec.floor is None and spec.cap_at_pre_penalty is False


def test_bad_beta_error_names_term_and_field() -> None:
    errors = _spec_errors(
        {"terms": [{"type": "exact_match"}, {"type": "trajectory_recall"}, {"type": "f_beta", "beta": -1}]}
    )
    assert errors == [
        {
            "field": "terms[2].beta",
            "term": "f_beta",
            "message": "terms[2] (f_beta).beta: Input should be greater than or equal to 0",
        }
    ]


def test_unknown_term_type_error_lists_the_valid_types() -> None:
    (error,) = _spec_errors({"terms": [{"type": "bleu"}]})
    assert error["field"] == "terms[0].type"
    assert error["term"] is None
    assert "'bleu'" in error["message"]
    for name in TERM_TYPES:
        assert name in error["message"]


def test_missing_type_error_says_to_add_one() -> None:
    (error,) = _spec_errors({"terms": [{"weight": 0.5}]})
    assert error["field"] == "terms[0].type"
    assert "add" in error["message"] and "f_beta" in error["message"]


def test_non_numeric_weight_error_names_term_and_field() -> None:
    (error,) = _spec_errors({"terms": [{"type": "turn_penalty", "weight": "heavy"}]})
    assert error["field"] == "terms[0].weight"
    assert error["term"] == "turn_penalty"
    assert error["message"].startswith("terms[0] (turn_penalty).weight: Input should be a valid number")


def test_non_finite_weight_is_rejected() -> None:
    (error,) = _spec_errors({"terms": [{"type": "f_beta", "weight": float("nan")}]})
    assert error["field"] == "terms[0].weight" and "finite" in error["message"]


def test_extra_field_error_says_to_remove_it_and_lists_allowed_fields() -> None:
    (error,) = _spec_errors({"terms": [{"type": "f_beta", "betta": 2}]})
    assert error["field"] == "terms[0].betta"
    assert error["term"] == "f_beta"
    assert "remove it" in error["message"] and "beta" in error["message"]


def test_extra_top_level_field_is_rejected() -> None:
    (error,) = _spec_errors({"terms": [{"type": "f_beta"}], "epsilon": 0.1})
    assert error["field"] == "epsilon" and error["term"] is None
    assert "floor" in error["message"]


def test_duplicate_term_names_error_names_both_indexes() -> None:
    (error,) = _spec_errors(
        {"terms": [{"type": "f_beta"}, {"type": "trajectory_recall"}, {"type": "f_beta", "beta": 2}]}
    )
    assert error["field"] == "terms[2].name"
    assert error["term"] == "f_beta"
    assert "terms[2]" in error["message"] and "terms[0]" in error["message"] and "name" in error["message"]


def test_explicit_duplicate_names_across_types_are_rejected() -> None:
    (error,) = _spec_errors({"terms": [{"type": "f_beta", "name": "x"}, {"type": "turn_penalty", "name": "x"}]})
    assert error["field"] == "terms[1].name" and error["term"] == "turn_penalty"


def test_empty_terms_error_says_to_add_a_term() -> None:
    (error,) = _spec_errors({"terms": []})
    assert error["field"] == "terms" and "at least one term" in error["message"]


def test_every_problem_is_reported_at_once() -> None:
    errors = _spec_errors({"terms": [{"type": "prune_penalty", "free_calls": -1, "cap": -0.5}], "floor": "low"})
    assert {e["field"] for e in errors} == {"terms[0].free_calls", "terms[0].cap", "floor"}
    assert "terms[0] (prune_penalty).free_calls" in str(RewardSpecError(errors))


def test_non_object_spec_is_rejected_with_a_hint() -> None:
    (error,) = _spec_errors(["f_beta"])
    assert error["field"] == "" and "terms" in error["message"]


def test_term_name_with_spaces_is_rejected() -> None:
    (error,) = _spec_errors({"terms": [{"type": "f_beta", "name": "my term"}]})
    assert error["field"] == "terms[0].name" and not error["message"].count("Value error")


def test_reward_spec_error_is_a_value_error() -> None:
    assert issubclass(RewardSpecError, ValueError)


def test_term_types_lists_every_term() -> None:
    assert TERM_TYPES == (
        "exact_match",
        "normalized_match",
        "f_beta",
        "trajectory_recall",
        "final_answer_bonus",
        "prune_penalty",
        "turn_penalty",
        "tests_passed",
        "hidden_tests",
        "broken_tool_calls",
        "todo_left",
        "length_penalty",
        "session_feedback",
        "item_f1",
        "parallel_instantiation",
        "subagent_finish",
        "critical_steps",
        "rubric_judge",
    )


def test_tests_passed_term_reads_the_fraction_and_counts_a_missing_one_as_zero() -> None:
    spec = validate_reward_spec({"terms": [{"type": "tests_passed"}]})
    assert score_trajectory(spec, Trajectory(id="t", tests_passed=0.75)).reward == 0.75
    assert score_trajectory(spec, Trajectory(id="t")).reward == 0.0


# --- spec_hash ------------------------------------------------------------------------------------------------------


def test_spec_hash_is_stable_under_key_order_defaults_and_number_spelling() -> None:
    a = validate_reward_spec({"terms": [{"type": "f_beta", "beta": 4, "weight": 0.7}], "floor": 0})
    b = validate_reward_spec(
        json.loads(
            '{"floor": 0.0, "cap_at_pre_penalty": false, "terms": [{"weight": 0.7, "name": "f_beta", '
            '"beta": 4.0, "type": "f_beta"}]}'
        )
    )
    assert spec_hash(a) == spec_hash(b)
    assert len(spec_hash(a)) == 64 and int(spec_hash(a), 16) >= 0


def test_spec_hash_changes_with_any_parameter() -> None:
    base = context1_spec()
    assert spec_hash(base) == spec_hash(context1_spec())
    assert spec_hash(base) != spec_hash(context1_spec(beta=2.0))
    assert spec_hash(base) != spec_hash(context1_spec(floor=0.1))


def test_reward_spec_round_trips_through_json() -> None:
    spec = context1_spec()
    again = validate_reward_spec(spec.model_dump_json())
    assert again == spec and spec_hash(again) == spec_hash(spec)
    assert validate_reward_spec(spec) is spec


def test_reward_spec_is_immutable() -> None:
    spec = RewardSpec(terms=[TurnPenaltyTerm()])
    with pytest.raises(ValueError):
        spec.floor = 1.0


# --- histogram ------------------------------------------------------------------------------------------------------


def test_histogram_counts_values_into_equal_bins() -> None:
    hist = histogram([0.0, 0.1, 0.5, 0.9, 1.0], bins=4)
    assert hist["edges"] == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])
    assert hist["counts"] == [2, 0, 1, 2]


def test_histogram_of_no_values_has_zero_counts() -> None:
    hist = histogram([], bins=20)
    assert len(hist["edges"]) == 21 and hist["counts"] == [0] * 20


def test_histogram_of_equal_values_puts_them_in_one_bin() -> None:
    hist = histogram([0.3, 0.3, 0.3], bins=5)
    assert len(hist["edges"]) == 6 and sum(hist["counts"]) == 3
    assert hist["edges"][0] < 0.3 < hist["edges"][-1]
    assert max(hist["counts"]) == 3


def test_histogram_skips_non_finite_values() -> None:
    hist = histogram([1.0, math.nan, math.inf, 2.0], bins=2)
    assert hist["counts"] == [1, 1]


def test_every_term_class_declares_what_it_reads_and_every_table_derives_from_the_classes() -> None:
    from typing import get_args

    from workers.rewards.schema import TERM_CLASSES, TERM_INPUTS, TermSpec
    from workers.rewards.term_base import TermInputs

    for cls in TERM_CLASSES:
        assert isinstance(cls.__dict__.get("reads"), TermInputs), f"{cls.__name__} does not declare `reads`"
        assert all(option for option in cls.reads.fields), cls.__name__
    assert TERM_TYPES == tuple(cls.model_fields["type"].default for cls in TERM_CLASSES)
    assert TERM_INPUTS == {cls.model_fields["type"].default: cls.reads for cls in TERM_CLASSES}
    union, _discriminator = get_args(TermSpec)
    assert get_args(union) == TERM_CLASSES
    assert RewardSpec.model_fields["terms"].annotation == list[TermSpec]


def test_the_spec_validates_every_term_type_through_the_derived_union() -> None:
    spec = validate_reward_spec({"terms": [{"type": name} for name in TERM_TYPES]})
    assert [type(term).__name__ for term in spec.terms] == [
        "ExactMatchTerm",
        "NormalizedMatchTerm",
        "FBetaTerm",
        "TrajectoryRecallTerm",
        "FinalAnswerBonusTerm",
        "PrunePenaltyTerm",
        "TurnPenaltyTerm",
        "PassedTestsTerm",
        "HiddenTestsTerm",
        "BrokenToolCallsTerm",
        "TodoLeftTerm",
        "LengthPenaltyTerm",
        "SessionFeedbackTerm",
        "ItemF1Term",
        "ParallelInstantiationTerm",
        "SubagentFinishTerm",
        "CriticalStepsTerm",
        "RubricJudgeTerm",
    ]
    with pytest.raises(RewardSpecError, match="unknown term type 'nope'; use one of: exact_match"):
        validate_reward_spec({"terms": [{"type": "nope"}]})
