"""Composer 2's coding-agent reward terms (docs/methods.md section 2): hidden tests, broken tool calls, TODOs left
in the diff and the C4 length penalty, each against values computed by hand."""

from __future__ import annotations

import math

import pytest

from workers.rewards import terms as t
from workers.rewards.schema import RewardSpecError, coding_agent_spec, validate_reward_spec
from workers.rewards.score import score_trajectory
from workers.rewards.term_types import BrokenToolCallsTerm, HiddenTestsTerm, LengthPenaltyTerm, TodoLeftTerm
from workers.trajectories import Trajectory


def _traj(**fields: object) -> Trajectory:
    return Trajectory.model_validate({"id": "t", **fields})


def _report(passed: int, total: int, *, resolved: bool | None = None) -> dict[str, object]:
    return {
        "fail_to_pass_passed": min(passed, 1),
        "fail_to_pass_total": 1,
        "pass_to_pass_passed": max(passed - 1, 0),
        "pass_to_pass_total": total - 1,
        "fraction": passed / total,
        "resolved": passed == total if resolved is None else resolved,
    }


# --- C4: the concave length cost ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("x", "k", "q", "expected"),
    [
        (3.0, 1.0, 0.0, 3.0),  # q = 0: linear, ((1 + 3)^1 − 1) / 1
        (3.0, 1.0, 2.0, 0.75),  # q = 2: x / (1 + k·x) = 3 / 4
        (4.0, 2.0, 0.5, 2.0),  # ((1 + 8)^0.5 − 1) / (2 · 0.5) = (3 − 1) / 1
        (1.0, 1.0, 3.0, 0.375),  # (2^−2 − 1) / (1 · −2) = 0.75 / 2
        (3.0, 0.5, 1.0, 2 * math.log(2.5)),  # the log limit: ln(1 + 1.5) / 0.5
        (0.0, 0.7, 1.3, 0.0),  # C(0) = 0
    ],
)
def test_c4_matches_hand_computed_values(x: float, k: float, q: float, expected: float) -> None:
    assert t.concave_length_cost(x, k=k, q=q) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_c4_approaches_the_log_limit_continuously_as_q_nears_1() -> None:
    limit = math.log1p(0.5 * 3.0) / 0.5
    for q in (1 - 1e-9, 1 + 1e-9, 1 - 1e-13, 1 + 1e-13):
        assert t.concave_length_cost(3.0, k=0.5, q=q) == pytest.approx(limit, rel=1e-8)


@pytest.mark.parametrize("q", [0.25, 0.5, 1.0, 2.0, 4.0])
def test_c4_is_increasing_and_concave_with_slope_1_at_0(q: float) -> None:
    xs = [0.5 * i for i in range(40)]
    values = [t.concave_length_cost(x, k=0.8, q=q) for x in xs]
    steps = [b - a for a, b in zip(values, values[1:], strict=False)]
    assert all(step > 0 for step in steps)
    assert all(later < earlier for earlier, later in zip(steps, steps[1:], strict=False))  # concave down
    assert t.concave_length_cost(1e-9, k=0.8, q=q) == pytest.approx(1e-9, rel=1e-6)  # C'(0) = 1


def test_c4_saturates_at_one_over_k_q_minus_1_above_q_1() -> None:
    assert t.concave_length_cost(1e12, k=2.0, q=3.0) == pytest.approx(1 / (2.0 * 2.0), rel=1e-6)


def test_c4_refuses_k_and_q_and_x_out_of_range() -> None:
    with pytest.raises(ValueError, match="k must be a finite number > 0"):
        t.concave_length_cost(1.0, k=0.0, q=1.0)
    with pytest.raises(ValueError, match="q must be a finite number >= 0"):
        t.concave_length_cost(1.0, k=1.0, q=-0.5)
    with pytest.raises(ValueError, match="x must be a finite number >= 0"):
        t.concave_length_cost(-1.0, k=1.0, q=1.0)


def test_length_penalty_weighs_every_length_statistic() -> None:
    stats = {
        "thinking_tokens": 1000,
        "tool_call_tokens": 500,
        "tool_output_tokens": 9999,
        "final_message_tokens": 100,
        "summary_tokens": 400,
        "tool_calls": 10,
        "turns": 6,
    }
    term = LengthPenaltyTerm()
    # defaults: x = 0.001·(1000 + 500 + 100) + 0·9999 + 0.01·(10 + 6) = 1.76; q = 2, k = 1: x / (1 + x)
    assert term.length(_traj(length_stats=stats)) == pytest.approx(1.76)
    assert term.value(_traj(length_stats=stats)) == pytest.approx(1.76 / 2.76)
    linear = LengthPenaltyTerm(
        k=1.0,
        q=0.0,
        weights={
            "tool_output_tokens": 0.5,
            "turns": 0.0,
            "tool_calls": 0.0,
            "thinking_tokens": 0.0,
            "tool_call_tokens": 0.0,
            "final_message_tokens": 0.0,
        },
    )
    assert linear.value(_traj(length_stats=stats)) == pytest.approx(4999.5)
    assert term.value(_traj()) == 0.0  # no statistics: no cost


def test_length_penalty_refuses_bad_k_q_and_weights_naming_the_field() -> None:
    with pytest.raises(RewardSpecError) as caught:
        validate_reward_spec({"terms": [{"type": "length_penalty", "k": 0, "q": -1}]})
    fields = {error["field"]: error["message"] for error in caught.value.errors}
    assert set(fields) == {"terms[0].k", "terms[0].q"}
    assert fields["terms[0].k"].startswith("terms[0] (length_penalty).k: k must be > 0")
    assert fields["terms[0].q"].startswith("terms[0] (length_penalty).q: q must be >= 0")
    zero = dict.fromkeys(
        ["thinking_tokens", "tool_call_tokens", "tool_output_tokens", "final_message_tokens", "tool_calls", "turns"], 0
    )
    with pytest.raises(RewardSpecError, match=r"weights: every weight is 0"):
        validate_reward_spec({"terms": [{"type": "length_penalty", "weights": zero}]})
    with pytest.raises(RewardSpecError, match=r"weights.tokens: Extra inputs .* \(allowed fields: thinking_tokens"):
        validate_reward_spec({"terms": [{"type": "length_penalty", "weights": {"tokens": 1}}]})


# --- hidden tests -------------------------------------------------------------------------------------------------


def test_hidden_tests_pays_the_fraction_or_all_or_nothing() -> None:
    partial = _traj(hidden_tests=_report(3, 4), tests_passed=0.75)
    whole = _traj(hidden_tests=_report(4, 4), tests_passed=1.0)
    assert HiddenTestsTerm(mode="fraction").value(partial) == 0.75
    assert HiddenTestsTerm(mode="all_or_nothing").value(partial) == 0.0
    assert HiddenTestsTerm(mode="all_or_nothing").value(whole) == 1.0
    assert HiddenTestsTerm().mode == "all_or_nothing"


def test_hidden_tests_falls_back_to_tests_passed_and_counts_no_run_as_zero() -> None:
    assert HiddenTestsTerm(mode="fraction").value(_traj(tests_passed=0.5)) == 0.5
    assert HiddenTestsTerm().value(_traj(tests_passed=1.0)) == 1.0
    assert HiddenTestsTerm().value(_traj(tests_passed=0.99)) == 0.0
    assert HiddenTestsTerm(mode="fraction").value(_traj()) == 0.0


def test_hidden_tests_mode_is_validated() -> None:
    with pytest.raises(RewardSpecError, match=r"terms\[0\] \(hidden_tests\).mode: Input should be 'fraction'"):
        validate_reward_spec({"terms": [{"type": "hidden_tests", "mode": "most"}]})


# --- broken tool calls --------------------------------------------------------------------------------------------


def _turns(malformed: int, failed: int, ok: int) -> list[dict[str, object]]:
    turns: list[dict[str, object]] = []
    for _ in range(ok):
        turns += [{"role": "assistant", "tool": "read_file"}, {"role": "tool", "tool": "read_file", "content": "1| x"}]
    for _ in range(failed):
        turns += [
            {"role": "assistant", "tool": "edit_file"},
            {"role": "tool", "tool": "edit_file", "content": "error: the search text was not found"},
        ]
    for _ in range(malformed):
        turns += [{"role": "assistant", "content": "<tool_call>{bad"}, {"role": "tool", "content": "error: invalid"}]
    return turns


def test_broken_tool_calls_costs_per_malformed_call_up_to_the_cap() -> None:
    assert BrokenToolCallsTerm().value(_traj(turns=_turns(3, 2, 4))) == pytest.approx(0.3)
    assert BrokenToolCallsTerm().value(_traj(turns=_turns(7, 0, 0))) == 0.5  # capped
    assert BrokenToolCallsTerm().value(_traj(turns=_turns(0, 5, 3))) == 0.0  # failed calls are free by default
    priced = BrokenToolCallsTerm(per_call=0.2, per_tool_error=0.05, cap=1.0)
    assert priced.value(_traj(turns=_turns(1, 2, 0))) == pytest.approx(0.3)


# --- TODOs left in the diff ---------------------------------------------------------------------------------------

DIFF = """diff --git a/pkg/mod.py b/pkg/mod.py
--- a/pkg/mod.py
+++ b/pkg/mod.py
@@ -1,4 +1,6 @@
 def f(x):
-    # TODO: handle None
+    # TODO: handle None
+    # FIXME later
+++ TODO in a line that starts with two plus signs
     return x
diff --git a/pkg/new.py b/pkg/new.py
new file mode 100644
--- /dev/null
+++ b/pkg/new.py
@@ -0,0 +1,3 @@
+X = 1  # XXX
+SIZE = "XXXL"  # not a marker
+todos = []  # lower case: not a marker
"""


def test_todo_left_counts_added_marker_lines_but_not_carried_ones() -> None:
    # Added: "# FIXME later", "++ TODO ...", "X = 1  # XXX"; the re-written "# TODO: handle None" was already there.
    assert t.todo_lines_added(DIFF) == 3
    assert TodoLeftTerm().value(_traj(diff=DIFF)) == pytest.approx(0.3)
    assert TodoLeftTerm(per_line=0.05, cap=1.0).value(_traj(diff=DIFF)) == pytest.approx(0.15)
    assert TodoLeftTerm().value(_traj(diff="")) == 0.0
    assert TodoLeftTerm().value(_traj()) == 0.0


def test_diff_changed_lines_reads_hunks_by_their_counts() -> None:
    changes = t.diff_changed_lines(DIFF)
    removed, added = changes["pkg/mod.py"]
    assert removed == ["    # TODO: handle None"]
    assert added[-1] == "++ TODO in a line that starts with two plus signs"
    assert changes["pkg/new.py"][0] == [] and len(changes["pkg/new.py"][1]) == 3


# --- the composed reward ------------------------------------------------------------------------------------------


def test_the_coding_agent_spec_combines_every_term() -> None:
    traj = _traj(
        hidden_tests=_report(4, 4),
        tests_passed=1.0,
        turns=_turns(2, 0, 3),
        diff=DIFF.split("diff --git a/pkg/new.py")[0],  # one added marker line: "# FIXME later", "++ TODO ..."
        length_stats={
            "thinking_tokens": 1000,
            "tool_call_tokens": 500,
            "final_message_tokens": 100,
            "tool_calls": 10,
            "turns": 6,
        },
    )
    result = score_trajectory(coding_agent_spec(), traj)
    assert result.terms == pytest.approx(
        {"hidden_tests": 1.0, "broken_tool_calls": 0.2, "todo_left": 0.2, "length_penalty": 1.76 / 2.76}
    )
    assert result.reward == pytest.approx(1.0 - 0.2 - 0.2 - 0.1 * 1.76 / 2.76)
    assert validate_reward_spec(coding_agent_spec().model_dump(mode="json")) == coding_agent_spec()
