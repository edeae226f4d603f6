"""Pure reward formulas (docs/methods.md section 3, Context-1: X2-X5).

Every function here is deterministic and side-effect free, takes plain Python values and returns a float, so it
can be unit-tested against hand-computed values and reused outside `RewardSpec`. All returned values are
dimensionless; gains are fractions in [0, 1] unless a bonus says otherwise, penalties are magnitudes >= 0 that
the caller subtracts.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Iterable, Sequence

PRUNE_TOOL = "prune_chunks"
"""Tool name whose consecutive calls docs/methods.md X4 penalises."""

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def _check_fraction(name: str, value: float) -> None:
    if not (0.0 <= value <= 1.0):
        raise ValueError(f"{name} must lie in [0, 1], got {value}")


def f_beta(precision: float, recall: float, beta: float) -> float:
    """F-beta score from a precision and a recall (both fractions in [0, 1]); returns a fraction in [0, 1].

    `beta` >= 0 weights recall beta² times as much as precision (beta = 4 -> recall counts 16x). beta = 0 gives
    P·R / R = precision, the formula's own limit (recall does not count); it is returned exactly.
    When the denominator β²·P + R is 0 (R = 0, and P = 0 unless β = 0) the score is 0.0: nothing relevant was found.
    """
    _check_fraction("precision", precision)
    _check_fraction("recall", recall)
    if not (beta >= 0.0 and math.isfinite(beta)):
        raise ValueError(f"beta must be a finite number >= 0, got {beta}")
    b2 = beta * beta
    denominator = b2 * precision + recall
    if denominator == 0.0:
        return 0.0
    if b2 == 0.0:
        return precision  # docs/methods.md X3 with β = 0: (1 + 0)·P·R / (0·P + R) = P
    # docs/methods.md X3: F_β = (1 + β²)·P·R / (β²·P + R)
    return (1.0 + b2) * precision * recall / denominator


def set_precision_recall(predicted: Iterable[str], gold: Iterable[str]) -> tuple[float, float]:
    """Set precision and recall of `predicted` ids against `gold` ids; both fractions in [0, 1].

    Ids are compared as sets, so repeats count once. Precision is 0.0 when nothing is predicted and recall is
    0.0 when there is no gold id (an empty reference gives nothing to find, so nothing is rewarded).
    """
    predicted_set = set(predicted)
    gold_set = set(gold)
    hits = len(predicted_set & gold_set)
    precision = hits / len(predicted_set) if predicted_set else 0.0
    recall = hits / len(gold_set) if gold_set else 0.0
    return precision, recall


def set_recall(found: Iterable[str], gold: Iterable[str]) -> float:
    """|found ∩ gold| / |gold| as a fraction in [0, 1]; 0.0 when `gold` is empty."""
    gold_set = set(gold)
    if not gold_set:
        return 0.0
    return len(gold_set & set(found)) / len(gold_set)


def set_f_beta(predicted: Iterable[str], gold: Iterable[str], beta: float) -> float:
    """F-beta of a predicted id set against a gold id set; a fraction in [0, 1].

    Edge cases, chosen so an empty reference or an empty output never earns reward:
    - no gold ids -> 0.0 (even when nothing is predicted either);
    - no predicted ids -> 0.0 (precision and recall are both 0);
    - no overlap -> 0.0.
    """
    gold_set = set(gold)
    if not gold_set:
        return 0.0
    precision, recall = set_precision_recall(predicted, gold_set)
    return f_beta(precision, recall, beta)


def normalize_answer(text: str) -> str:
    """SQuAD-style answer normalisation: lowercase, drop punctuation, drop articles (a/an/the), collapse spaces."""
    lowered = text.lower()
    # Punctuation goes before articles so "the," still loses its article.
    no_punct = "".join(ch for ch in lowered if ch not in _PUNCTUATION)
    no_articles = _ARTICLES.sub(" ", no_punct)
    return " ".join(no_articles.split())


def exact_match(answer: str | None, gold_answers: Iterable[str], *, case_sensitive: bool = True) -> float:
    """1.0 if the stripped answer equals any stripped gold answer, else 0.0.

    A missing or blank answer never matches, even a blank gold answer: blank text is no answer.
    With `case_sensitive=False` both sides are case-folded first.
    """
    if answer is None or not answer.strip():
        return 0.0
    candidate = answer.strip()
    if not case_sensitive:
        candidate = candidate.casefold()
    for gold in gold_answers:
        reference = gold.strip()
        if not case_sensitive:
            reference = reference.casefold()
        if reference and candidate == reference:
            return 1.0
    return 0.0


def normalized_match(answer: str | None, gold_answers: Iterable[str]) -> float:
    """1.0 if `normalize_answer(answer)` equals the normalised form of any gold answer, else 0.0.

    An answer that normalises to the empty string (None, blank, only punctuation or articles) never matches.
    """
    if answer is None:
        return 0.0
    candidate = normalize_answer(answer)
    if not candidate:
        return 0.0
    return 1.0 if any(candidate == normalize_answer(gold) for gold in gold_answers) else 0.0


def final_answer_found(
    output_doc_ids: Iterable[str],
    answer_doc_ids: Iterable[str],
    answer: str | None,
    gold_answers: Iterable[str],
) -> bool:
    """Whether the final output contains the answer (docs/methods.md section 3: "final-answer-found", binary).

    The primary test is the one in X2: some output chunk id is one of the chunks that directly contain the
    answer. Tasks without chunk-level answer labels (empty `answer_doc_ids`) fall back to comparing the answer
    text with the gold answers after SQuAD normalisation.
    """
    answer_set = set(answer_doc_ids)
    if answer_set:
        return not answer_set.isdisjoint(output_doc_ids)
    return normalized_match(answer, gold_answers) == 1.0


def consecutive_runs(tool_sequence: Sequence[str], tool: str = PRUNE_TOOL) -> list[int]:
    """Lengths (call counts) of the maximal runs of consecutive `tool` calls in `tool_sequence`, in order."""
    runs: list[int] = []
    current = 0
    for name in tool_sequence:
        if name == tool:
            current += 1
        elif current:
            runs.append(current)
            current = 0
    if current:
        runs.append(current)
    return runs


def prune_penalty(
    tool_sequence: Sequence[str],
    *,
    per_call: float = 0.1,
    free_calls: int = 3,
    cap: float = 0.5,
    tool: str = PRUNE_TOOL,
) -> float:
    """Penalty (reward units, >= 0) for long runs of consecutive prune calls (docs/methods.md X4).

    Within each maximal run of consecutive `tool` calls the first `free_calls` are free and each further call
    costs `per_call`. Decision (docs/methods.md section 7 leaves it open): the `cap` bounds the total over the whole
    trajectory, not each run separately, so the term never exceeds `cap` however many runs there are.
    Examples with the defaults: one run of 5 -> 0.2; two runs of 4 -> 0.2; one run of 10 -> 0.7, capped to 0.5.
    """
    if per_call < 0 or free_calls < 0 or cap < 0:
        raise ValueError("per_call, free_calls and cap must all be >= 0")
    excess = sum(max(0, run - free_calls) for run in consecutive_runs(tool_sequence, tool))
    # docs/methods.md X4: p_prune = per_call × (calls beyond free_calls in each consecutive run), capped per trajectory
    return min(per_call * excess, cap)


def turn_penalty(turns: int, *, start: int = 64, ramp: int = 64, max_penalty: float = 0.5) -> float:
    """Penalty (reward units, in [0, max_penalty]) for long trajectories (docs/methods.md X5).

    `turns` is the number of assistant turns. The penalty is 0 up to `start` turns and grows linearly to
    `max_penalty` at `start + ramp` turns, staying there beyond: with the defaults 0 at 64, 0.25 at 96 and 0.5
    from 128 on.
    """
    if ramp <= 0:
        raise ValueError(f"ramp must be > 0 turns, got {ramp}")
    if max_penalty < 0:
        raise ValueError(f"max_penalty must be >= 0, got {max_penalty}")
    fraction = (turns - start) / ramp
    # docs/methods.md X5: p_turn = max_penalty · clip((turns − start) / ramp, 0, 1)
    return max_penalty * min(max(fraction, 0.0), 1.0)


# --- Composer 2's coding-agent terms (docs/methods.md section 2: C4 and the auxiliary rewards) ------------------------

TODO_MARKERS: tuple[str, ...] = ("TODO", "FIXME", "XXX")
"""Markers of unfinished work whose addition the todo_left penalty counts (Composer 2's "to-dos created then left
unfinished")."""


def hidden_tests_reward(fraction: float | None, resolved: bool | None, *, mode: str = "all_or_nothing") -> float:
    """The hidden-test outcome reward, in [0, 1]: the fraction of hidden tests that passed ("fraction") or 1.0
    only when every one did ("all_or_nothing"). `resolved` None means it is unknown: then 1.0 iff fraction is 1.
    No report at all (`fraction` None) is 0.0: tests that never ran are never a pass."""
    if mode not in ("fraction", "all_or_nothing"):
        raise ValueError(f"mode must be 'fraction' or 'all_or_nothing', got {mode!r}")
    if fraction is None:
        return 0.0
    _check_fraction("fraction", fraction)
    if mode == "fraction":
        return fraction
    done = resolved if resolved is not None else fraction >= 1.0
    return 1.0 if done else 0.0


def broken_tool_call_penalty(
    malformed: int, tool_errors: int = 0, *, per_call: float = 0.1, per_tool_error: float = 0.0, cap: float = 0.5
) -> float:
    """Penalty (reward units, in [0, cap]) for broken tool calls: `per_call` for each malformed call (one the
    environment could not parse or run) plus `per_tool_error` for each well-formed call that failed while
    running, the total capped at `cap`. Composer 2's policy learned to emit broken calls to dodge a negative
    reward; pricing them closes that door. Defaults: 3 malformed calls -> 0.3; 7 -> 0.7, capped to 0.5."""
    if malformed < 0 or tool_errors < 0:
        raise ValueError("malformed and tool_errors must be >= 0")
    if per_call < 0 or per_tool_error < 0 or cap < 0:
        raise ValueError("per_call, per_tool_error and cap must all be >= 0")
    return min(per_call * malformed + per_tool_error * tool_errors, cap)


_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def diff_changed_lines(diff: str | None) -> dict[str, tuple[list[str], list[str]]]:
    """The lines a unified diff removes and adds, per file: {path: (removed, added)}, each line without its
    "-"/"+" prefix. Hunk line counts decide what is content, so an added line that itself starts with "++ " is
    never taken for a file header. The path is the new side's ("+++ b/path"; the old side's for a deletion)."""
    changes: dict[str, tuple[list[str], list[str]]] = {}
    if not diff:
        return changes
    path = ""
    old_left = new_left = 0
    for line in diff.splitlines():
        if old_left > 0 or new_left > 0:
            if line.startswith("-"):
                changes.setdefault(path, ([], []))[0].append(line[1:])
                old_left -= 1
            elif line.startswith("+"):
                changes.setdefault(path, ([], []))[1].append(line[1:])
                new_left -= 1
            elif line.startswith("\\"):
                pass  # "\ No newline at end of file"
            else:
                old_left -= 1
                new_left -= 1
            continue
        hunk = _HUNK.match(line)
        if hunk:
            old_left = int(hunk.group(1)) if hunk.group(1) is not None else 1
            new_left = int(hunk.group(2)) if hunk.group(2) is not None else 1
        elif line.startswith("--- "):
            old = line[4:].split("\t")[0].strip()
            path = old[2:] if old.startswith("a/") else old
        elif line.startswith("+++ "):
            new = line[4:].split("\t")[0].strip()
            if new != "/dev/null":
                path = new[2:] if new.startswith("b/") else new
    return changes


def todo_lines_added(diff: str | None, markers: Sequence[str] = TODO_MARKERS) -> int:
    """Lines a unified diff adds that hold a marker (as a whole word, case-sensitive: "TODO", not "todos" or
    "XXXL"), less those that only carry over a marked line the same file's diff removes (a TODO the agent merely
    kept on an edited line is not one it created; compared with surrounding whitespace stripped). 0 without a
    diff."""
    if not diff or not markers:
        return 0
    pattern = re.compile(r"\b(?:" + "|".join(re.escape(m) for m in markers) + r")\b")
    count = 0
    for removed, added in diff_changed_lines(diff).values():
        carried = [line.strip() for line in removed if pattern.search(line)]
        for line in added:
            if not pattern.search(line):
                continue
            if line.strip() in carried:
                carried.remove(line.strip())
            else:
                count += 1
    return count


def todo_penalty(lines: int, *, per_line: float = 0.1, cap: float = 0.3) -> float:
    """Penalty (reward units, in [0, cap]) of `per_line` for each added TODO/FIXME/XXX line, capped at `cap`."""
    if lines < 0:
        raise ValueError(f"lines must be >= 0, got {lines}")
    if per_line < 0 or cap < 0:
        raise ValueError("per_line and cap must be >= 0")
    return min(per_line * lines, cap)


def concave_length_cost(x: float, *, k: float, q: float) -> float:
    """Composer 2's length cost (docs/methods.md C4): C(x) = ((1 + k·x)^(1−q) − 1) / (k·(1−q)), for x >= 0.

    `k` > 0 sets where the curve bends (x ≈ 1/k); `q` >= 0 how much it flattens: q = 0 is linear (C = x), q in
    (0, 1) grows like x^(1−q), q = 1 is the limit ln(1 + k·x)/k and q > 1 saturates at 1/(k·(q−1)). C(0) = 0,
    C'(0) = 1 and C is increasing and concave for every q > 0. Returned in the units of x.

    Computed as expm1((1−q)·L) / (k·(1−q)) with L = log1p(k·x), which is exact at q = 1 (the log limit, L/k)
    and keeps its precision as q approaches 1 instead of dividing two vanishing numbers.
    """
    if not (math.isfinite(k) and k > 0):
        raise ValueError(f"k must be a finite number > 0, got {k}")
    if not (math.isfinite(q) and q >= 0):
        raise ValueError(f"q must be a finite number >= 0, got {q}")
    if not (math.isfinite(x) and x >= 0):
        raise ValueError(f"x must be a finite number >= 0, got {x}")
    log_term = math.log1p(k * x)
    exponent = (1.0 - q) * log_term
    if exponent == 0.0:
        # docs/methods.md C4 in the limit q -> 1: ln(1 + k·x) / k
        return log_term / k
    # docs/methods.md C4: C_length{k,q}(x) = ((1 + k·x)^(1−q) − 1) / (k·(1−q))
    return math.expm1(exponent) / (k * (1.0 - q))


# --- Real-time RL: user feedback on served sessions (docs/methods.md section 2, "Real-time RL") -----------------------

COUNTED_SIGNALS: tuple[str, ...] = ("tests_passed", "tests_failed")
"""Signals whose value is a fraction of tests (the share that passed, the share that failed): the signal counts that
much of its weight, all of it without a value."""


def feedback_signal_value(signal: str, value: float | None, weight: float) -> float:
    """One feedback signal's contribution, in reward units: `weight` times the signal's size.

    The size is 1 for the signals that carry no value (edit_kept, dissatisfied_followup, ...), the rating (+1 or
    -1) for thumbs, and for tests_passed / tests_failed the fraction its value gives (of the tests that passed / that
    failed; 1 without one). Weights carry the sign: with tests_failed weighted -1, a run where 30% of the tests
    failed contributes -0.3, the same as -(1 - fraction passed)."""
    if not math.isfinite(weight):
        raise ValueError(f"weight must be finite, got {weight}")
    if signal == "thumbs":
        if value not in (1.0, -1.0):
            raise ValueError(f"thumbs takes value +1 or -1, got {value!r}")
        return weight * value
    if signal in COUNTED_SIGNALS:
        if value is None:
            return weight
        _check_fraction(f"{signal} value", value)
        return weight * value
    return weight


def feedback_turn_position(turn_indices: Sequence[int], turn_index: int | None) -> int:
    """The position (0-based, in `turn_indices`' order) of the served turn a signal is about.

    `turn_indices` holds the client's index of each served turn, ascending. A signal about the whole session
    (`turn_index` None) is about the last turn; one naming a turn that was not recorded is about the nearest
    recorded turn before it (the first turn if there is none). Raises ValueError for an empty session."""
    if not turn_indices:
        raise ValueError("a session has at least one turn")
    if turn_index is None:
        return len(turn_indices) - 1
    position = 0
    for index, recorded in enumerate(turn_indices):
        if recorded <= turn_index:
            position = index
    return position


def session_turn_credits(
    num_turns: int,
    signals: Sequence[tuple[int, float]],
    *,
    decay: float = 1.0,
    combine: str = "sum",
    no_feedback: str = "drop",
    neutral_value: float = 0.0,
) -> list[float | None]:
    """The feedback credit of every turn of a session, in reward units; None for a turn left out of training.

    `signals` are (position of the turn the signal is about, its contribution from `feedback_signal_value`). A
    signal about turn t credits turn j <= t with its contribution times decay^(t - j): the turn it names fully,
    earlier turns (whose work led there) less; turns after t not at all. A session-level signal is about the last
    turn, so it credits the last turn most. A turn's credit combines every signal that reaches it:
    "sum" adds them, "mean" divides that sum by how many reach it. A turn no signal reaches has no feedback: it is
    dropped (None) with `no_feedback="drop"`, or credited `neutral_value` with "neutral".

    Example (decay 0.5, sum): 3 turns, edit_kept (+1) on turn 1 and a session-level dissatisfied follow-up (-1)
    give [0.5 - 0.25, 1 - 0.5, -1] = [0.25, 0.5, -1].
    """
    if num_turns < 1:
        raise ValueError(f"num_turns must be >= 1, got {num_turns}")
    if not (0.0 < decay <= 1.0):
        raise ValueError(f"decay must lie in (0, 1], got {decay}")
    if combine not in ("sum", "mean"):
        raise ValueError(f"combine must be 'sum' or 'mean', got {combine!r}")
    if no_feedback not in ("drop", "neutral"):
        raise ValueError(f"no_feedback must be 'drop' or 'neutral', got {no_feedback!r}")
    for position, _ in signals:
        if not 0 <= position < num_turns:
            raise ValueError(f"signal position {position} is outside the session's {num_turns} turns")
    credits: list[float | None] = []
    for turn in range(num_turns):
        # docs/methods.md section 2 ("distil user responses into rewards"): decay^(t - j) credit to earlier turns
        reaching = [value * decay ** (position - turn) for position, value in signals if position >= turn]
        if not reaching:
            credits.append(None if no_feedback == "drop" else neutral_value)
            continue
        total = math.fsum(reaching)
        credits.append(total / len(reaching) if combine == "mean" else total)
    return credits
