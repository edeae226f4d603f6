"""Rejection sampling for the SFT warm-up: Context-1's keep/drop rules, each counted."""

from __future__ import annotations

from typing import Any

from workers.search.rejection import FilterConfig, select_trajectories

GOLD = ["a#0", "b#0", "c#0", "d#0", "e#0"]


def _record(task: str, output: list[str], seen: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "id": f"{task}-{len(output)}-{len(seen)}-{extra.get('turns', 2)}",
        "task_id": task,
        "gold_doc_ids": GOLD,
        "output_doc_ids": output,
        "seen_doc_ids": seen,
        "error": extra.get("error"),
        "counts": {"turns": extra.get("turns", 2), "malformed_tool_calls": extra.get("malformed", 0)},
    }


def test_high_recall_keeps_one_rollout_per_query_the_best_one() -> None:
    records = [
        _record("q1", GOLD[:3], GOLD[:4], turns=5),  # output recall 0.6
        _record("q1", GOLD[:4], GOLD[:4], turns=9),  # 0.8: the best
        _record("q1", GOLD[:4], GOLD[:4], turns=3),  # 0.8 in fewer turns: chosen
        _record("q2", GOLD[:3], GOLD[:3]),
    ]
    result = select_trajectories(records)
    assert result.kept == [2, 3]
    assert result.dropped["duplicate_high"] == 2 and result.buckets["high"] == 2


def test_malformed_and_found_but_not_reported_are_dropped() -> None:
    records = [
        _record("q1", GOLD[:3], GOLD[:3], error="no final answer within max_turns=8"),
        _record("q2", GOLD[:3], GOLD[:3], malformed=1),
        _record("q3", [], GOLD[:3]),
        _record("q4", GOLD[:1], GOLD),  # saw everything, reported 1 of 5: gap 0.8
    ]
    result = select_trajectories(records)
    assert result.kept == []
    assert result.dropped["malformed"] == 3 and result.dropped["recall_gap"] == 1


def test_low_recall_is_kept_at_a_diminishing_rate_and_repeatably() -> None:
    records = [_record(f"q{i}", GOLD[:1], GOLD[:1]) for i in range(400)]  # output recall 0.2: chance (0.5)^2
    first = select_trajectories(records, FilterConfig(seed=3))
    again = select_trajectories(records, FilterConfig(seed=3))
    assert first.kept == again.kept
    assert 60 < len(first.kept) < 140  # about a quarter of 400
    assert first.dropped["low_recall_sampled_out"] == 400 - len(first.kept)


def test_zero_recall_is_capped_at_five_percent_and_one_per_query() -> None:
    good = [_record(f"g{i}", GOLD[:3], GOLD[:3]) for i in range(38)]
    zero = [_record(f"z{i}", ["x#0"], ["x#0"]) for i in range(10)] + [_record("z0", ["y#0"], ["y#0"])]
    result = select_trajectories(good + zero)
    assert result.buckets["zero"] == 2  # 2 / 40 = 5%
    assert result.dropped["zero_recall_cap"] == 9  # 8 over the cap + 1 second rollout of z0
    report = result.report(len(good + zero))
    assert report["kept"] == 40 and report["generated"] == 49
